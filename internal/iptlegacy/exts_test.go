package iptlegacy

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/proxyhealth/proxyhealth/internal/ruleset"
)

func extOf(name string, rev uint8, data []byte) ext {
	return ext{name: []byte(name), rev: rev, data: data}
}

// DNAT targets of every revision. iptables 1.8.9 writes revision 2 on this kernel (the blobs in
// testdata cover it); 0 and 1 are built by hand from nf_nat.h.
func TestDNATDestination(t *testing.T) {
	be := binary.BigEndian
	rev0 := func(flags uint32, lo, hi string, plo, phi uint16) []byte {
		d := make([]byte, 24)
		ne.PutUint32(d[0:], 1) // rangesize
		ne.PutUint32(d[4:], flags)
		a, b := netip.MustParseAddr(lo).As4(), netip.MustParseAddr(hi).As4()
		copy(d[8:], a[:])
		copy(d[12:], b[:])
		be.PutUint16(d[16:], plo)
		be.PutUint16(d[18:], phi)
		return d
	}
	rev12 := func(size int, flags uint32, lo, hi string, plo, phi uint16) []byte {
		d := make([]byte, size)
		ne.PutUint32(d[0:], flags)
		a, b := netip.MustParseAddr(lo), netip.MustParseAddr(hi)
		if a.Is4() {
			a4, b4 := a.As4(), b.As4()
			copy(d[4:], a4[:])
			copy(d[20:], b4[:])
		} else {
			a16, b16 := a.As16(), b.As16()
			copy(d[4:], a16[:])
			copy(d[20:], b16[:])
		}
		be.PutUint16(d[36:], plo)
		be.PutUint16(d[38:], phi)
		return d
	}
	const ips, port = natMapIPs, natProtoSpec
	tests := []struct {
		name string
		t    ext
		ipv6 bool
		want string // "" for none
	}{
		{"rev 0", extOf("DNAT", 0, rev0(ips|port, "10.1.2.3", "10.1.2.3", 8080, 8080)), false, "10.1.2.3:8080"},
		{"rev 0 no port", extOf("DNAT", 0, rev0(ips, "10.1.2.3", "10.1.2.3", 0, 0)), false, ""},
		{"rev 0 address range", extOf("DNAT", 0, rev0(ips|port, "10.1.2.3", "10.1.2.4", 80, 80)), false, ""},
		{"rev 0 no ranges", extOf("DNAT", 0, make([]byte, 24)), false, ""},
		{"rev 0 on IPv6", extOf("DNAT", 0, rev0(ips|port, "10.1.2.3", "10.1.2.3", 80, 80)), true, ""},
		{"rev 1", extOf("DNAT", 1, rev12(40, ips|port, "10.1.2.3", "10.1.2.3", 53, 53)), false, "10.1.2.3:53"},
		{"rev 1 IPv6", extOf("DNAT", 1, rev12(40, ips|port, "fd00::3", "fd00::3", 53, 53)), true, "[fd00::3]:53"},
		{"rev 2", extOf("DNAT", 2, rev12(48, ips|port, "10.1.2.3", "10.1.2.3", 80, 80)), false, "10.1.2.3:80"},
		{"rev 2 mapped", extOf("DNAT", 2, rev12(48, ips|port, "::ffff:10.1.2.3", "::ffff:10.1.2.3", 80, 80)), true, "10.1.2.3:80"},
		{"rev 2 port range", extOf("DNAT", 2, rev12(48, ips|port, "10.1.2.3", "10.1.2.3", 80, 81)), false, ""},
		{"rev 2 port offset", extOf("DNAT", 2, rev12(48, ips|port|natProtoOffset, "10.1.2.3", "10.1.2.3", 80, 80)), false, ""},
		{"rev 2 port only", extOf("DNAT", 2, rev12(48, port, "0.0.0.0", "0.0.0.0", 80, 80)), false, ""},
		{"rev 2 short", extOf("DNAT", 2, make([]byte, 39)), false, ""},
		{"rev 3", extOf("DNAT", 3, rev12(48, ips|port, "10.1.2.3", "10.1.2.3", 80, 80)), false, ""},
	}
	for _, tt := range tests {
		got, ok := dnatDestination(tt.t, tt.ipv6)
		if s := got.String(); ok != (tt.want != "") || (ok && s != tt.want) {
			t.Errorf("%s: %v %v, want %q", tt.name, got, ok, tt.want)
		}
	}
}

func TestDestPort(t *testing.T) {
	tcp := func(lo, hi uint16, inv uint8) ext {
		d := make([]byte, 16)
		ne.PutUint16(d[4:], lo)
		ne.PutUint16(d[6:], hi)
		d[11] = inv
		return extOf("tcp", 0, d)
	}
	udp := func(lo, hi uint16, inv uint8) ext {
		d := make([]byte, 16)
		ne.PutUint16(d[4:], lo)
		ne.PutUint16(d[6:], hi)
		d[8] = inv
		return extOf("udp", 0, d)
	}
	sctp := func(lo, hi uint16, flags, inv uint32) ext {
		d := make([]byte, 296)
		ne.PutUint16(d[0:], lo)
		ne.PutUint16(d[2:], hi)
		ne.PutUint32(d[284:], flags)
		ne.PutUint32(d[288:], inv)
		return extOf("sctp", 0, d)
	}
	tests := []struct {
		name string
		m    ext
		want int // -1 for none
	}{
		{"tcp", tcp(80, 80, 0), 80},
		{"tcp any", tcp(0, 0xffff, 0), -1},
		{"tcp range", tcp(80, 90, 0), -1},
		{"tcp negated", tcp(80, 80, tcpInvDstPort), -1},
		{"tcp short", extOf("tcp", 0, make([]byte, 8)), -1},
		{"udp", udp(53, 53, 0), 53},
		{"udp negated", udp(53, 53, udpInvDstPort), -1},
		{"sctp", sctp(9999, 9999, sctpDestPorts, 0), 9999},
		{"sctp no port", sctp(9999, 9999, 0, 0), -1},
		{"sctp negated", sctp(9999, 9999, sctpDestPorts, sctpDestPorts), -1},
		{"multiport", extOf("multiport", 1, make([]byte, 64)), -1},
	}
	for _, tt := range tests {
		p, ok := destPort(tt.m)
		if ok != (tt.want >= 0) || (ok && int(p) != tt.want) {
			t.Errorf("%s: %d %v, want %d", tt.name, p, ok, tt.want)
		}
	}
}

// Conntrack state matches of each revision, positive and inverted.
func TestCtStateOf(t *testing.T) {
	conntrack := func(rev uint8, flags, inv uint16, mask uint16) ext {
		d := make([]byte, 168)
		ne.PutUint16(d[146:], flags)
		ne.PutUint16(d[148:], inv)
		if rev == 1 {
			d[150] = uint8(mask)
		} else {
			ne.PutUint16(d[150:], mask)
		}
		return extOf("conntrack", rev, d)
	}
	state := func(mask uint32) ext {
		d := make([]byte, 8)
		ne.PutUint32(d, mask)
		return extOf("state", 0, d)
	}
	const (
		invalid     = stateInvalid
		newEst      = 1<<3 | 1<<1
		untracked   = 1 << 8
		ctStatus    = 1 << 6 // XT_CONNTRACK_STATUS
		stateFlag   = ctFlagState
		aliasFlag   = ctFlagStateAlias
		none        = ruleset.CtNone
		matchesInv  = ruleset.CtInvalid
		excludesInv = ruleset.CtExcludes
	)
	tests := []struct {
		name      string
		m         ext
		ct        ruleset.CtMatch
		restricts bool
		list      string
	}{
		{"rev 1 INVALID", conntrack(1, stateFlag, 0, invalid), matchesInv, false, "INVALID"},
		{"rev 2 NEW,ESTABLISHED", conntrack(2, stateFlag, 0, newEst), excludesInv, false, "NEW,ESTABLISHED"},
		{"rev 3 INVALID,UNTRACKED", conntrack(3, stateFlag, 0, invalid|untracked), matchesInv, false, "INVALID,UNTRACKED"},
		{"rev 3 ! INVALID", conntrack(3, stateFlag, stateFlag, invalid), excludesInv, false, "INVALID"},
		{"rev 3 ! NEW,ESTABLISHED", conntrack(3, stateFlag, stateFlag, newEst), matchesInv, false, "NEW,ESTABLISHED"},
		{"rev 3 state alias", conntrack(3, stateFlag|aliasFlag, 0, invalid), matchesInv, false, "INVALID"},
		{"rev 3 INVALID and status", conntrack(3, stateFlag|ctStatus, 0, invalid), matchesInv, true, "INVALID"},
		{"rev 3 status only", conntrack(3, ctStatus, 0, 0), none, true, "none"},
		{"rev 0", conntrack(0, stateFlag, 0, invalid), none, true, "none"},
		{"rev 3 short", extOf("conntrack", 3, make([]byte, 100)), none, true, "none"},
		{"state INVALID", state(invalid), matchesInv, false, "INVALID"},
		{"state UNTRACKED", state(1 << 6), excludesInv, false, "UNTRACKED"},
		{"state short", extOf("state", 0, nil), none, true, "none"},
	}
	for _, tt := range tests {
		st, ok := ctStateOf(tt.m)
		if !ok || st.ct != tt.ct || st.restricts != tt.restricts || st.stateList() != tt.list {
			t.Errorf("%s: %v %+v (%s), want ct %v restricts %v list %s", tt.name, ok, st, st.stateList(), tt.ct, tt.restricts, tt.list)
		}
	}
	if _, ok := ctStateOf(extOf("comment", 0, nil)); ok {
		t.Error("comment read as a ct state match")
	}
	if combineCt(ruleset.CtInvalid, ruleset.CtExcludes) != ruleset.CtExcludes || combineCt(ruleset.CtNone, ruleset.CtInvalid) != ruleset.CtInvalid {
		t.Error("combineCt")
	}
}

func TestMaskBitsAndInterfaces(t *testing.T) {
	for mask, want := range map[string]int{"0.0.0.0": 0, "255.0.0.0": 8, "255.255.255.255": 32, "255.255.0.255": -1, "255.254.0.0": 15, "ffff:ffff::": 32, "ffff:0:ffff::": -1} {
		if got := maskBits(netip.MustParseAddr(mask)); got != want {
			t.Errorf("maskBits(%s) = %d, want %d", mask, got, want)
		}
	}
	pad := func(s string) []byte {
		b := make([]byte, ifNameLen)
		copy(b, s)
		return b
	}
	maskOf := func(n int) []byte {
		m := make([]byte, ifNameLen)
		for i := range n {
			m[i] = 0xff
		}
		return m
	}
	for _, tt := range []struct {
		name   string
		masked int
		want   string
	}{{"cni0", 5, "cni0"}, {"veth+", 4, "veth+"}, {"", 0, ""}, {"eth0", 0, ""}, {"0123456789abcde", 16, "0123456789abcde"}} {
		if got := string(ifaceName(pad(tt.name), maskOf(tt.masked))); got != tt.want {
			t.Errorf("ifaceName(%q, %d) = %q, want %q", tt.name, tt.masked, got, tt.want)
		}
	}
}
