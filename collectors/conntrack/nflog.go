package conntrack

import (
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/proxyhealth/proxyhealth/internal/capability"
)

// conntrack's INVALID log arrives on NFLOG group 0 (nfnetlink_log), read here with the same
// batched socket as the event stream. Constants are from include/uapi/linux/netfilter/
// nfnetlink_log.h. The library that wraps this protocol (florianl/go-nflog) is not served by
// the module proxy here; the protocol is small: one configuration message, then packet
// messages.
const (
	nfnlSubsysULOG  = 4
	nfulnlMsgPacket = 0
	nfulnlMsgConfig = 1

	nfulaCfgCmd      = 1
	nfulaCfgMode     = 2
	nfulaCfgNlbufsiz = 3
	nfulaCfgFlags    = 6

	nfulnlCfgCmdBind  = 1
	nfulnlCopyPacket  = 2
	nfulnlCfgFlagSeq  = 0x1 // each packet carries the instance's sequence number
	nfulaPrefix       = 10
	nfulaPayload      = 9
	nfulaSeq          = 12
	nlmFRequest       = 0x1
	nlmFAck           = 0x4
	nfnetlinkV0       = 0
	invalidLogGroup   = 0 // where nf_log's nfnetlink_log backend sends conntrack's log
	invalidCopyRange  = 128
	invalidLogBufSize = batchSlotBytes // never more than a read slot per datagram
)

// errGroupTaken is the bind's EPERM: another socket of this network namespace reads the group.
var errGroupTaken = errors.New("NFLOG group 0 is read by another process in this network namespace (only one reader is allowed)")

// openInvalidLog binds NFLOG group 0 with a receive buffer of bufBytes. nf_log's default
// logging info asks nfnetlink_log for a queue threshold of 1, so each logged packet is a
// datagram of its own (whatever the instance's threshold or flush timeout); the reader takes
// up to a batch of them per system call. Only the first invalidCopyRange bytes of each packet
// are copied, enough for the IP and transport headers.
func openInvalidLog(bufBytes int) (*eventSocket, error) {
	return openBatchSocket(0, bufBytes, configureInvalidLog)
}

func configureInvalidLog(fd int) error {
	msg := nflogConfigMessage(invalidLogGroup)
	if err := unix.Sendto(fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return describeNetlinkError("configure NFLOG group 0", err)
	}
	err := awaitAck(fd, binary.NativeEndian.Uint32(msg[8:12]))
	switch {
	case errors.Is(err, unix.EPERM) && !hasNetAdmin():
		return describeNetlinkError("bind NFLOG group 0", err)
	case errors.Is(err, unix.EPERM):
		return fmt.Errorf("bind NFLOG group 0: %w: %w", errGroupTaken, err)
	case err != nil:
		return describeNetlinkError("bind NFLOG group 0", err)
	}
	return nil
}

// hasNetAdmin reports whether the process holds CAP_NET_ADMIN: the bind's EPERM means a
// taken group with it, a missing privilege without it.
func hasNetAdmin() bool {
	st, err := capability.Current()
	return err == nil && st.Effective&capability.NetAdmin != 0
}

// nflogConfigMessage binds group to this socket, copying packets, with sequence numbers (so
// that losses can be counted), in one message.
func nflogConfigMessage(group uint16) []byte {
	const seq = 1
	b := make([]byte, nlmsgHeaderLen+nfgenHeaderLen, 64)
	binary.NativeEndian.PutUint16(b[4:6], nfnlSubsysULOG<<8|nfulnlMsgConfig)
	binary.NativeEndian.PutUint16(b[6:8], nlmFRequest|nlmFAck)
	binary.NativeEndian.PutUint32(b[8:12], seq)
	b[16], b[17] = unix.AF_UNSPEC, nfnetlinkV0
	binary.BigEndian.PutUint16(b[18:20], group)
	b = appendAttr(b, nfulaCfgCmd, []byte{nfulnlCfgCmdBind})
	mode := make([]byte, 6)
	binary.BigEndian.PutUint32(mode, invalidCopyRange)
	mode[4] = nfulnlCopyPacket
	b = appendAttr(b, nfulaCfgMode, mode)
	b = appendAttr(b, nfulaCfgNlbufsiz, binary.BigEndian.AppendUint32(nil, invalidLogBufSize))
	b = appendAttr(b, nfulaCfgFlags, binary.BigEndian.AppendUint16(nil, nfulnlCfgFlagSeq))
	binary.NativeEndian.PutUint32(b[0:4], uint32(len(b)))
	return b
}

func appendAttr(b []byte, typ uint16, v []byte) []byte {
	b = binary.NativeEndian.AppendUint16(b, uint16(nlaHeaderLen+len(v)))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = append(b, v...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

// awaitAck reads until the kernel's answer to the request numbered seq, skipping anything else
// (packets already logged to the group).
func awaitAck(fd int, seq uint32) error {
	buf := make([]byte, 16<<10)
	for tries := 0; tries < 64; tries++ {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN) {
			continue
		}
		if err != nil {
			return err
		}
		for b := buf[:n]; len(b) > 0; {
			span, err := messageSpan(b)
			if err != nil {
				return err
			}
			m := b[:span]
			b = b[span:]
			if nlmsgType(m) != nlmsgError || binary.NativeEndian.Uint32(m[8:12]) != seq || len(m) < nlmsgHeaderLen+4 {
				continue
			}
			if code := int32(binary.NativeEndian.Uint32(m[nlmsgHeaderLen:])); code != 0 {
				return syscall.Errno(-code)
			}
			return nil
		}
	}
	return errors.New("no answer from the kernel")
}

// loggedPacket is one packet of conntrack's INVALID log. Its slices point into the receive
// buffer and are valid only while the message is handled.
type loggedPacket struct {
	family  uint8 // AF_INET or AF_INET6
	prefix  []byte
	payload []byte // the packet from its IP header, cut at invalidCopyRange
	seq     uint32
	hasSeq  bool
}

var errNotLogPacket = errors.New("not an NFLOG packet message")

// decodeLogMessage decodes one netlink message (header included) of the NFLOG socket.
func decodeLogMessage(msg []byte, p *loggedPacket) error {
	*p = loggedPacket{}
	if len(msg) < nlmsgHeaderLen+nfgenHeaderLen {
		return errShortMessage
	}
	n := int(binary.NativeEndian.Uint32(msg[0:4]))
	if n < nlmsgHeaderLen+nfgenHeaderLen || n > len(msg) {
		return errShortMessage
	}
	msg = msg[:n]
	if nlmsgType(msg) != nfnlSubsysULOG<<8|nfulnlMsgPacket {
		return errNotLogPacket
	}
	p.family = msg[nlmsgHeaderLen]
	return walkAttrs(msg[nlmsgHeaderLen+nfgenHeaderLen:], func(at uint16, v []byte) error {
		switch at {
		case nfulaPrefix:
			// NUL-terminated.
			for i, c := range v {
				if c == 0 {
					v = v[:i]
					break
				}
			}
			p.prefix = v
		case nfulaPayload:
			p.payload = v
		case nfulaSeq:
			if len(v) < 4 {
				return fmt.Errorf("sequence attribute of %d bytes: %w", len(v), errShortMessage)
			}
			p.seq, p.hasSeq = binary.BigEndian.Uint32(v), true
		}
		return nil
	})
}
