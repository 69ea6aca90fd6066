package rules

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/proxyhealth/proxyhealth/internal/cluster"
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
// counts, while Services come and go between checks, change families, and a port is listed
// twice; and it forgets the ports that are gone.
func TestDriftEngineAcrossChangingViews(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	name := func(s int) cluster.ServicePortName {
		return cluster.ServicePortName{Namespace: fmt.Sprintf("ns%d", s%3), Name: fmt.Sprintf("svc%d", s), Port: "p", Protocol: "TCP"}
	}
	endpoints := func(s int, ipv6 bool) []netip.AddrPort {
		var eps []netip.AddrPort
		for e := range rng.IntN(4) {
			a := netip.AddrFrom4([4]byte{10, 1, byte(s), byte(e)})
			if ipv6 {
				a = netip.AddrFrom16([16]byte{0xfd, 14: byte(s), 15: byte(e)})
			}
			eps = append(eps, netip.AddrPortFrom(a, 80))
		}
		return eps
	}
	// The rules: chains of service ports 0..59, some of them changed at random each round.
	rules := [2]map[string][]netip.AddrPort{{}, {}}
	kept := newDriftEngine(0)
	for round := range 200 {
		for range 10 {
			s, ipv6 := rng.IntN(60), rng.IntN(3) == 0
			cl, lo := chainsFor(name(s), false)
			fam := familyIndex(ipv6)
			rules[fam][cl] = endpoints(s, ipv6)
			switch rng.IntN(3) {
			case 0:
				rules[fam][lo] = endpoints(s, ipv6)
			case 1:
				delete(rules[fam], lo)
			}
			if rng.IntN(8) == 0 {
				delete(rules[fam], cl)
			}
		}
		// The view: a random selection of the service ports, in order, one sometimes twice.
		snap := snapshot()
		for s := range 60 {
			if rng.IntN(5) == 0 {
				continue
			}
			sp := cluster.ServicePort{Name: name(s), Port: 80, ClusterEndpoints: endpoints(s, false)}
			switch rng.IntN(6) {
			case 0:
				sp.ClusterIPs = []netip.Addr{netip.MustParseAddr("fd00::1")}
				sp.ClusterEndpoints = endpoints(s, true)
			case 1:
				sp.ClusterIPs = []netip.Addr{netip.MustParseAddr("10.96.0.1"), netip.MustParseAddr("fd00::1")}
				sp.ClusterEndpoints = append(sp.ClusterEndpoints, endpoints(s, true)...)
				sp.LocalEndpoints = sp.ClusterEndpoints[:len(sp.ClusterEndpoints)/2]
			default:
				sp.ClusterIPs = []netip.Addr{netip.MustParseAddr("10.96.0.1")}
			}
			snap.Ports = append(snap.Ports, sp)
			if rng.IntN(30) == 0 {
				snap.Ports = append(snap.Ports, sp)
			}
		}
		byFamily := map[bool]programmedRules{false: fakeProgrammed{rules[0]}, true: fakeProgrammed{rules[1]}}
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
