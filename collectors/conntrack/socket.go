package conntrack

import (
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"

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

// netlinkSocket is a netfilter netlink socket for queries (table dumps), read with our own
// buffer: mdlayher/netlink opens and binds it, while reads bypass its per-message allocations.
type netlinkSocket struct {
	conn *netlink.Conn
	raw  syscall.RawConn
	buf  []byte
}

func dialNetfilter() (*netlinkSocket, error) {
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
	if err != nil {
		return nil, describeNetlinkError("open conntrack netlink socket", err)
	}
	raw, err := conn.SyscallConn()
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("conntrack netlink socket: %w", err)
	}
	// A dump reply packs as many entries as fit into one datagram of up to this size.
	return &netlinkSocket{conn: conn, raw: raw, buf: make([]byte, 64<<10)}, nil
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
	s, err := dialNetfilter()
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
