package kpcapture

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/proxyhealth/proxyhealth/internal/ruleset"
)

func TestCompare(t *testing.T) {
	want := &FamilyExpected{
		Chains: map[string][]string{"KUBE-SVC-A": {"10.244.1.2:80", "10.244.1.3:80"}, "KUBE-SVL-B": {"[fd00::1]:80"}},
		Services: []Service{
			{ClusterIP: "10.96.0.1", Port: 80, Protocol: "tcp", Chains: []string{"KUBE-SVC-A", "KUBE-SVL-A"}},
			{ClusterIP: "fd00:96::2", Port: 80, Protocol: "tcp", Chains: []string{"KUBE-SVC-B", "KUBE-SVL-B"}},
		},
	}
	ap := netip.MustParseAddrPort
	good := func() *ruleset.ProxyTable {
		return &ruleset.ProxyTable{
			Chains: map[string][]netip.AddrPort{"KUBE-SVC-A": {ap("10.244.1.2:80"), ap("10.244.1.3:80")}, "KUBE-SVL-B": {ap("[fd00::1]:80")}},
			Services: []ruleset.Service{
				{ClusterIP: netip.MustParseAddr("10.96.0.1"), Port: 80, Protocol: ruleset.ProtoTCP, Chain: "KUBE-SVC-A"},
				{ClusterIP: netip.MustParseAddr("fd00:96::2"), Port: 80, Protocol: ruleset.ProtoTCP, Chain: "KUBE-SVL-B"},
			},
		}
	}
	if d := want.Compare(good()); d != "" {
		t.Errorf("the same table differs:\n%s", d)
	}
	for what, c := range map[string]struct {
		change func(pt *ruleset.ProxyTable)
		want   string
	}{
		"endpoint gone": {func(pt *ruleset.ProxyTable) { pt.Chains["KUBE-SVC-A"] = pt.Chains["KUBE-SVC-A"][:1] }, "chain KUBE-SVC-A: [10.244.1.2:80], want"},
		"chain missing": {func(pt *ruleset.ProxyTable) { delete(pt.Chains, "KUBE-SVL-B") }, "chain KUBE-SVL-B missing"},
		"extra chain":   {func(pt *ruleset.ProxyTable) { pt.Chains["KUBE-SVC-C"] = nil }, "chain KUBE-SVC-C not expected"},
		"wrong chain":   {func(pt *ruleset.ProxyTable) { pt.Services[0].Chain = "KUBE-SVC-C" }, "10.96.0.1:80/tcp dispatched to KUBE-SVC-C"},
		"no dispatch":   {func(pt *ruleset.ProxyTable) { pt.Services[1].Protocol = ruleset.ProtoUDP }, "fd00:96::2:80/tcp not dispatched"},
	} {
		pt := good()
		c.change(pt)
		if d := want.Compare(pt); !strings.Contains(d, c.want) {
			t.Errorf("%s: %q, want it to say %q", what, d, c.want)
		}
	}
	if d := want.Compare(nil); d == "" {
		t.Error("no table: no difference")
	}
}

// The captures kept in the repository are listed and each one's expectation reads back.
func TestCaptures(t *testing.T) {
	cs, err := Captures("../..")
	if err != nil {
		t.Fatal(err)
	}
	modes := map[string]int{}
	for _, c := range cs {
		e, err := c.Load()
		if err != nil {
			t.Fatal(err)
		}
		if len(e.Families["ipv4"].Chains) == 0 || len(e.Families["ipv6"].Chains) == 0 {
			t.Errorf("%s %s: a family without chains: %+v", c.Version, c.Mode, e.Families)
		}
		modes[c.Mode]++
	}
	for _, m := range Modes {
		if modes[m] == 0 {
			t.Errorf("no capture of mode %s", m)
		}
	}
}
