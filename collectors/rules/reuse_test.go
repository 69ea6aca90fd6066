package rules

import (
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/proxyhealth/proxyhealth/internal/ruleset"
)

// A check reuses what the previous one found of a port whose API entry and rules are the same
// objects again, and compares again a port whose entry or rules are new.
func TestDriftReusesUnchangedPorts(t *testing.T) {
	programmedEPs := loadRules(t, "kube-proxy-nat.txt").chains
	dnsChain, _ := chainsFor(dns, false)
	table := &ruleset.ProxyTable{Chains: maps.Clone(programmedEPs)}
	rules := map[bool]programmedRules{false: byChains{programmed{table: table}}}
	eps := []string{"10.244.1.5:53", "10.244.2.6:53", "10.244.3.7:53"} // as programmed
	if !slices.Equal(table.Chains[dnsChain], aps(eps...)) {
		t.Fatalf("%s is %v in the fixture, want %v", dnsChain, table.Chains[dnsChain], eps)
	}
	dnsEntry, k8s := dnsPort(eps...), kubernetesPort()
	e := newDriftEngine(0)
	t0 := time.Unix(2000, 0)
	first := e.check(snapshot(dnsEntry, k8s), rules, t0)
	fresh := newDriftEngine(0).check(snapshot(dnsEntry, k8s), rules, t0)
	if len(first.drifting) != 0 || first.checked != 2 || first.orphans != fresh.orphans {
		t.Fatalf("first check: %+v, want 2 checked, nothing drifting, %d orphans", first, fresh.orphans)
	}

	// Changed in place (a published ProxyTable never is): the same entry against the same
	// rules is not looked at again.
	table.Chains[dnsChain] = aps("10.244.9.9:53")
	if res := e.check(snapshot(dnsEntry, k8s), rules, t0.Add(time.Second)); len(res.drifting) != 0 || res.checked != 2 || res.orphans != first.orphans {
		t.Errorf("same entry, same rules: %+v, want the first check's findings reused", res)
	}

	// A new entry for the port, though equal: compared again, it finds the change. A port
	// with a difference is compared at every check: the difference stays.
	entry2 := dnsPort(eps...)
	for i := range 2 {
		if res := e.check(snapshot(entry2, k8s), rules, t0.Add(time.Duration(2+i)*time.Second)); len(res.drifting) != 1 || res.drifting[0].name != dns {
			t.Errorf("new entry, check %d: drifting %+v, want kube-dns", i+1, res.drifting)
		}
	}

	// New rules: compared again, against them.
	changed := &ruleset.ProxyTable{Chains: maps.Clone(programmedEPs)}
	changed.Chains[dnsChain] = aps("10.244.9.9:53")
	changedRules := map[bool]programmedRules{false: byChains{programmed{table: changed}}}
	if res := e.check(snapshot(dnsEntry, k8s), changedRules, t0.Add(4*time.Second)); len(res.drifting) != 1 {
		t.Errorf("new rules: drifting %+v, want kube-dns", res.drifting)
	}
	original := map[bool]programmedRules{false: byChains{programmed{table: &ruleset.ProxyTable{Chains: maps.Clone(programmedEPs)}}}}
	if res := e.check(snapshot(dnsEntry, k8s), original, t0.Add(5*time.Second)); len(res.drifting) != 0 || res.orphans != first.orphans {
		t.Errorf("rules as at first: %+v, want nothing drifting and %d orphans", res, first.orphans)
	}
}
