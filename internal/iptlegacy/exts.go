package iptlegacy

import (
	"encoding/binary"
	"net/netip"
)

// Match and target data this package reads, from include/uapi/linux/netfilter/xt_tcpudp.h,
// xt_sctp.h and nf_nat.h. Port numbers in the tcp, udp and sctp matches are in host order
// (iptables converts them); NAT ranges keep network order.

const (
	tcpInvDstPort  = 0x02 // XT_TCP_INV_DSTPT (xt_tcp.invflags)
	udpInvDstPort  = 0x02 // XT_UDP_INV_DSTPT (xt_udp.invflags)
	sctpDestPorts  = 0x02 // XT_SCTP_DEST_PORTS (xt_sctp_info.flags, .invflags)
	natMapIPs      = 0x01 // NF_NAT_RANGE_MAP_IPS
	natProtoSpec   = 0x02 // NF_NAT_RANGE_PROTO_SPECIFIED
	natProtoOffset = 0x20 // NF_NAT_RANGE_PROTO_OFFSET
)

// destPort returns the single destination port of a tcp, udp or sctp match, as iptables-save's
// "--dport N"; ok is false for no port, a range or a negated port.
func destPort(m ext) (uint16, bool) {
	d := m.data
	var lo, hi uint16
	switch string(m.name) {
	case "tcp": // struct xt_tcp { u16 spts[2], dpts[2]; u8 option, flg_mask, flg_cmp, invflags; }
		if len(d) < 12 || d[11]&tcpInvDstPort != 0 {
			return 0, false
		}
		lo, hi = ne.Uint16(d[4:]), ne.Uint16(d[6:])
	case "udp": // struct xt_udp { u16 spts[2], dpts[2]; u8 invflags; }
		if len(d) < 9 || d[8]&udpInvDstPort != 0 {
			return 0, false
		}
		lo, hi = ne.Uint16(d[4:]), ne.Uint16(d[6:])
	case "sctp":
		// struct xt_sctp_info { u16 dpts[2], spts[2]; u32 chunkmap[256 / sizeof(u32)],
		// chunk_match_type; struct xt_sctp_flag_info flag_info[4] (3 bytes each); int
		// flag_count; u32 flags, invflags; }: flags at 284, invflags at 288.
		if len(d) < 292 {
			return 0, false
		}
		flags, inv := ne.Uint32(d[284:]), ne.Uint32(d[288:])
		if flags&sctpDestPorts == 0 || inv&sctpDestPorts != 0 {
			return 0, false
		}
		lo, hi = ne.Uint16(d[0:]), ne.Uint16(d[2:])
	default:
		return 0, false
	}
	if lo != hi { // a range, or no port at all (0:65535)
		return 0, false
	}
	return lo, true
}

// dnatDestination returns a DNAT target's destination when it is one address and one port,
// the form iptables-save prints as "--to-destination 10.244.1.3:8080" ("[fd00::3]:8080").
// IPv4-mapped IPv6 addresses are unmapped, as collectors/rules does with the text.
func dnatDestination(t ext, ipv6 bool) (netip.AddrPort, bool) {
	d := t.data
	var flags uint32
	var lo, hi netip.Addr
	var plo, phi uint16
	switch t.rev {
	case 0:
		// struct nf_nat_ipv4_multi_range_compat { unsigned int rangesize; struct
		// nf_nat_ipv4_range { unsigned int flags; __be32 min_ip, max_ip; union
		// nf_conntrack_man_proto min, max; } range[1]; } (IPv4 only)
		if ipv6 || len(d) < 20 || ne.Uint32(d) < 1 {
			return netip.AddrPort{}, false
		}
		flags = ne.Uint32(d[4:])
		lo, hi = netip.AddrFrom4([4]byte(d[8:12])), netip.AddrFrom4([4]byte(d[12:16]))
		plo, phi = binary.BigEndian.Uint16(d[16:]), binary.BigEndian.Uint16(d[18:])
	case 1, 2:
		// struct nf_nat_range { unsigned int flags; union nf_inet_addr min_addr, max_addr;
		// union nf_conntrack_man_proto min_proto, max_proto; } and nf_nat_range2, which adds
		// base_proto after them.
		if len(d) < 40 {
			return netip.AddrPort{}, false
		}
		flags = ne.Uint32(d)
		if ipv6 {
			lo, hi = netip.AddrFrom16([16]byte(d[4:20])), netip.AddrFrom16([16]byte(d[20:36]))
		} else {
			lo, hi = netip.AddrFrom4([4]byte(d[4:8])), netip.AddrFrom4([4]byte(d[20:24]))
		}
		plo, phi = binary.BigEndian.Uint16(d[36:]), binary.BigEndian.Uint16(d[38:])
	default:
		return netip.AddrPort{}, false
	}
	if flags&natMapIPs == 0 || flags&natProtoSpec == 0 || flags&natProtoOffset != 0 || lo != hi || plo != phi {
		return netip.AddrPort{}, false
	}
	return netip.AddrPortFrom(lo.Unmap(), plo), true
}
