package nftnl

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/mdlayher/socket"
	"golang.org/x/sys/unix"
)

// ErrPermission is returned (wrapped) when the kernel refuses nf_tables requests: nfnetlink
// answers every request, reads included, with EPERM unless the socket was opened with
// CAP_NET_ADMIN in the network namespace's user namespace.
var ErrPermission = errors.New("nf_tables netlink needs CAP_NET_ADMIN")

// ErrNotSupported is returned (wrapped) when the kernel has no nf_tables: nfnetlink answers
// every nf_tables request with EINVAL when no nf_tables subsystem is registered and its module
// could not be loaded, and socket(2) refuses NETLINK_NETFILTER with EPROTONOSUPPORT when
// nfnetlink itself is missing.
var ErrNotSupported = errors.New("the kernel has no nf_tables")

// DefaultMaxDumpBytes bounds what one nf_tables reply may carry. kube-proxy's iptables-mode nat
// table written through iptables-nft, at 10,000 Services of 10 endpoints with its comments,
// dumps to about 190 MiB of rule messages (19,837 bytes a Service, TestKernelDumpLimit); a
// reply five times that is no kube-proxy's but a runaway or hostile ruleset. Dumps are decoded
// as they arrive, so memory follows what is kept, not the reply: the bound caps the time one
// read may spend.
const DefaultMaxDumpBytes = 1 << 30

// ErrDumpTooLarge is returned (wrapped) when a reply passed the reader's Limits.MaxDumpBytes:
// the read stops there, and what was read so far is discarded.
var ErrDumpTooLarge = errors.New("nf_tables reply larger than the read limit")

// Limits bounds what a reader of this package accepts. Each reader is given its own (the
// Follower, the ForwardReader, the Read functions); the zero value is the defaults.
type Limits struct {
	// MaxDumpBytes is the most bytes one nf_tables reply may carry; 0 (or less) means
	// DefaultMaxDumpBytes.
	MaxDumpBytes int64
}

// maxDumpBytes is l.MaxDumpBytes, or the default in its absence.
func (l Limits) maxDumpBytes() int64 {
	if l.MaxDumpBytes <= 0 {
		return DefaultMaxDumpBytes
	}
	return l.MaxDumpBytes
}

// message is one nf_tables netlink message of a reply: its nf_tables message type
// (NFT_MSG_NEWRULE, ...), the nfgenmsg family, and its attributes.
type message struct {
	typ    uint16
	family uint8
	attrs  []byte
}

// request is one nf_tables GET request. A dump (NLM_F_DUMP) ends with NLMSG_DONE; a plain get
// is sent with NLM_F_ACK and ends with its acknowledgement.
type request struct {
	typ    uint16 // NFT_MSG_GET*
	family uint8
	dump   bool
	attrs  []byte
}

// querier runs requests and hands every message of the reply to fn as it arrives; fn must not
// keep m.attrs, which the next read overwrites. The socket implements it; tests replay
// recorded replies.
type querier interface {
	query(ctx context.Context, req request, fn func(m message) error) error
}

const (
	nlmsgHdrLen  = unix.SizeofNlMsghdr
	nfgenHdrLen  = 4
	recvBufBytes = 64 << 10 // the kernel fills a dump buffer up to 32 KiB per read
)

// nlSocket is a NETLINK_NETFILTER socket; reads and writes honour the context.
type nlSocket struct {
	c   *socket.Conn
	seq uint32
	buf []byte
	// limit is the most bytes one reply may carry.
	limit int64
	// abandoned is set when a reply was given up midway: the kernel refuses a new dump on a
	// socket whose dump has not ended (EBUSY), so the next request opens a new socket.
	abandoned bool
	received  int64 // bytes of the last reply so far
}

// dial opens a netfilter netlink socket in the calling process's network namespace, whose
// replies are bounded by lim.
func dial(lim Limits) (*nlSocket, error) {
	c, err := socket.Socket(unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_NETFILTER, "nftnl", nil)
	if err != nil {
		return nil, socketError(err)
	}
	if err := c.Bind(&unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("bind netfilter netlink socket: %w", err)
	}
	return &nlSocket{c: c, buf: make([]byte, recvBufBytes), limit: lim.maxDumpBytes()}, nil
}

// socketError is a failure to open a netfilter netlink socket.
func socketError(err error) error {
	if errors.Is(err, unix.EPROTONOSUPPORT) {
		// No nfnetlink, so no nf_tables either.
		return fmt.Errorf("open netfilter netlink socket: %w: %w", ErrNotSupported, err)
	}
	return fmt.Errorf("open netfilter netlink socket: %w", err)
}

func (s *nlSocket) Close() error { return s.c.Close() }

// encodeRequest frames req as a netlink message with sequence number seq.
func encodeRequest(req request, seq uint32) []byte {
	b := make([]byte, nlmsgHdrLen+nfgenHdrLen, nlmsgHdrLen+nfgenHdrLen+len(req.attrs))
	flags := uint16(unix.NLM_F_REQUEST)
	if req.dump {
		flags |= unix.NLM_F_DUMP
	} else {
		flags |= unix.NLM_F_ACK
	}
	b = append(b, req.attrs...)
	binary.NativeEndian.PutUint32(b[0:4], uint32(len(b)))
	binary.NativeEndian.PutUint16(b[4:6], unix.NFNL_SUBSYS_NFTABLES<<8|req.typ)
	binary.NativeEndian.PutUint16(b[6:8], flags)
	binary.NativeEndian.PutUint32(b[8:12], seq)
	b[16] = req.family
	b[17] = unix.NFNETLINK_V0
	return b
}

func (s *nlSocket) query(ctx context.Context, req request, fn func(m message) error) error {
	if s.abandoned {
		if err := s.reopen(); err != nil {
			return err
		}
	}
	s.seq++
	if err := s.c.Sendto(ctx, encodeRequest(req, s.seq), 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("send nf_tables request: %w", err)
	}
	// Every reply ends with NLMSG_DONE, an error or an ack; its size is bounded by limit.
	var total int64
	for {
		n, err := recv(ctx, s.c, s.buf, unix.MSG_TRUNC)
		if err != nil {
			s.abandoned = true
			return fmt.Errorf("receive nf_tables reply: %w", err)
		}
		if n > len(s.buf) {
			s.abandoned = true
			return fmt.Errorf("receive nf_tables reply: %d byte datagram truncated to %d", n, len(s.buf))
		}
		total += int64(n)
		s.received = total
		if total > s.limit {
			s.abandoned = true
			return fmt.Errorf("%w: more than %d bytes, the limit, in one reply; the read was abandoned", ErrDumpTooLarge, s.limit)
		}
		done, err := splitMessages(s.buf[:n], s.seq, fn)
		var errno unix.Errno
		if err != nil && !errors.As(err, &errno) {
			// Not the kernel's answer, which ends the reply: the rest is still to come.
			s.abandoned = true
		}
		if err != nil || done {
			return err
		}
	}
}

// reopen replaces the socket with a new one in the same network namespace (the calling
// thread's, as dial's); the limit stays.
func (s *nlSocket) reopen() error {
	fresh, err := dial(Limits{})
	if err != nil {
		return err
	}
	_ = s.c.Close()
	s.c, s.abandoned = fresh.c, false
	return nil
}

// splitMessages hands the nf_tables messages of one datagram that answer sequence number seq
// to fn. done reports the end of the reply (NLMSG_DONE, or an acknowledgement); a netlink error
// comes back as an error, EPERM as ErrPermission.
func splitMessages(b []byte, seq uint32, fn func(m message) error) (done bool, err error) {
	for len(b) >= nlmsgHdrLen {
		l := int(binary.NativeEndian.Uint32(b[0:4]))
		if l < nlmsgHdrLen || l > len(b) {
			return false, fmt.Errorf("netlink message length %d out of range (%d left)", l, len(b))
		}
		typ := binary.NativeEndian.Uint16(b[4:6])
		flags := binary.NativeEndian.Uint16(b[6:8])
		mseq := binary.NativeEndian.Uint32(b[8:12])
		payload := b[nlmsgHdrLen:l]
		b = b[min(nlmAlign(l), len(b)):]
		if mseq != seq {
			continue // a late reply to an earlier request of this socket
		}
		switch typ {
		case unix.NLMSG_DONE:
			return true, nil
		case unix.NLMSG_ERROR:
			if len(payload) < 4 {
				return false, errors.New("short netlink error message")
			}
			errno := -int32(binary.NativeEndian.Uint32(payload[0:4]))
			if errno == 0 {
				return true, nil
			}
			return false, errnoError(unix.Errno(errno))
		case unix.NLMSG_NOOP, unix.NLMSG_OVERRUN:
			continue
		}
		if flags&unix.NLM_F_DUMP_INTR != 0 {
			return false, errInterrupted
		}
		if typ>>8 != unix.NFNL_SUBSYS_NFTABLES || len(payload) < nfgenHdrLen {
			continue
		}
		if err := fn(message{typ: typ & 0xff, family: payload[0], attrs: payload[nfgenHdrLen:]}); err != nil {
			return false, err
		}
	}
	return false, nil
}

func nlmAlign(n int) int { return (n + unix.NLMSG_ALIGNTO - 1) &^ (unix.NLMSG_ALIGNTO - 1) }

// errnoError maps the kernel's answer to an error that says what it means here.
func errnoError(errno unix.Errno) error {
	switch errno {
	case unix.EPERM, unix.EACCES:
		return fmt.Errorf("%w: %w", ErrPermission, errno)
	}
	// ENOENT (a table or chain that does not exist) matches os.ErrNotExist through Errno.Is.
	return fmt.Errorf("nf_tables: %w", errno)
}

// withSocket runs fn with a new socket bounded by lim and closes it.
func withSocket(lim Limits, fn func(q querier) error) error {
	s, err := dial(lim)
	if err != nil {
		return err
	}
	defer s.Close()
	return fn(s)
}
