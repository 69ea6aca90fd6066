package nftnl

import (
	"context"
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
	var p unsafe.Pointer
	if len(b) > 0 {
		p = unsafe.Pointer(&b[0])
	}
	return pollRead(c, "recvfrom", func(fd uintptr) (uintptr, unix.Errno) {
		n, _, e := unix.Syscall6(unix.SYS_RECVFROM, fd, uintptr(p), uintptr(len(b)), uintptr(flags), 0, 0)
		return n, e
	})
}

// pollRead makes a non-blocking receive call through the runtime's poller, which waits while
// it would block; the call is made again when interrupted.
func pollRead(c *socket.Conn, name string, call func(fd uintptr) (uintptr, unix.Errno)) (int, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var n uintptr
	var errno unix.Errno
	if err := rc.Read(func(fd uintptr) bool {
		for {
			if n, errno = call(fd); errno != unix.EINTR {
				return errno != unix.EAGAIN
			}
		}
	}); err != nil {
		return 0, err
	}
	if errno != 0 {
		return 0, os.NewSyscallError(name, errno)
	}
	return int(n), nil
}

// recvBatch receives several datagrams per system call (recvmmsg(2)): at each of kube-proxy's
// syncs the kernel sends a watch hundreds of datagrams of notifications in a burst, and one
// receive each cost more than decoding them.
type recvBatch struct {
	bufs [][]byte
	iovs []unix.Iovec
	hdrs []unix.Mmsghdr
}

// newRecvBatch makes a batch of n buffers of size bytes each.
func newRecvBatch(n, size int) *recvBatch {
	b := &recvBatch{bufs: make([][]byte, n), iovs: make([]unix.Iovec, n), hdrs: make([]unix.Mmsghdr, n)}
	for i := range n {
		b.bufs[i] = make([]byte, size)
		b.iovs[i].Base = &b.bufs[i][0]
		b.iovs[i].SetLen(size)
		b.hdrs[i].Hdr.Iov = &b.iovs[i]
		b.hdrs[i].Hdr.SetIovlen(1)
	}
	return b
}

// recv waits for datagrams and receives as many as are queued, up to the batch's size; it
// returns how many. An error the kernel reports after some datagrams (an overrun) comes with
// the next call.
func (b *recvBatch) recv(c *socket.Conn) (int, error) {
	for i := range b.hdrs {
		b.hdrs[i].Len, b.hdrs[i].Hdr.Flags = 0, 0
	}
	return pollRead(c, "recvmmsg", func(fd uintptr) (uintptr, unix.Errno) {
		n, _, e := unix.Syscall6(unix.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&b.hdrs[0])), uintptr(len(b.hdrs)), unix.MSG_DONTWAIT, 0, 0)
		return n, e
	})
}

// datagram returns datagram i of the last recv, and whether it was cut short: longer than
// its buffer, its end is lost.
func (b *recvBatch) datagram(i int) ([]byte, bool) {
	return b.bufs[i][:b.hdrs[i].Len], b.hdrs[i].Hdr.Flags&unix.MSG_TRUNC != 0
}
