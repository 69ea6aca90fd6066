package nft

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"
)

// kube-proxy v1.36.3's nftables table (test/e2e: TestCaptureNFTablesFixtures): endpoints
// inline in a numgen map, or behind a numgen vmap of per-endpoint chains with a plain dnat.
func TestKubeProxyDNATTargets(t *testing.T) {
	tb := parseFile(t, "kube-proxy-v1.36.3.json").Table("ip", "kube-proxy")
	if tb == nil {
		t.Fatal("no table ip kube-proxy")
	}
	aps := func(ss ...string) []netip.AddrPort {
		var out []netip.AddrPort
		for _, s := range ss {
			out = append(out, netip.MustParseAddrPort(s))
		}
		return out
	}
	rules := func(chain string) []*Rule {
		t.Helper()
		c := tb.Chain(chain)
		if c == nil {
			t.Fatalf("no chain %s", chain)
		}
		return c.Rules
	}
	dns := rules("service-FY5PMXPG-kube-system/kube-dns/udp/dns")
	if got := dns[0].DNATTargets(); !reflect.DeepEqual(got, aps("10.244.1.3:53", "10.244.3.30:53")) {
		t.Errorf("kube-dns udp: %v", got)
	}
	// One element: the set still lists [key, value] pairs.
	if got := rules("service-2QRHZV4L-default/kubernetes/tcp/https")[0].DNATTargets(); !reflect.DeepEqual(got, aps("172.18.0.2:6443")) {
		t.Errorf("kubernetes: %v", got)
	}
	if got := rules("endpoint-2G6RHCPA-lab/sticky/tcp/http__10.244.3.70/8080")[1].DNATTargets(); !reflect.DeepEqual(got, aps("10.244.3.70:8080")) {
		t.Errorf("sticky endpoint chain: %v", got)
	}
	sticky := rules("service-Z3H4B3DO-lab/sticky/tcp/http")
	if len(sticky) != 4 {
		t.Fatalf("sticky: %d rules, want 3 affinity gotos and the vmap", len(sticky))
	}
	if got := sticky[0].JumpTargets(); !reflect.DeepEqual(got, []string{"endpoint-4M7KHNGR-lab/sticky/tcp/http__10.244.1.3/8080"}) {
		t.Errorf("affinity goto: %v", got)
	}
	want := []string{
		"endpoint-4M7KHNGR-lab/sticky/tcp/http__10.244.1.3/8080",
		"endpoint-2G6RHCPA-lab/sticky/tcp/http__10.244.3.70/8080",
		"endpoint-44CJKIEJ-lab/sticky/tcp/http__10.244.3.71/8080",
	}
	if got := sticky[3].JumpTargets(); !reflect.DeepEqual(got, want) {
		t.Errorf("numgen vmap: %v", got)
	}
	for _, r := range sticky {
		if got := r.DNATTargets(); got != nil {
			t.Errorf("%s: dnat targets %v, want none", r, got)
		}
	}
	// The services chain's vmap is a named map: no targets from it here.
	for _, r := range rules("services") {
		if got := r.JumpTargets(); got != nil {
			t.Errorf("%s: %v", r, got)
		}
	}
}

func TestDNATTargetsForms(t *testing.T) {
	rule := func(expr string) *Rule {
		t.Helper()
		rs, err := Parse(strings.NewReader(`{"nftables": [{"table": {"family": "ip6", "name": "t"}}, {"chain": {"family": "ip6", "table": "t", "name": "c"}},
			{"rule": {"family": "ip6", "table": "t", "chain": "c", "expr": [` + expr + `]}}]}`))
		if err != nil {
			t.Fatal(err)
		}
		return rs.Table("ip6", "t").Chain("c").Rules[0]
	}
	for _, c := range []struct {
		expr string
		want []netip.AddrPort
	}{
		{`{"dnat": {"family": "ip6", "addr": "fd00::3", "port": 8080}}`, []netip.AddrPort{netip.MustParseAddrPort("[fd00::3]:8080")}},
		{`{"dnat": {"addr": "::ffff:10.0.0.1", "port": 80}}`, []netip.AddrPort{netip.MustParseAddrPort("10.0.0.1:80")}},
		{`{"dnat": {"family": "ip6", "addr": {"map": {"key": {"numgen": {"mode": "random", "mod": 2, "offset": 0}}, "data": {"set": [[0, {"concat": ["fd00::1", 53]}], [1, {"concat": ["fd00::2", 53]}]]}}}}}`,
			[]netip.AddrPort{netip.MustParseAddrPort("[fd00::1]:53"), netip.MustParseAddrPort("[fd00::2]:53")}},
		{`{"dnat": {"addr": "10.0.0.1"}}`, nil},                                     // no port
		{`{"dnat": {"addr": "10.0.0.1", "port": 70000}}`, nil},                      // not a port
		{`{"dnat": {"addr": {"map": {"key": {"numgen": {}}, "data": "@m"}}}}`, nil}, // named map
		{`{"dnat": {"addr": {"range": ["10.0.0.1", "10.0.0.9"]}, "port": 80}}`, nil},
		{`{"snat": {"addr": "10.0.0.1", "port": 80}}`, nil},
	} {
		if got := rule(c.expr).DNATTargets(); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: %v, want %v", c.expr, got, c.want)
		}
	}
	if got := rule(`{"jump": {"target": "a"}}, {"vmap": {"key": {"numgen": {}}, "data": {"set": [[0, {"goto": {"target": "b"}}], [1, {"accept": null}]]}}}`).JumpTargets(); !reflect.DeepEqual(got, []string{"a", "b"}) {
		t.Errorf("jump targets: %v", got)
	}
}
