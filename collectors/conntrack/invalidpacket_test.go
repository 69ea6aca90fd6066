package conntrack

import (
	"encoding/binary"
	"net/netip"
	"testing"
)

// ipv4Packet builds an IPv4 header (with ihl 32-bit words) followed by transport.
func ipv4Packet(ihl int, proto uint8, src, dst string, fragOffset uint16, transport []byte) []byte {
	b := make([]byte, ihl*4)
	b[0] = 0x40 | byte(ihl)
	binary.BigEndian.PutUint16(b[6:8], fragOffset)
	b[9] = proto
	copy(b[12:16], netip.MustParseAddr(src).AsSlice())
	copy(b[16:20], netip.MustParseAddr(dst).AsSlice())
	return append(b, transport...)
}

// ipv6Packet builds an IPv6 header with next header next, followed by rest (extension headers
// and transport).
func ipv6Packet(next uint8, src, dst string, rest []byte) []byte {
	b := make([]byte, 40)
	b[0] = 0x60
	b[6] = next
	copy(b[8:24], netip.MustParseAddr(src).AsSlice())
	copy(b[24:40], netip.MustParseAddr(dst).AsSlice())
	return append(b, rest...)
}

func ports(src, dst uint16) []byte {
	return binary.BigEndian.AppendUint16(binary.BigEndian.AppendUint16(nil, src), dst)
}

func TestDecodePacketTuple(t *testing.T) {
	tcpHdr := append(ports(34567, 80), make([]byte, 16)...)
	for _, tc := range []struct {
		name string
		pkt  []byte
		want tuple
	}{
		{"ipv4 tcp", ipv4Packet(5, 6, "10.0.0.2", "10.96.0.20", 0, tcpHdr),
			tuple{netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.96.0.20"), 34567, 80, 6}},
		{"ipv4 with options, udp", ipv4Packet(6, 17, "10.0.0.2", "10.96.0.10", 0, ports(5000, 53)),
			tuple{netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.96.0.10"), 5000, 53, 17}},
		{"ipv4 cut inside the ports", ipv4Packet(5, 6, "10.0.0.2", "10.96.0.20", 0, []byte{1, 2}),
			tuple{netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.96.0.20"), 0, 0, 6}},
		{"ipv4 later fragment", ipv4Packet(5, 6, "10.0.0.2", "10.96.0.20", 185, tcpHdr),
			tuple{netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.96.0.20"), 0, 0, 6}},
		{"ipv4 icmp", ipv4Packet(5, 1, "10.0.0.2", "10.0.0.1", 0, []byte{8, 0, 0, 0}),
			tuple{netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.0.1"), 0, 0, 1}},
		{"ipv6 tcp", ipv6Packet(6, "fd00::2", "fd00:96::20", tcpHdr),
			tuple{netip.MustParseAddr("fd00::2"), netip.MustParseAddr("fd00:96::20"), 34567, 80, 6}},
		{"ipv6 hop-by-hop then udp", ipv6Packet(0, "fd00::2", "fd00:96::10", append([]byte{17, 0, 0, 0, 0, 0, 0, 0}, ports(5000, 53)...)),
			tuple{netip.MustParseAddr("fd00::2"), netip.MustParseAddr("fd00:96::10"), 5000, 53, 17}},
		{"ipv6 first fragment", ipv6Packet(44, "fd00::2", "fd00:96::20", append([]byte{6, 0, 0, 1, 0, 0, 0, 9}, tcpHdr...)),
			tuple{netip.MustParseAddr("fd00::2"), netip.MustParseAddr("fd00:96::20"), 34567, 80, 6}},
		{"ipv6 later fragment", ipv6Packet(44, "fd00::2", "fd00:96::20", append([]byte{6, 0, 0, 8, 0, 0, 0, 9}, tcpHdr...)),
			tuple{netip.MustParseAddr("fd00::2"), netip.MustParseAddr("fd00:96::20"), 0, 0, 6}},
		{"ipv6 icmpv6", ipv6Packet(58, "fd00::2", "fd00::1", []byte{128, 0, 0, 0}),
			tuple{netip.MustParseAddr("fd00::2"), netip.MustParseAddr("fd00::1"), 0, 0, 58}},
	} {
		var got tuple
		if err := decodePacketTuple(tc.pkt, &got); err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if got != tc.want {
			t.Errorf("%s: got %+v, want %+v", tc.name, got, tc.want)
		}
	}
	for _, bad := range [][]byte{nil, {0x45}, {0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, make([]byte, 20), {0x60, 0}} {
		var got tuple
		if err := decodePacketTuple(bad, &got); err == nil {
			t.Errorf("decodePacketTuple(%x) = %+v, want an error", bad, got)
		}
	}
}

func FuzzDecodePacketTuple(f *testing.F) {
	f.Add(ipv4Packet(5, 6, "10.0.0.2", "10.96.0.20", 0, ports(1, 2)))
	f.Add(ipv6Packet(0, "fd00::2", "fd00:96::10", append([]byte{44, 0, 0, 0, 0, 0, 0, 0, 6, 0, 0, 0, 0, 0, 0, 0}, ports(3, 4)...)))
	f.Fuzz(func(t *testing.T, b []byte) {
		var tp tuple
		if err := decodePacketTuple(b, &tp); err != nil {
			return
		}
		if !tp.src.IsValid() || !tp.dst.IsValid() || tp.src.Is4() != tp.dst.Is4() {
			t.Fatalf("decoded %+v from %x", tp, b)
		}
		if tp.src.Is4() != (b[0]>>4 == 4) {
			t.Fatalf("family of %+v does not match the version nibble of %x", tp, b)
		}
	})
}

// logMessage builds an NFLOG packet message as nfnetlink_log sends it.
func logMessage(family uint8, prefix string, payload []byte, seq uint32) []byte {
	b := make([]byte, nlmsgHeaderLen+nfgenHeaderLen)
	binary.NativeEndian.PutUint16(b[4:6], nfnlSubsysULOG<<8|nfulnlMsgPacket)
	b[16] = family
	b = appendAttr(b, 1, []byte{0x08, 0x00, 1, 0}) // NFULA_PACKET_HDR
	b = appendAttr(b, nfulaPrefix, append([]byte(prefix), 0))
	b = appendAttr(b, nfulaPayload, payload)
	b = appendAttr(b, nfulaSeq, binary.BigEndian.AppendUint32(nil, seq))
	binary.NativeEndian.PutUint32(b[0:4], uint32(len(b)))
	return b
}

func TestDecodeLogMessage(t *testing.T) {
	pkt := ipv4Packet(5, 6, "10.0.0.2", "10.96.0.20", 0, ports(1, 2))
	var p loggedPacket
	if err := decodeLogMessage(logMessage(2, "nf_ct_proto_6: bad checksum ", pkt, 41), &p); err != nil {
		t.Fatal(err)
	}
	if p.family != 2 || string(p.prefix) != "nf_ct_proto_6: bad checksum " || string(p.payload) != string(pkt) || !p.hasSeq || p.seq != 41 {
		t.Errorf("decoded %+v", p)
	}
	cfg := nflogConfigMessage(0)
	if err := decodeLogMessage(cfg, &p); err != errNotLogPacket {
		t.Errorf("a configuration message decoded as a packet: %v", err)
	}
	if err := decodeLogMessage(logMessage(2, "x", pkt, 1)[:10], &p); err == nil {
		t.Error("a cut message decoded")
	}
}

func FuzzDecodeLogMessage(f *testing.F) {
	f.Add(logMessage(2, "nf_ct_proto_6: bad checksum ", ipv4Packet(5, 6, "10.0.0.2", "10.96.0.20", 0, ports(1, 2)), 7))
	f.Add(logMessage(10, "", nil, 0))
	f.Fuzz(func(t *testing.T, b []byte) {
		var p loggedPacket
		if err := decodeLogMessage(b, &p); err != nil {
			return
		}
		for _, s := range [][]byte{p.prefix, p.payload} {
			if len(s) > len(b) {
				t.Fatalf("attribute of %d bytes from a message of %d", len(s), len(b))
			}
		}
	})
}
