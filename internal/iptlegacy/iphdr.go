package iptlegacy

import (
	"net/netip"
)

// ipt_ip / ip6t_ip6 invflags (IPT_INV_*, IP6T_INV_*: the same bits).
const (
	invIn    = 0x01
	invOut   = 0x02
	invSrcIP = 0x08
	invDstIP = 0x10
	invProto = 0x40
)

// ipHeader is an entry's core match: what iptables writes as -s, -d, -i, -o, -p and -f.
type ipHeader struct {
	src, dst, smsk, dmsk netip.Addr
	srcSet, dstSet       bool
	in, out              []byte // interface names; a trailing '+' when only a prefix must match
	proto                uint16
	protoSet             bool
	frag, tos            bool // IPv4 -f; IPv6's obsolete TOS flag
	invflags             uint8
	gotoFlag             bool // the standard target is a goto (-g), not a jump
}

func ipHeaderOf(e entry) ipHeader {
	l, r := e.l, e.raw
	addr := func(off int) netip.Addr {
		if l.ipv6 {
			return netip.AddrFrom16([16]byte(r[off : off+16]))
		}
		return netip.AddrFrom4([4]byte(r[off : off+4]))
	}
	flags := r[l.flags]
	h := ipHeader{
		src: addr(l.src), dst: addr(l.dst), smsk: addr(l.smsk), dmsk: addr(l.dmsk),
		in:       ifaceName(r[l.iniface:l.iniface+ifNameLen], r[l.inmask:l.inmask+ifNameLen]),
		out:      ifaceName(r[l.outiface:l.outiface+ifNameLen], r[l.outmask:l.outmask+ifNameLen]),
		proto:    ne.Uint16(r[l.proto:]),
		invflags: r[l.invflags],
		gotoFlag: flags&l.flagGoto != 0,
	}
	// iptables-save prints an address when its mask or the address is set (it stores them
	// masked), and a protocol when it is not 0 ("all").
	h.srcSet = !h.smsk.IsUnspecified() || !h.src.IsUnspecified()
	h.dstSet = !h.dmsk.IsUnspecified() || !h.dst.IsUnspecified()
	h.protoSet = h.proto != 0 || flags&l.flagProto != 0
	if l.ipv6 {
		h.tos = flags&flagTOS6 != 0
	} else {
		h.frag = flags&flagFrag4 != 0
	}
	return h
}

// restricts reports whether the core match limits which packets the rule sees.
func (h *ipHeader) restricts() bool {
	return h.srcSet || h.dstSet || len(h.in) > 0 || len(h.out) > 0 || h.protoSet || h.frag || h.tos || h.invflags != 0
}

// ifaceName is the interface as iptables prints it. The kernel compares the name's bytes the
// mask covers: iptables covers the name and its NUL for an exact name, and only the bytes
// before the '+' for a prefix ("veth+"), which prints with the '+'. A mask that covers nothing
// matches every interface and prints as nothing.
func ifaceName(name, mask []byte) []byte {
	n := cString(name)
	covered := 0
	for covered < len(mask) && mask[covered] != 0 {
		covered++
	}
	switch {
	case covered == 0:
		return nil
	case covered > len(n):
		return n
	}
	return append(n[:covered:covered], '+')
}

// maskBits returns the prefix length of a contiguous mask, or -1.
func maskBits(m netip.Addr) int {
	b := m.AsSlice()
	bits := 0
	for i, x := range b {
		if x == 0xff {
			bits += 8
			continue
		}
		ones := 0
		for x&0x80 != 0 {
			ones++
			x <<= 1
		}
		if x != 0 {
			return -1
		}
		bits += ones
		for _, rest := range b[i+1:] {
			if rest != 0 {
				return -1
			}
		}
		return bits
	}
	return bits
}
