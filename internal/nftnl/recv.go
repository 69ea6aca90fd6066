package nftnl

import (
	"context"
	"errors"
	"os"
	"unsafe"

	"github.com/mdlayher/socket"
	"golang.org/x/sys/unix"
)

// recv receives one datagram into b, returning its whole length (which is more than len(b)
// when flags has MSG_TRUNC and it was truncated).
//
// socket.Conn's context-aware receive starts a goroutine per call to watch the context, and
// asks for the sender's address, which is allocated: under kube-proxy's churn the watch
// receives hundreds of datagrams a second. A context that cannot be cancelled needs neither,
// so the call goes to the runtime poller directly; a long-lived receiver cancels with a read
// deadline instead (Watcher.run).
func recv(ctx context.Context, c *socket.Conn, b []byte, flags int) (int, error) {
	if ctx.Done() != nil {
		n, _, err := c.Recvfrom(ctx, b, flags)
		return n, err
	}
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var n int
	var errno error
	if err := rc.Read(func(fd uintptr) bool {
		n, errno = recvNoAddr(int(fd), b, flags)
		return !errors.Is(errno, unix.EAGAIN)
	}); err != nil {
		return 0, err
	}
	if errno != nil {
		return 0, os.NewSyscallError("recvfrom", errno)
	}
	return n, nil
}

// recvNoAddr is recvfrom(2) without the sender's address, retried when interrupted.
func recvNoAddr(fd int, b []byte, flags int) (int, error) {
	var p unsafe.Pointer
	if len(b) > 0 {
		p = unsafe.Pointer(&b[0])
	}
	for {
		n, _, e := unix.Syscall6(unix.SYS_RECVFROM, uintptr(fd), uintptr(p), uintptr(len(b)), uintptr(flags), 0, 0)
		switch e {
		case 0:
			return int(n), nil
		case unix.EINTR:
			continue
		}
		return 0, e
	}
}
