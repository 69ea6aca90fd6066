package iptlegacy

import (
	"encoding/binary"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/proxyhealth/proxyhealth/internal/ruleset"
)

// The blobs in testdata were read from the kernel (little-endian amd64) by TestKernelFixtures
// -update; these tests decode them without root.

func loadBlob(t *testing.T, path string, ipv6 bool) (*Info, []byte) {
	t.Helper()
	if binary.NativeEndian.Uint16([]byte{1, 0}) != 1 {
		t.Skip("the stored blobs are little-endian")
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	info, entries, err := splitRecorded(b, ipv6)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return info, entries
}

func TestDecodeFixtures(t *testing.T) {
	for _, f := range fixtures {
		t.Run(f.name, func(t *testing.T) {
			src := f.source(t)
			for _, table := range f.tables {
				info, blob := loadBlob(t, f.blobPath(table), f.ipv6)
				if info.Table != table || info.IPv6 != f.ipv6 {
					t.Fatalf("info %+v, want table %s ipv6 %v", info, table, f.ipv6)
				}
				switch table {
				case "nat":
					got, hasServices, err := decodeNAT(info, blob, nil)
					if err != nil {
						t.Fatal(err)
					}
					want, wantServices := textNAT(t, src)
					if hasServices != wantServices {
						t.Errorf("hasServices %v, want %v", hasServices, wantServices)
					}
					if d := diffProxyTables(got, want); d != "" {
						t.Errorf("nat:\n%s", d)
					}
				case "filter":
					g, err := decodeFilter(info, blob)
					if err != nil {
						t.Fatal(err)
					}
					compareDropPaths(t, g, src)
				}
			}
		})
	}
}

// The real kube-proxy v1.36.3 capture, by value: what collectors/rules' text reader finds in
// it (its tests check the same chains against the API objects the capture came from).
func TestDecodeRealCapture(t *testing.T) {
	info, blob := loadBlob(t, "testdata/kube-proxy-v1.36.3.nat.blob", false)
	pt, hasServices, err := decodeNAT(info, blob, nil)
	if err != nil || !hasServices {
		t.Fatalf("decodeNAT: %v, hasServices %v", err, hasServices)
	}
	ap := netip.MustParseAddrPort
	ip := netip.MustParseAddr
	var backend []netip.AddrPort
	for i := 3; i <= 13; i++ {
		backend = append(backend, netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, 3, byte(i)}), 8080))
	}
	wantChains := map[string][]netip.AddrPort{
		"KUBE-SVC-ERIFXISQEP7F7OF4": {ap("10.244.1.3:53"), ap("10.244.3.30:53")},
		"KUBE-SVC-FEK7IJ3KIWHUKSBD": {ap("10.244.1.3:8080"), ap("10.244.3.50:8080")},
		"KUBE-SVC-GXJRQM6XY2BK2OSB": {ap("10.244.3.60:8080"), ap("10.244.3.62:8080")},
		"KUBE-SVC-JD5MR3NA4I4DYORP": {ap("10.244.1.3:9153"), ap("10.244.3.30:9153")},
		"KUBE-SVC-NPX46M4PTMTKRN6Y": {ap("172.18.0.2:6443")},
		"KUBE-SVC-TCOU7JCQXEZGVUNU": {ap("10.244.1.3:53"), ap("10.244.3.30:53")},
		"KUBE-SVC-ZKJWP2ZV4NN5G7EZ": backend,
		"KUBE-SVL-FEK7IJ3KIWHUKSBD": {ap("10.244.1.3:8080")},
		"KUBE-SVL-T4KSMH6CJWHYYXER": {ap("10.244.1.3:8080"), ap("10.244.1.4:8080")},
	}
	if len(pt.Chains) != len(wantChains) {
		t.Errorf("%d chains, want %d: %v", len(pt.Chains), len(wantChains), pt.Chains)
	}
	for name, want := range wantChains {
		if got := pt.Chains[name]; !slices.Equal(got, want) {
			t.Errorf("%s: %v, want %v", name, got, want)
		}
	}
	tcp, udp := ruleset.ProtoTCP, ruleset.ProtoUDP
	svc := func(vip string, port uint16, proto uint8, ns, name, portName, chain string) ruleset.Service {
		return ruleset.Service{ClusterIP: ip(vip), Port: port, Protocol: proto, Namespace: ns, Name: name, PortName: portName, Chain: chain}
	}
	wantServices := []ruleset.Service{
		svc("10.96.0.10", 53, tcp, "kube-system", "kube-dns", "dns-tcp", "KUBE-SVC-ERIFXISQEP7F7OF4"),
		svc("10.96.0.10", 9153, tcp, "kube-system", "kube-dns", "metrics", "KUBE-SVC-JD5MR3NA4I4DYORP"),
		svc("10.96.0.51", 80, tcp, "lab", "local-only", "http", "KUBE-SVL-T4KSMH6CJWHYYXER"),
		svc("10.96.0.1", 443, tcp, "default", "kubernetes", "https", "KUBE-SVC-NPX46M4PTMTKRN6Y"),
		svc("10.96.0.10", 53, udp, "kube-system", "kube-dns", "dns", "KUBE-SVC-TCOU7JCQXEZGVUNU"),
		svc("10.96.0.52", 80, tcp, "lab", "web-nodeport", "http", "KUBE-SVC-FEK7IJ3KIWHUKSBD"),
		svc("10.96.0.54", 80, tcp, "lab", "zonal", "http", "KUBE-SVC-GXJRQM6XY2BK2OSB"),
		svc("10.96.0.50", 80, tcp, "lab", "backend", "http", "KUBE-SVC-ZKJWP2ZV4NN5G7EZ"),
	}
	if !slices.Equal(pt.Services, wantServices) {
		t.Errorf("services\n%+v\nwant\n%+v", pt.Services, wantServices)
	}
}

// The descriptions an operator sees in the INVALID-drop path.
func TestDecodeFilterDescriptions(t *testing.T) {
	tests := []struct {
		blob string
		ipv6 bool
		want []string
	}{
		{"testdata/kube-proxy.filter.blob", false, []string{
			"iptables-legacy filter FORWARD",
			`FORWARD rule 2: -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD`,
			`KUBE-FORWARD rule 1: -m conntrack --ctstate INVALID -m nfacct --nfacct-name ct_state_invalid_dropped_pkts -j DROP`,
		}},
		{"testdata/filter-drop-behind-jump.filter.blob", false, []string{
			"iptables-legacy filter FORWARD",
			`FORWARD rule 2: -m comment --comment "node guard: pod traffic" -j NODE-GUARD`,
			`NODE-GUARD rule 1: -i cni0 -g NODE-GUARD-CT`,
			`NODE-GUARD-CT rule 2: -m state --state INVALID -j DROP`,
		}},
		{"testdata/filter-invalid-jump.filter.blob", false, []string{
			"iptables-legacy filter FORWARD",
			`FORWARD rule 1: -m conntrack --ctstate INVALID,UNTRACKED -j CT-DROP`,
			`CT-DROP rule 1: -m comment --comment "counted \"invalid\" drops" -j DROP`,
		}},
		{"testdata/filter-cycle-drop.filter.blob", false, []string{
			"iptables-legacy filter FORWARD",
			`FORWARD rule 1: -j LOOP-A`,
			`LOOP-A rule 1: -j LOOP-B`,
			`LOOP-B rule 2: -s 10.0.0.0/8 -m conntrack --ctstate INVALID -j DROP`,
		}},
		{"testdata/v4-odd.filter.blob", false, []string{
			"iptables-legacy filter FORWARD",
			`FORWARD rule 1: -i veth+ -g PODS`,
			`PODS rule 1: -m state --state INVALID -j DROP`,
		}},
		{"testdata/v6-kube-proxy.filter.blob", true, []string{
			"ip6tables-legacy filter FORWARD",
			`FORWARD rule 1: -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD`,
			`KUBE-FORWARD rule 1: -i cni0 -m conntrack --ctstate INVALID -m nfacct --nfacct-name ct_state_invalid_dropped_pkts -j DROP`,
		}},
	}
	for _, tt := range tests {
		info, blob := loadBlob(t, tt.blob, tt.ipv6)
		g, err := decodeFilter(info, blob)
		if err != nil {
			t.Fatalf("%s: %v", tt.blob, err)
		}
		if got := g.InvalidDropPath(); !slices.Equal(got, tt.want) {
			t.Errorf("%s:\ngot  %q\nwant %q", tt.blob, got, tt.want)
		}
	}
}

// Every rule of the odd filter table, as described: addresses with a non-contiguous mask,
// queues, a rule without target, rate limits.
func TestDecodeFilterAllRules(t *testing.T) {
	info, blob := loadBlob(t, "testdata/v4-odd.filter.blob", false)
	g, err := decodeFilter(info, blob)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, name := range []string{"FORWARD", "GUARD", "PODS"} {
		for _, r := range g.Chains[name].Rules {
			got = append(got, r.Desc)
		}
	}
	want := []string{
		"FORWARD rule 1: -i veth+ -g PODS",
		"FORWARD rule 2: -p tcp -j NFQUEUE",
		"FORWARD rule 3: -j QUEUE",
		"FORWARD rule 4:",
		"FORWARD rule 5: -m limit -j LOG",
		"FORWARD rule 6: -j GUARD",
		"GUARD rule 1: -s 192.168.0.0/255.255.0.255 -j RETURN",
		"GUARD rule 2: -m conntrack --ctstate INVALID,NEW,UNTRACKED -m limit -j DROP",
		"PODS rule 1: -m state --state INVALID -j DROP",
	}
	if !slices.Equal(got, want) {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	wantKinds := map[string][]ruleset.Rule{
		"FORWARD": {
			{Conditional: true, Verdict: ruleset.Verdict{Kind: ruleset.Goto, Target: "PODS"}},
			{Conditional: true},
			{},
			{},
			{},
			{Verdict: ruleset.Verdict{Kind: ruleset.Jump, Target: "GUARD"}},
		},
		"GUARD": {
			{Conditional: true, Verdict: ruleset.Verdict{Kind: ruleset.Return}},
			{Ct: ruleset.CtInvalid, Verdict: ruleset.Verdict{Kind: ruleset.Drop}},
		},
	}
	for name, want := range wantKinds {
		rules := g.Chains[name].Rules
		for i := range rules {
			r := rules[i]
			r.Desc = ""
			if i >= len(want) || r.Ct != want[i].Ct || r.Conditional != want[i].Conditional || r.Verdict != want[i].Verdict {
				t.Errorf("%s rule %d: %+v", name, i+1, r)
			}
		}
	}
}

// The decoded table is held until the next read, and while the next blob is mapped: its
// endpoint lists share one array, each list without spare capacity, so that appending to one
// (as no reader should) cannot reach into another's.
func TestDecodeEndpointListsExact(t *testing.T) {
	info, blob := loadBlob(t, "testdata/kube-proxy-v1.36.3.nat.blob", false)
	pt, _, err := decodeNAT(info, blob, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]netip.AddrPort{}
	for name, eps := range pt.Chains {
		if cap(eps) != len(eps) {
			t.Errorf("%s: %d endpoints with capacity %d", name, len(eps), cap(eps))
		}
		want[name] = slices.Clone(eps)
	}
	for name, eps := range pt.Chains {
		pt.Chains[name] = append(eps, netip.MustParseAddrPort("192.0.2.1:1"))
	}
	for name, eps := range pt.Chains {
		if !slices.Equal(eps[:len(eps)-1], want[name]) {
			t.Errorf("%s changed by appending to the other lists: %v, want %v", name, eps[:len(eps)-1], want[name])
		}
	}
}
