package rules

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/proxyhealth/proxyhealth/internal/cluster"
	"github.com/proxyhealth/proxyhealth/internal/hostrules"
	"github.com/proxyhealth/proxyhealth/internal/ruleset"
)

// diffBySets is what diffEndpoints computes, by sets.
func diffBySets(programmed, expected []netip.AddrPort, ipv6 bool) (stale, missing []netip.AddrPort) {
	for _, ep := range programmed {
		if !slices.Contains(expected, ep) && !slices.Contains(stale, ep) {
			stale = append(stale, ep)
		}
	}
	for _, ep := range expected {
		if ep.Addr().Is6() == ipv6 && !slices.Contains(programmed, ep) && !slices.Contains(missing, ep) {
			missing = append(missing, ep)
		}
	}
	return stale, missing
}

// diffEndpoints agrees with a comparison by sets whatever its lists: sorted without
// duplicates (merged), unsorted or repeated (scanned), long (hashed), both families mixed.
func TestDiffEndpointsBySets(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	endpoint := func() netip.AddrPort {
		if rng.IntN(4) == 0 {
			return netip.AddrPortFrom(netip.AddrFrom16([16]byte{0xfd, 15: byte(rng.IntN(8))}), uint16(80+rng.IntN(2)))
		}
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, 0, byte(rng.IntN(8))}), uint16(80+rng.IntN(2)))
	}
	list := func(max int) []netip.AddrPort {
		var eps []netip.AddrPort
		for range rng.IntN(max + 1) {
			eps = append(eps, endpoint())
		}
		if rng.IntN(2) == 0 {
			slices.SortFunc(eps, netip.AddrPort.Compare)
			eps = slices.Compact(eps)
		}
		return eps
	}
	sorted := 0
	for round := range 5000 {
		max := 12
		if round%10 == 0 {
			max = 60
		}
		programmed, expected, ipv6 := list(max), list(max), rng.IntN(2) == 0
		if strictlySorted(programmed) && strictlySorted(expected) {
			sorted++
		}
		stale, missing := diffEndpoints(programmed, expected, ipv6)
		wantStale, wantMissing := diffBySets(programmed, expected, ipv6)
		for _, l := range []*[]netip.AddrPort{&stale, &missing, &wantStale, &wantMissing} {
			slices.SortFunc(*l, netip.AddrPort.Compare)
		}
		if !slices.Equal(stale, wantStale) || !slices.Equal(missing, wantMissing) {
			t.Fatalf("diffEndpoints(%v, %v, ipv6 %v) = %v, %v; want %v, %v", programmed, expected, ipv6, stale, missing, wantStale, wantMissing)
		}
	}
	if sorted < 1000 {
		t.Fatalf("only %d of 5000 rounds merged sorted lists", sorted)
	}
}

// An engine that remembers its ports from check to check counts what one that starts afresh
// counts, while Services come and go between checks, change families, the rules follow the
// API or not, a port is listed twice, and a list is cut shorter in place of a new one; and it
// forgets the ports that are gone.
func TestDriftEngineAcrossChangingViews(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	const services = 60
	name := func(s int) cluster.ServicePortName {
		return cluster.ServicePortName{Namespace: fmt.Sprintf("ns%d", s%3), Name: fmt.Sprintf("svc%d", s), Port: "p", Protocol: "TCP"}
	}
	endpoints := func(s int, ipv6 bool) []netip.AddrPort {
		var eps []netip.AddrPort
		for e := range rng.IntN(6) {
			a := netip.AddrFrom4([4]byte{10, 1, byte(s), byte(e)})
			if ipv6 {
				a = netip.AddrFrom16([16]byte{0xfd, 14: byte(s), 15: byte(e)})
			}
			eps = append(eps, netip.AddrPortFrom(a, 80))
		}
		return eps
	}
	var views [services]*cluster.ServicePort
	rules := [2]map[string][]netip.AddrPort{{}, {}}
	changeView := func(s int) {
		sp := &cluster.ServicePort{Name: name(s), Port: 80, ClusterEndpoints: endpoints(s, false)}
		switch rng.IntN(6) {
		case 0:
			sp.ClusterIPs = []netip.Addr{netip.MustParseAddr("fd00::1")}
			sp.ClusterEndpoints = endpoints(s, true)
		case 1:
			sp.ClusterIPs = []netip.Addr{netip.MustParseAddr("10.96.0.1"), netip.MustParseAddr("fd00::1")}
			sp.ClusterEndpoints = append(sp.ClusterEndpoints, endpoints(s, true)...)
		default:
			sp.ClusterIPs = []netip.Addr{netip.MustParseAddr("10.96.0.1")}
		}
		switch rng.IntN(3) {
		case 0: // externalTrafficPolicy: Local
			sp.LocalEndpoints = sp.ClusterEndpoints[:len(sp.ClusterEndpoints)/2]
		case 1: // internalTrafficPolicy: Local: no cluster chain
			sp.ClusterEndpoints, sp.LocalEndpoints = nil, sp.ClusterEndpoints
		}
		views[s] = sp
	}
	// follow programs the view of service s as kube-proxy would, in new lists.
	follow := func(s int) {
		sp := views[s]
		cl, lo := chainsFor(sp.Name, false)
		for fam := range rules {
			ipv6 := fam == 1
			delete(rules[fam], cl)
			delete(rules[fam], lo)
			if !hasFamily(sp.ClusterIPs, ipv6) {
				continue
			}
			for chain, eps := range map[string][]netip.AddrPort{cl: sp.ClusterEndpoints, lo: sp.LocalEndpoints} {
				var own []netip.AddrPort
				for _, ep := range eps {
					if ep.Addr().Is6() == ipv6 {
						own = append(own, ep)
					}
				}
				if len(own) > 0 {
					rules[fam][chain] = own
				}
			}
		}
	}
	for s := range services {
		changeView(s)
		follow(s)
	}
	kept := newDriftEngine(0)
	for round := range 300 {
		for range 6 {
			s := rng.IntN(services)
			switch rng.IntN(4) {
			case 0: // the API moves, kube-proxy does not
				changeView(s)
			case 1: // the API moves, kube-proxy follows
				changeView(s)
				follow(s)
			case 2: // the same local endpoints' array, cut to another length
				sp := *views[s]
				sp.LocalEndpoints = sp.LocalEndpoints[:rng.IntN(cap(sp.LocalEndpoints)+1)]
				views[s] = &sp
			case 3: // the rules move alone
				cl, lo := chainsFor(name(s), false)
				fam := rng.IntN(2)
				rules[fam][cl] = endpoints(s, fam == 1)
				if rng.IntN(2) == 0 {
					delete(rules[fam], lo)
				}
			}
		}
		// The view: most service ports, in order, one sometimes twice.
		snap := snapshot()
		for s := range services {
			if rng.IntN(5) == 0 {
				continue
			}
			snap.Ports = append(snap.Ports, views[s])
			if rng.IntN(30) == 0 {
				snap.Ports = append(snap.Ports, views[s])
			}
		}
		byFamily := map[bool]programmedRules{false: byChains{fakeProgrammed{rules[0]}}, true: byChains{fakeProgrammed{rules[1]}}}
		if round%7 == 0 {
			delete(byFamily, true)
		}
		now := time.Unix(int64(1000+round), 0)
		got, want := kept.check(snap, byFamily, now), newDriftEngine(0).check(snap, byFamily, now)
		if got.checked != want.checked || got.orphans != want.orphans || len(got.drifting) != len(want.drifting) {
			t.Fatalf("round %d: checked %d, orphans %d, %d drifting; afresh %d, %d, %d",
				round, got.checked, got.orphans, len(got.drifting), want.checked, want.orphans, len(want.drifting))
		}
		for i, d := range got.drifting {
			w := want.drifting[i]
			if d.name != w.name || d.stale != w.stale || d.missing != w.missing || d.programmed != w.programmed || d.expected != w.expected ||
				!slices.Equal(d.staleAddrs, w.staleAddrs) || !slices.Equal(d.missingAddrs, w.missingAddrs) {
				t.Fatalf("round %d: %+v, afresh %+v", round, d, w)
			}
		}
		// Orphans are the chains no compared port names, in any family.
		compared := map[cluster.ServicePortName]bool{}
		accounted := map[string]bool{}
		for _, sp := range snap.Ports {
			for ipv6, r := range byFamily {
				if r != nil && hasFamily(sp.ClusterIPs, ipv6) {
					compared[sp.Name] = true
					cl, lo := chainsFor(sp.Name, false)
					accounted[cl], accounted[lo] = true, true
				}
			}
		}
		orphans := 0
		for ipv6 := range byFamily {
			for c := range rules[familyIndex(ipv6)] {
				if !accounted[c] {
					orphans++
				}
			}
		}
		if got.orphans != orphans {
			t.Fatalf("round %d: %d orphans, want %d", round, got.orphans, orphans)
		}
		if len(kept.ports.byName) != len(compared) || len(kept.ports.order) != len(compared) {
			t.Fatalf("round %d: %d ports remembered (%d in order), want the %d compared", round, len(kept.ports.byName), len(kept.ports.order), len(compared))
		}
		for n, st := range kept.ports.byName {
			if st.name != n || kept.ports.order[st.index] != st {
				t.Fatalf("round %d: the state of %s is misplaced", round, n)
			}
		}
	}
}

// The chain names a port's state remembers follow the rules' mode: kube-proxy moved from
// iptables to nftables mode between two checks.
func TestDriftEngineFollowsModeChange(t *testing.T) {
	snap := snapshot(dnsPort("10.244.1.5:53", "10.244.2.6:53"), kubernetesPort())
	e := newDriftEngine(0)
	for i, nftables := range []bool{false, true, false} {
		chains := map[string][]netip.AddrPort{}
		for _, sp := range snap.Ports {
			cl, _ := chainsFor(sp.Name, nftables)
			chains[cl] = sp.ClusterEndpoints
		}
		rules := map[bool]programmedRules{false: byChains{programmed{table: &ruleset.ProxyTable{Chains: chains}, nft: nftables}}}
		res := e.check(snap, rules, time.Unix(int64(100+i), 0))
		if res.checked != 2 || len(res.drifting) != 0 || res.orphans != 0 {
			t.Errorf("check %d (nftables %v): checked %d, drifting %+v, orphans %d; want 2, none, 0", i, nftables, res.checked, res.drifting, res.orphans)
		}
	}
}

// After a followed table's change a check compares again only the ports whose chains the table
// says changed (and those whose API entry did); after a table that cannot tell, every port.
func TestCheckComparesOnlyTheChangedChains(t *testing.T) {
	snap, chains := churnCluster(3, 2)
	e := newDriftEngine(0)
	check := func(pt *ruleset.ProxyTable, at int64) []cluster.ServicePortName {
		t.Helper()
		st := &hostrules.State{Seq: 1, Mode: hostrules.ModeIPTables, Proxy: map[bool]*ruleset.ProxyTable{false: pt}}
		res := e.check(snap, programmedByFamily(st), time.Unix(at, 0))
		var names []cluster.ServicePortName
		for _, d := range res.drifting {
			names = append(names, d.name)
		}
		return names
	}
	if got := check(&ruleset.ProxyTable{ID: 101, Chains: chains}, 1); len(got) != 0 {
		t.Fatalf("rules as the API says: drifting %v", got)
	}
	// Both a's and b's chains lost an endpoint, but the table says only a's changed: b is
	// not compared again.
	a, b := snap.Ports[0], snap.Ports[1]
	next := maps.Clone(chains)
	next[clusterChain(a.Name)] = a.ClusterEndpoints[1:]
	next[clusterChain(b.Name)] = b.ClusterEndpoints[1:]
	followed := &ruleset.ProxyTable{ID: 102, Chains: next, Deltas: []ruleset.Delta{{Since: 101, Changed: map[string]struct{}{clusterChain(a.Name): {}}}}}
	if got := check(followed, 2); !slices.Equal(got, []cluster.ServicePortName{a.Name}) {
		t.Errorf("after a followed change of a's chain: drifting %v, want %v", got, a.Name)
	}
	// A table that tells nothing of what changed: every port is compared.
	if got := check(&ruleset.ProxyTable{Chains: next}, 3); len(got) != 2 {
		t.Errorf("after a whole read: drifting %v, want %v and %v", got, a.Name, b.Name)
	}
}
