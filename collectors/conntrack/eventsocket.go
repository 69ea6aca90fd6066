package conntrack

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// eventSocket is the subscription to the conntrack event groups. It is a plain blocking
// socket read by recvmmsg on the listener's own goroutine, not one on Go's network poller: at
// the event rates that matter, the poller's epoll_wait and wake-up hand-offs per short batch
// cost more than the receiving itself (profiled: 42% of the listener's CPU). A receive timeout
// lets a blocked read notice Close.
type eventSocket struct {
	fd      int
	closing atomic.Bool

	mu      sync.Mutex // guards fd's lifetime against reading, drops and Close
	reading bool
	closed  bool

	batch []unix.Mmsghdr
	slots []byte // len(batch) slots of batchSlotBytes each
	// pause is how long to wait after a short batch before reading again, so that the next
	// read takes many datagrams rather than one (see shortBatchPause).
	pause time.Duration
}

const (
	// Netlink hands out one event per datagram; up to this many are read per syscall.
	batchDatagrams = 64
	// A conntrack event is a few hundred bytes; a larger one is truncated (MSG_TRUNC) and
	// counted as undecodable rather than breaking the stream.
	batchSlotBytes = 8 << 10
	// How long a blocked read waits before looking whether the socket is being closed.
	closeCheckInterval = 250 * time.Millisecond
	// The longest the event listener waits after a read that took less than half a batch.
	// Read as they come, tens of thousands of events a second cost a wake-up and a system
	// call each, more than the events themselves, and each wait costs a timer's wake-up:
	// at 10k flows/s 2.9-3.8 µs per event with 5 ms, 4.1-7.2 with 1 ms, 5.2-5.7 without
	// (BENCHMARKS.md, "The CPU per event"). Waiting lets the events queue up to be taken by
	// one recvmmsg; a read of half a batch or more is followed by the next at once. Nothing
	// the events feed needs them sooner.
	maxShortBatchPause = 5 * time.Millisecond
	// What the wait may fill of the socket's buffer at most: a quarter, at eventQueueRate.
	// At 5 ms that is 5 MiB, a sixth of the default 32 MiB buffer.
	eventQueueRate = 1 << 30 // bytes/s: 250k events/s (one core's most here) of up to 4 KiB queued each
)

// shortBatchPause is how long the event listener waits after a short read with a receive
// buffer of bufBytes: maxShortBatchPause, less if a quarter of the buffer would fill sooner at
// eventQueueRate.
func shortBatchPause(bufBytes int) time.Duration {
	fill := time.Duration(float64(bufBytes) / 4 / eventQueueRate * float64(time.Second))
	return min(maxShortBatchPause, fill)
}

var errSocketClosed = errors.New("conntrack event socket closed")

// openEventSocket subscribes to the conntrack event groups with a receive buffer of bufBytes.
func openEventSocket(bufBytes int) (*eventSocket, error) {
	s, err := openBatchSocket(eventGroups, bufBytes, nil)
	if err != nil {
		return nil, err
	}
	s.pause = shortBatchPause(bufBytes)
	return s, nil
}

// openBatchSocket opens a netfilter netlink socket bound to the multicast groups (a bitmask),
// with a receive buffer of bufBytes, runs configure on its descriptor (nil for none), and
// readies it for batched reads. NETLINK_NO_ENOBUFS keeps the socket usable when the kernel
// drops messages for it: the drop count is read from the socket itself (drops) instead of
// being inferred from an error.
func openBatchSocket(groups uint32, bufBytes int, configure func(fd int) error) (*eventSocket, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, describeNetlinkError("open conntrack netlink socket", err)
	}
	fail := func(what string, err error) (*eventSocket, error) {
		unix.Close(fd)
		return nil, describeNetlinkError(what, err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: groups}); err != nil {
		return fail("subscribe to conntrack events", err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_NO_ENOBUFS, 1); err != nil {
		return fail("set NETLINK_NO_ENOBUFS", err)
	}
	// Past net.core.rmem_max needs CAP_NET_ADMIN, which the subscription needed anyway;
	// otherwise take what rmem_max allows.
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, bufBytes); err != nil {
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, bufBytes); err != nil {
			return fail(fmt.Sprintf("set receive buffer to %d bytes", bufBytes), err)
		}
	}
	tv := unix.NsecToTimeval(closeCheckInterval.Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return fail("set receive timeout", err)
	}
	if configure != nil {
		if err := configure(fd); err != nil {
			unix.Close(fd)
			return nil, err
		}
	}
	s := &eventSocket{
		fd:    fd,
		batch: make([]unix.Mmsghdr, batchDatagrams),
		slots: make([]byte, batchDatagrams*batchSlotBytes),
	}
	iovs := make([]unix.Iovec, batchDatagrams)
	for i := range s.batch {
		iovs[i].Base = &s.slots[i*batchSlotBytes]
		iovs[i].SetLen(batchSlotBytes)
		s.batch[i].Hdr.Iov = &iovs[i]
		s.batch[i].Hdr.SetIovlen(1)
	}
	return s, nil
}

// receiveBatches reads datagrams in batches (recvmmsg with MSG_WAITFORONE: block for the
// first, take what else is queued) and calls fn with each netlink message, until fn fails, the
// socket fails, or Close is called. After a batch of less than half of len(s.batch) it waits
// s.pause. A truncated datagram is passed to fn as it is, for fn to
// reject. fn's slice is only valid during the call.
func (s *eventSocket) receiveBatches(fn func(msg []byte) error) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return errSocketClosed
	}
	s.reading = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.reading = false
		if s.closing.Load() && !s.closed {
			s.closed = true
			unix.Close(s.fd)
		}
		s.mu.Unlock()
	}()

	for {
		if s.closing.Load() {
			return errSocketClosed
		}
		r, _, errno := unix.Syscall6(unix.SYS_RECVMMSG, uintptr(s.fd), uintptr(unsafe.Pointer(&s.batch[0])),
			uintptr(len(s.batch)), unix.MSG_WAITFORONE, 0, 0)
		switch errno {
		case 0:
		case unix.EAGAIN, unix.EINTR: // the receive timeout, or a signal: look at closing again
			continue
		default:
			return fmt.Errorf("receive conntrack events: %w", errno)
		}
		for i := range int(r) {
			m := &s.batch[i]
			b := s.slots[i*batchSlotBytes : i*batchSlotBytes+int(min(m.Len, batchSlotBytes))]
			if m.Hdr.Flags&unix.MSG_TRUNC != 0 {
				if err := fn(b); err != nil {
					return err
				}
				continue
			}
			for len(b) > 0 {
				span, err := messageSpan(b)
				if err != nil {
					return err
				}
				if err := fn(b[:span]); err != nil {
					return err
				}
				b = b[span:]
			}
		}
		if s.pause > 0 && int(r) < len(s.batch)/2 {
			time.Sleep(s.pause)
		}
	}
}

// drops returns the kernel's count of messages it could not queue on this socket (sk_drops,
// the Drops column of /proc/net/netlink).
func (s *eventSocket) drops() (uint32, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, errSocketClosed
	}
	var mem [unix.SK_MEMINFO_VARS]uint32
	l := uint32(unsafe.Sizeof(mem))
	_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(s.fd), unix.SOL_SOCKET, unix.SO_MEMINFO,
		uintptr(unsafe.Pointer(&mem[0])), uintptr(unsafe.Pointer(&l)), 0)
	if errno != 0 {
		return 0, fmt.Errorf("read conntrack socket drop count (SO_MEMINFO): %w", errno)
	}
	return mem[unix.SK_MEMINFO_DROPS], nil
}

// Close stops a reader within closeCheckInterval. The descriptor is closed by whoever is last
// to use it, so a reader never reads a descriptor number that was closed and reused.
func (s *eventSocket) Close() error {
	s.closing.Store(true)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reading || s.closed {
		return nil
	}
	s.closed = true
	return unix.Close(s.fd)
}
