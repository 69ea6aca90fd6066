package nftnl

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/google/nftables/xt"
	"golang.org/x/sys/unix"

	"github.com/proxyhealth/proxyhealth/internal/ruleset"
)

// iptables-nft writes what has no native nf_tables form as x_tables compatibility expressions:
// a "match" or "target" with the x_tables extension's name, revision and its kernel struct as
// info. iptables-nft 1.8.9 writes kube-proxy's `-m comment`, `-m conntrack --ctstate` (and
// `-m state`), `-m statistic`, a bare `-m tcp`/`-m udp` and `-j DNAT` this way; `-p`, `-d` and
// `--dport` become native payload/meta/cmp expressions.

// xtInfo decodes an x_tables info struct with google/nftables' xt package. Its decoders index
// the bytes as the kernel laid them out; a malformed struct must not take the exporter down,
// so a panic there is reported as an error.
func xtInfo(name string, family uint8, rev uint32, info []byte) (v xt.InfoAny, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("decode x_tables %s revision %d: %v", name, rev, r)
		}
	}()
	return xt.Unmarshal(name, xt.TableFamily(family), rev, info)
}

// xtExpr reads a match's or target's NFTA_*_NAME, _REV and _INFO (the same attribute numbers
// for both).
func xtExpr(data []byte) (name []byte, rev uint32, info []byte) {
	a := newAttrs(data)
	for a.next() {
		switch a.typ {
		case unix.NFTA_MATCH_NAME:
			name = a.str()
		case unix.NFTA_MATCH_REV:
			rev = must32(&a)
		case unix.NFTA_MATCH_INFO:
			info = a.val
		}
	}
	return name, rev, info
}

// XT_CONNTRACK_STATE_INVALID and XT_STATE_INVALID: the INVALID bit of a state mask.
const xtStateInvalid = 1 << 0

func (in *interp) xtMatch(data []byte) {
	name, rev, info := xtExpr(data)
	switch string(name) {
	case "comment":
		in.f.comment = cstr(info)
		return
	case "nfacct", "limit":
		// nfacct counts (kube-proxy puts it on its INVALID drop), limit rate-limits: neither
		// decides which kind of packet reaches the verdict.
		return
	case "state":
		// struct xt_state_info { unsigned int statemask; }
		if len(info) >= 4 {
			in.addCt(binary.NativeEndian.Uint32(info)&xtStateInvalid != 0)
			return
		}
	case "conntrack":
		if in.xtConntrack(rev, info) {
			return
		}
	case "tcp", "udp":
		if in.xtPorts(string(name), rev, info) {
			return
		}
	}
	in.f.other, in.f.otherDispatch = true, true
}

// xtConntrack reads `-m conntrack`: only a state match (XT_CONNTRACK_STATE, possibly inverted)
// is understood; it reports false for anything else it restricts.
func (in *interp) xtConntrack(rev uint32, info []byte) bool {
	v, err := xtInfo("conntrack", in.family, rev, info)
	if err != nil {
		return false
	}
	var base *xt.ConntrackMtinfoBase
	var mask uint16
	switch c := v.(type) {
	case *xt.ConntrackMtinfo1:
		base, mask = &c.ConntrackMtinfoBase, uint16(c.StateMask)
	case *xt.ConntrackMtinfo2:
		base, mask = &c.ConntrackMtinfoBase, c.StateMask
	case *xt.ConntrackMtinfo3:
		base, mask = &c.ConntrackMtinfoBase, c.StateMask
	default:
		return false
	}
	flags := xt.ConntrackFlags(base.MatchFlags)
	if flags&^(xt.ConntrackState|xt.ConntrackStateAlias) != 0 || flags&xt.ConntrackState == 0 {
		return false
	}
	inverted := xt.ConntrackFlags(base.InvertFlags)&xt.ConntrackState != 0
	in.addCt((mask&xtStateInvalid != 0) != inverted)
	return true
}

// xtPorts reads a compat `-m tcp`/`-m udp`: a single, not inverted destination port is a
// dispatch field; no ports at all (iptables-nft writes a bare `-m tcp` in KUBE-SEP rules)
// matches what the protocol match already did.
func (in *interp) xtPorts(name string, rev uint32, info []byte) bool {
	v, err := xtInfo(name, in.family, rev, info)
	if err != nil {
		return false
	}
	var src, dst [2]uint16
	var invDst, invOther bool
	switch m := v.(type) {
	case *xt.Tcp:
		src, dst = m.SrcPorts, m.DstPorts
		invDst = m.InvFlags&xt.TcpInvDestPorts != 0
		invOther = m.InvFlags&^xt.TcpInvDestPorts != 0 || m.FlagsMask != 0 || m.Option != 0
	case *xt.Udp:
		src, dst = m.SrcPorts, m.DstPorts
		invDst = m.InvFlags&xt.UdpInvDestPorts != 0
		invOther = m.InvFlags&^xt.UdpInvDestPorts != 0
	default:
		return false
	}
	anyPort := [2]uint16{0, 0xffff}
	if invOther || src != anyPort {
		return false
	}
	switch {
	case dst == anyPort && !invDst:
	case dst[0] == dst[1] && !invDst:
		in.f.other = true
		in.f.dport, in.f.hasDport = dst[0], true
	default:
		return false
	}
	return true
}

func (in *interp) xtTarget(data []byte) {
	name, rev, info := xtExpr(data)
	switch string(name) {
	case "DNAT":
		in.setVerdict(ruleset.Accept, nil)
		if ap, ok := in.xtDNAT(rev, info); ok {
			in.f.dnat, in.f.hasDNAT = ap, true
		}
	case "REJECT":
		in.setVerdict(ruleset.Reject, nil)
	case "SNAT", "MASQUERADE", "REDIRECT", "NFQUEUE", "CT":
		if string(name) != "CT" {
			in.setVerdict(ruleset.Accept, nil)
		}
	default:
		// LOG, NFLOG, MARK, CONNMARK, ...: act and let the packet go on to the next rule.
	}
}

// xtDNAT reads `-j DNAT --to-destination ADDR:PORT`: revision 0 (IPv4 only, the
// nf_nat_ipv4_multi_range_compat struct), 1 (nf_nat_range) and 2 (nf_nat_range2, what
// iptables-nft 1.8.9 writes).
func (in *interp) xtDNAT(rev uint32, info []byte) (netip.AddrPort, bool) {
	v, err := xtInfo("DNAT", in.family, rev, info)
	if err != nil {
		return netip.AddrPort{}, false
	}
	var r *xt.NatRange
	switch t := v.(type) {
	case *xt.NatRange:
		r = t
	case *xt.NatRange2:
		r = &t.NatRange
	case *xt.NatIPv4MultiRangeCompat:
		if len(*t) == 0 {
			return netip.AddrPort{}, false
		}
		ip, ok := netip.AddrFromSlice((*t)[0].MinIP.To4())
		return netip.AddrPortFrom(ip, (*t)[0].MinPort), ok
	default:
		return netip.AddrPort{}, false
	}
	ip, ok := netip.AddrFromSlice(r.MinIP)
	if !ok || xt.NatRangeFlags(r.Flags)&xt.NatRangeMapIPs == 0 {
		return netip.AddrPort{}, false
	}
	return netip.AddrPortFrom(ip.Unmap(), r.MinPort), true
}
