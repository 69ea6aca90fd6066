package conntrack

import (
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"
	"unsafe"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Multicast groups of the conntrack event stream (enum nfnetlink_groups): bind takes them as a
// bitmask with group n at bit n-1. Expectation events are not joined: nothing here uses them.
const (
	nfnlgrpConntrackNew     = 1
	nfnlgrpConntrackUpdate  = 2
	nfnlgrpConntrackDestroy = 3

	eventGroups = 1<<(nfnlgrpConntrackNew-1) | 1<<(nfnlgrpConntrackUpdate-1) | 1<<(nfnlgrpConntrackDestroy-1)

	ipctnlMsgCTGet = 1
)

// netlinkSocket is a netfilter netlink socket read with our own buffer: mdlayher/netlink opens
// and binds it (and puts it on Go's poller), while reads bypass its per-message allocations.
type netlinkSocket struct {
	conn *netlink.Conn
	raw  syscall.RawConn
	buf  []byte // one datagram at a time (dumps)

	// Event sockets read up to len(batch) datagrams per recvmmsg call: netlink hands out one
	// event per datagram, and a syscall per event was most of the listener's CPU.
	batch []unix.Mmsghdr
	slots []byte // len(batch) slots of batchSlotBytes each
}

const (
	batchDatagrams = 64
	// A conntrack event is a few hundred bytes; a larger one is truncated (MSG_TRUNC) and
	// counted as undecodable rather than breaking the stream.
	batchSlotBytes = 8 << 10
)

func dialNetfilter(groups uint32) (*netlinkSocket, error) {
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{Groups: groups})
	if err != nil {
		return nil, describeNetlinkError("open conntrack netlink socket", err)
	}
	raw, err := conn.SyscallConn()
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("conntrack netlink socket: %w", err)
	}
	// 64 KiB holds any single event; dumps pack several entries per read up to this size.
	return &netlinkSocket{conn: conn, raw: raw, buf: make([]byte, 64<<10)}, nil
}

// openEventSocket subscribes to the conntrack event groups with a receive buffer of bufBytes.
// NoENOBUFS keeps the socket usable when the kernel drops events for it: the drop count is read
// from the socket itself (sockDrops) instead of being inferred from an error.
func openEventSocket(bufBytes int) (*netlinkSocket, error) {
	s, err := dialNetfilter(eventGroups)
	if err != nil {
		return nil, err
	}
	if err := s.conn.SetOption(netlink.NoENOBUFS, true); err != nil {
		s.Close()
		return nil, fmt.Errorf("set NETLINK_NO_ENOBUFS: %w", err)
	}
	if err := s.setReadBuffer(bufBytes); err != nil {
		s.Close()
		return nil, err
	}
	s.batch = make([]unix.Mmsghdr, batchDatagrams)
	s.slots = make([]byte, batchDatagrams*batchSlotBytes)
	iovs := make([]unix.Iovec, batchDatagrams)
	for i := range s.batch {
		iovs[i].Base = &s.slots[i*batchSlotBytes]
		iovs[i].SetLen(batchSlotBytes)
		s.batch[i].Hdr.Iov = &iovs[i]
		s.batch[i].Hdr.SetIovlen(1)
	}
	return s, nil
}

// receiveBatches reads datagrams in batches with recvmmsg and calls fn with each message,
// until fn or the socket fails. It waits on Go's poller only when a batch came back short,
// which is when the queue was empty, so a busy socket costs one syscall per batch and an
// idle one no spinning. A truncated datagram is passed to fn as it is, for fn to reject.
func (s *netlinkSocket) receiveBatches(fn func(msg []byte) error) error {
	var ferr, rerr error
	err := s.raw.Read(func(fd uintptr) bool {
		for {
			r, _, errno := unix.Syscall6(unix.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&s.batch[0])),
				uintptr(len(s.batch)), unix.MSG_DONTWAIT, 0, 0)
			switch errno {
			case 0:
			case unix.EAGAIN:
				return false
			case unix.EINTR:
				continue
			default:
				rerr = errno
				return true
			}
			n := int(r)
			for i := 0; i < n; i++ {
				m := &s.batch[i]
				b := s.slots[i*batchSlotBytes : i*batchSlotBytes+int(min(m.Len, batchSlotBytes))]
				if m.Hdr.Flags&unix.MSG_TRUNC != 0 {
					if ferr = fn(b); ferr != nil {
						return true
					}
					continue
				}
				for len(b) > 0 {
					span, err := messageSpan(b)
					if err != nil {
						ferr = err
						return true
					}
					if ferr = fn(b[:span]); ferr != nil {
						return true
					}
					b = b[span:]
				}
			}
			if n < len(s.batch) {
				// The queue was empty when the call returned: wait for the next arrival. (The
				// poller is edge-triggered; data that came in during the call has raised a new
				// edge, so nothing is left waiting.)
				return false
			}
		}
	})
	switch {
	case err != nil:
		return err
	case rerr != nil:
		return fmt.Errorf("receive conntrack events: %w", rerr)
	}
	return ferr
}

// setReadBuffer forces the buffer past net.core.rmem_max (allowed with CAP_NET_ADMIN, which the
// subscription needs anyway), else takes what rmem_max allows.
func (s *netlinkSocket) setReadBuffer(n int) error {
	var serr error
	err := s.raw.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, n)
	})
	if err == nil && serr == nil {
		return nil
	}
	if err := s.conn.SetReadBuffer(n); err != nil {
		return fmt.Errorf("set conntrack socket receive buffer to %d bytes: %w", n, err)
	}
	return nil
}

// drops returns the kernel's count of messages it could not queue on this socket (sk_drops,
// the Drops column of /proc/net/netlink).
func (s *netlinkSocket) drops() (uint32, error) {
	var mem [unix.SK_MEMINFO_VARS]uint32
	var serr error
	err := s.raw.Control(func(fd uintptr) {
		l := uint32(unsafe.Sizeof(mem))
		_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, unix.SOL_SOCKET, unix.SO_MEMINFO,
			uintptr(unsafe.Pointer(&mem[0])), uintptr(unsafe.Pointer(&l)), 0)
		if errno != 0 {
			serr = errno
		}
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		return 0, fmt.Errorf("read conntrack socket drop count (SO_MEMINFO): %w", err)
	}
	return mem[unix.SK_MEMINFO_DROPS], nil
}

// receive blocks until at least one datagram is readable, then reads datagrams until the socket
// is empty, calling fn with each netlink message. A datagram may hold several messages (a dump
// reply does). fn's slice is only valid during the call.
func (s *netlinkSocket) receive(fn func(msg []byte) error) error {
	var ferr, rerr error
	err := s.raw.Read(func(fd uintptr) bool {
		got := false
		for {
			n, _, err := unix.Recvfrom(int(fd), s.buf, unix.MSG_DONTWAIT)
			if err == unix.EAGAIN || err == unix.EWOULDBLOCK {
				return got // nothing read yet: wait on the poller
			}
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				rerr = err
				return true
			}
			got = true
			b := s.buf[:n]
			for len(b) > 0 {
				span, err := messageSpan(b)
				if err != nil {
					ferr = err
					return true
				}
				if err := fn(b[:span]); err != nil {
					ferr = err
					return true
				}
				b = b[span:]
			}
		}
	})
	switch {
	case err != nil:
		return err
	case rerr != nil:
		return fmt.Errorf("receive conntrack events: %w", rerr)
	}
	return ferr
}

func (s *netlinkSocket) Close() error { return s.conn.Close() }

// errDumpDone ends a dump's receive loop.
var errDumpDone = errors.New("dump done")

// dumpTable streams every conntrack entry (both address families) through fn, decoded with the
// event decoder, so a table of any size is read with one buffer.
func dumpTable(fn func(*flowEvent)) error {
	s, err := dialNetfilter(0)
	if err != nil {
		return err
	}
	defer s.Close()
	req := netlink.Message{
		Header: netlink.Header{
			Type:  netlink.HeaderType(nfnlSubsysCTNetlink<<8 | ipctnlMsgCTGet),
			Flags: netlink.Request | netlink.Dump,
		},
		Data: []byte{unix.AF_UNSPEC, 0 /* NFNETLINK_V0 */, 0, 0},
	}
	if _, err := s.conn.Send(req); err != nil {
		return describeNetlinkError("request conntrack table dump", err)
	}
	var ev flowEvent
	for {
		err := s.receive(func(msg []byte) error {
			switch nlmsgType(msg) {
			case nlmsgDone:
				return errDumpDone
			case nlmsgError:
				if len(msg) >= nlmsgHeaderLen+4 {
					if code := int32(binary.NativeEndian.Uint32(msg[nlmsgHeaderLen:])); code != 0 {
						return describeNetlinkError("conntrack table dump", unix.Errno(-code))
					}
				}
				return nil
			}
			if err := decodeFlowMessage(msg, &ev); err != nil {
				if errors.Is(err, errNotConntrack) {
					return nil
				}
				return fmt.Errorf("decode conntrack dump entry: %w", err)
			}
			fn(&ev)
			return nil
		})
		if errors.Is(err, errDumpDone) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// describeNetlinkError adds the likely cause to the errors a missing privilege or kernel
// feature produce, so the one log line a failing collector writes says what to fix.
func describeNetlinkError(what string, err error) error {
	switch {
	case errors.Is(err, unix.EPERM), errors.Is(err, unix.EACCES):
		return fmt.Errorf("%s: %w (the process needs CAP_NET_ADMIN)", what, err)
	case errors.Is(err, unix.EPROTONOSUPPORT), errors.Is(err, unix.ENOENT), errors.Is(err, unix.EOPNOTSUPP):
		return fmt.Errorf("%s: %w (is nf_conntrack_netlink loaded?)", what, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}
