package conntrack

import (
	"encoding/binary"
	"errors"
	"net/netip"
)

var errNotIP = errors.New("not an IPv4 or IPv6 packet")

// decodePacketTuple reads the addresses, protocol and, for the protocols that have them, the
// ports of a packet that starts at its IP header. A packet cut before its transport header, or
// a fragment other than the first, gives its addresses and protocol with zero ports. IPv6
// extension headers are skipped up to the transport header.
func decodePacketTuple(b []byte, t *tuple) error {
	*t = tuple{}
	if len(b) < 1 {
		return errNotIP
	}
	var rest []byte
	switch b[0] >> 4 {
	case 4:
		if len(b) < 20 {
			return errNotIP
		}
		ihl := int(b[0]&0x0f) * 4
		if ihl < 20 {
			return errNotIP
		}
		t.proto = b[9]
		t.src = netip.AddrFrom4([4]byte(b[12:16]))
		t.dst = netip.AddrFrom4([4]byte(b[16:20]))
		if binary.BigEndian.Uint16(b[6:8])&0x1fff != 0 || ihl > len(b) {
			return nil // a later fragment has no transport header
		}
		rest = b[ihl:]
	case 6:
		if len(b) < 40 {
			return errNotIP
		}
		t.src = netip.AddrFrom16([16]byte(b[8:24]))
		t.dst = netip.AddrFrom16([16]byte(b[24:40]))
		next, ext := b[6], b[40:]
		// Extension headers; at most a handful occur, the bound keeps a crafted chain cheap.
		for range 8 {
			var l int
			switch next {
			case 0, 43, 60: // hop-by-hop, routing, destination options
				if len(ext) < 2 {
					t.proto = next
					return nil
				}
				l = (int(ext[1]) + 1) * 8
			case 44: // fragment
				if len(ext) < 8 {
					t.proto = next
					return nil
				}
				if binary.BigEndian.Uint16(ext[2:4])&0xfff8 != 0 {
					t.proto = ext[0]
					return nil
				}
				l = 8
			case 51: // authentication header
				if len(ext) < 2 {
					t.proto = next
					return nil
				}
				l = (int(ext[1]) + 2) * 4
			default:
				t.proto = next
				t.srcPort, t.dstPort = transportPorts(next, ext)
				return nil
			}
			if l > len(ext) {
				t.proto = next
				return nil
			}
			next, ext = ext[0], ext[l:]
		}
		t.proto = next
		return nil
	default:
		return errNotIP
	}
	t.srcPort, t.dstPort = transportPorts(t.proto, rest)
	return nil
}

// transportPorts reads the ports of the protocols whose header starts with them.
func transportPorts(proto uint8, b []byte) (src, dst uint16) {
	switch proto {
	case 6, 17, 33, 132, 136: // TCP, UDP, DCCP, SCTP, UDP-Lite
		if len(b) >= 4 {
			return binary.BigEndian.Uint16(b[0:2]), binary.BigEndian.Uint16(b[2:4])
		}
	}
	return 0, 0
}
