package iptlegacy

import (
	"net/netip"
	"strconv"
	"strings"

	"github.com/proxyhealth/proxyhealth/internal/ruleset"
)

// describe names a rule for an operator: its chain and number, which `iptables-legacy -S CHAIN
// NUM` prints, and a short form of it close to iptables-save's: the core match, each match
// module (with the comment, the ct states and the nfacct counter spelled out, since those are
// what the INVALID-drop search looked at) and the target.
//
//	FORWARD rule 2: -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
func describe(chain string, num int, e entry, h *ipHeader, v ruleset.Verdict) string {
	var b strings.Builder
	b.WriteString(chain)
	b.WriteString(" rule ")
	b.WriteString(strconv.Itoa(num))
	b.WriteByte(':')
	if h.srcSet {
		writeOpt(&b, h.invflags&invSrcIP != 0, "-s", prefixString(h.src, h.smsk))
	}
	if h.dstSet {
		writeOpt(&b, h.invflags&invDstIP != 0, "-d", prefixString(h.dst, h.dmsk))
	}
	if len(h.in) > 0 {
		writeOpt(&b, h.invflags&invIn != 0, "-i", string(h.in))
	}
	if len(h.out) > 0 {
		writeOpt(&b, h.invflags&invOut != 0, "-o", string(h.out))
	}
	if h.protoSet {
		writeOpt(&b, h.invflags&invProto != 0, "-p", protoName(h.proto))
	}
	if h.frag {
		b.WriteString(" -f")
	}
	it := e.matches()
	for m, ok := it.next(); ok; m, ok = it.next() {
		describeMatch(&b, m)
	}
	describeTarget(&b, e, h, v)
	return b.String()
}

func describeMatch(b *strings.Builder, m ext) {
	if st, ok := ctStateOf(m); ok {
		switch {
		case st.alias && st.mask != 0:
			b.WriteString(" -m state")
			writeOpt(b, st.inverted, "--state", st.stateList())
		case st.mask != 0 || st.inverted:
			b.WriteString(" -m conntrack")
			writeOpt(b, st.inverted, "--ctstate", st.stateList())
		default:
			b.WriteString(" -m conntrack")
		}
		if st.restricts {
			b.WriteString(" ...")
		}
		return
	}
	b.WriteString(" -m ")
	b.Write(m.name)
	switch string(m.name) {
	case "comment":
		writeOpt(b, false, "--comment", quote(string(cString(m.data))))
	case "nfacct":
		// struct xt_nfacct_match_info { char name[NFACCT_NAME_MAX (32)]; ... }
		writeOpt(b, false, "--nfacct-name", string(cString(m.data[:min(len(m.data), 32)])))
	}
}

func describeTarget(b *strings.Builder, e entry, h *ipHeader, v ruleset.Verdict) {
	t := e.target()
	verdict, std := t.standardVerdict()
	switch {
	case !std:
		b.WriteString(" -j ")
		b.Write(t.name)
	case v.Kind == ruleset.Jump || v.Kind == ruleset.Goto:
		if h.gotoFlag {
			b.WriteString(" -g ")
		} else {
			b.WriteString(" -j ")
		}
		b.WriteString(v.Target)
	case verdict == verdictAccept:
		b.WriteString(" -j ACCEPT")
	case verdict == verdictDrop:
		b.WriteString(" -j DROP")
	case verdict == verdictReturn:
		b.WriteString(" -j RETURN")
	case verdict == verdictQueue:
		b.WriteString(" -j QUEUE")
	}
}

func writeOpt(b *strings.Builder, inv bool, name, value string) {
	if inv {
		b.WriteString(" !")
	}
	b.WriteByte(' ')
	b.WriteString(name)
	b.WriteByte(' ')
	b.WriteString(value)
}

// prefixString prints an address and mask as iptables does: addr/len, or addr/mask when the
// mask is not contiguous.
func prefixString(a, mask netip.Addr) string {
	if bits := maskBits(mask); bits >= 0 {
		return a.String() + "/" + strconv.Itoa(bits)
	}
	return a.String() + "/" + mask.String()
}

func protoName(p uint16) string {
	switch p {
	case 1:
		return "icmp"
	case 6:
		return "tcp"
	case 17:
		return "udp"
	case 58:
		return "ipv6-icmp"
	case 132:
		return "sctp"
	}
	return strconv.Itoa(int(p))
}

// quote writes a comment the way iptables-save does: in double quotes, with quotes and
// backslashes escaped.
func quote(s string) string {
	if !strings.ContainsAny(s, "\"\\") {
		return `"` + s + `"`
	}
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		if s[i] == '"' || s[i] == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	b.WriteByte('"')
	return b.String()
}
