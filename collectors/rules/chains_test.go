package rules

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/proxyhealth/proxyhealth/internal/cluster"
	"github.com/proxyhealth/proxyhealth/internal/hostrules"
)

// webNodePort is a NodePort service port with externalTrafficPolicy: Local on a node that runs
// two of its three endpoints: its cluster chain takes all three, its local chain (external
// traffic) this node's two.
func webNodePort() *cluster.ServicePort {
	return &cluster.ServicePort{
		Name:             cluster.ServicePortName{Namespace: "lab", Name: "web-nodeport", Port: "http", Protocol: "TCP"},
		ClusterIPs:       []netip.Addr{netip.MustParseAddr("10.96.0.52")},
		Port:             80,
		ExternalLocal:    true,
		ClusterEndpoints: aps("10.244.1.3:8080", "10.244.1.4:8080", "10.244.3.50:8080"),
		LocalEndpoints:   aps("10.244.1.3:8080", "10.244.1.4:8080"),
	}
}

// checkChains runs one check, past the grace period, of sp against its cluster and local
// chains holding clusterEps and localEps (nil: the rules have no such chain), named in the
// iptables or nftables mode's way.
func checkChains(t *testing.T, sp *cluster.ServicePort, mode string, clusterEps, localEps []netip.AddrPort) checkResult {
	t.Helper()
	clusterChain, localChain := chainsFor(sp.Name, mode == hostrules.ModeNFTables)
	chains := map[string][]netip.AddrPort{}
	if clusterEps != nil {
		chains[clusterChain] = clusterEps
	}
	if localEps != nil {
		chains[localChain] = localEps
	}
	e := newDriftEngine(time.Minute)
	rules := programmedByFamily(stateOf(mode, chains))
	if res := e.check(snapshot(sp), rules, time.Unix(1000, 0)); len(res.drifting) != 0 {
		t.Fatalf("inside the grace period: %+v", res.drifting)
	}
	res := e.check(snapshot(sp), rules, time.Unix(1061, 0))
	if res.checked != 1 || res.orphans != 0 {
		t.Errorf("checked %d, orphans %d; want 1 and 0", res.checked, res.orphans)
	}
	return res
}

// A local endpoint's jump removed from the local chain only, as a failed or partial restore
// leaves it: external traffic to the node can no longer reach it, though the cluster chain
// still holds it. It is missing, once, from the local chain.
func TestDriftEndpointMissingFromTheLocalChainOnly(t *testing.T) {
	for _, mode := range []string{hostrules.ModeIPTables, hostrules.ModeNFTables} {
		sp := webNodePort()
		for _, tc := range []struct {
			name     string
			localEps []netip.AddrPort // nil: the local chain is gone
			missing  []netip.AddrPort
		}{
			{"one jump removed", aps("10.244.1.4:8080"), aps("10.244.1.3:8080")},
			{"the chain gone", nil, aps("10.244.1.3:8080", "10.244.1.4:8080")},
		} {
			res := checkChains(t, sp, mode, slices.Clone(sp.ClusterEndpoints), tc.localEps)
			if len(res.drifting) != 1 {
				t.Fatalf("%s, %s: drifting %+v, want web-nodeport", mode, tc.name, res.drifting)
			}
			d := res.drifting[0]
			wantFrom := slices.Repeat([]Chains{LocalChain}, len(tc.missing))
			if d.stale != 0 || d.missing != len(tc.missing) || !slices.Equal(d.missingAddrs, tc.missing) || !slices.Equal(d.missingFrom, wantFrom) ||
				d.programmed != 3 || d.expected != 3 || d.port != 80 {
				t.Errorf("%s, %s: %+v, want %v missing from the local chain, 3 programmed, 3 expected", mode, tc.name, d, tc.missing)
			}
		}
	}
}

// An endpoint missing from both chains that should hold it counts once, from both.
func TestDriftEndpointMissingFromBothChainsCountsOnce(t *testing.T) {
	for _, mode := range []string{hostrules.ModeIPTables, hostrules.ModeNFTables} {
		res := checkChains(t, webNodePort(), mode, aps("10.244.1.4:8080", "10.244.3.50:8080"), aps("10.244.1.4:8080"))
		if len(res.drifting) != 1 {
			t.Fatalf("%s: drifting %+v", mode, res.drifting)
		}
		d := res.drifting[0]
		if d.missing != 1 || d.stale != 0 || !slices.Equal(d.missingAddrs, aps("10.244.1.3:8080")) ||
			!slices.Equal(d.missingFrom, []Chains{ClusterChain | LocalChain}) || d.programmed != 2 || d.expected != 3 {
			t.Errorf("%s: %+v, want 10.244.1.3 missing once, from both chains", mode, d)
		}
	}
}

// A chain holding an endpoint it should not, though the port's other chain should: the
// remote endpoint in the local chain takes external traffic off the node that policy keeps
// on it. It is stale, once, in the local chain; and the other way round, a local endpoint
// the API took out of the cluster list only (terminating, with ready ones elsewhere) is stale
// in the cluster chain.
func TestDriftEndpointStaleInOneChain(t *testing.T) {
	for _, mode := range []string{hostrules.ModeIPTables, hostrules.ModeNFTables} {
		sp := webNodePort()
		res := checkChains(t, sp, mode, slices.Clone(sp.ClusterEndpoints), aps("10.244.1.3:8080", "10.244.1.4:8080", "10.244.3.50:8080"))
		if len(res.drifting) != 1 {
			t.Fatalf("%s: drifting %+v", mode, res.drifting)
		}
		d := res.drifting[0]
		if d.stale != 1 || d.missing != 0 || !slices.Equal(d.staleAddrs, aps("10.244.3.50:8080")) || !slices.Equal(d.staleIn, []Chains{LocalChain}) ||
			d.programmed != 3 || d.expected != 3 {
			t.Errorf("%s: %+v, want 10.244.3.50 stale in the local chain", mode, d)
		}

		sp.ClusterEndpoints = aps("10.244.1.4:8080", "10.244.3.50:8080")
		res = checkChains(t, sp, mode, aps("10.244.1.3:8080", "10.244.1.4:8080", "10.244.3.50:8080"), aps("10.244.1.3:8080", "10.244.1.4:8080"))
		if len(res.drifting) != 1 {
			t.Fatalf("%s: drifting %+v", mode, res.drifting)
		}
		d = res.drifting[0]
		if d.stale != 1 || d.missing != 0 || !slices.Equal(d.staleAddrs, aps("10.244.1.3:8080")) || !slices.Equal(d.staleIn, []Chains{ClusterChain}) {
			t.Errorf("%s: %+v, want 10.244.1.3 stale in the cluster chain", mode, d)
		}
	}
}

// An endpoint that moved between chains in the rules but not in the API is stale in one and
// missing from the other: one of each.
func TestDriftEndpointInTheWrongChain(t *testing.T) {
	sp := &cluster.ServicePort{
		Name:           cluster.ServicePortName{Namespace: "lab", Name: "local-only", Port: "http", Protocol: "TCP"},
		ClusterIPs:     []netip.Addr{netip.MustParseAddr("10.96.0.51")},
		Port:           80,
		InternalLocal:  true,
		LocalEndpoints: aps("10.244.1.3:8080"),
	}
	res := checkChains(t, sp, hostrules.ModeIPTables, aps("10.244.1.3:8080"), nil)
	if len(res.drifting) != 1 {
		t.Fatalf("drifting %+v", res.drifting)
	}
	d := res.drifting[0]
	if d.stale != 1 || d.missing != 1 || !slices.Equal(d.staleIn, []Chains{ClusterChain}) || !slices.Equal(d.missingFrom, []Chains{LocalChain}) ||
		d.programmed != 1 || d.expected != 1 {
		t.Errorf("%+v, want 10.244.1.3 stale in the cluster chain and missing from the local chain", d)
	}
}

// Chains kube-proxy does not write are not drift: no local chain without a Local policy, no
// cluster chain for an internalTrafficPolicy: Local port nothing else reaches, neither for a
// port without endpoints.
func TestDriftAbsentChainsThatShouldBe(t *testing.T) {
	local := &cluster.ServicePort{
		Name:           cluster.ServicePortName{Namespace: "lab", Name: "local-only", Port: "http", Protocol: "TCP"},
		ClusterIPs:     []netip.Addr{netip.MustParseAddr("10.96.0.51")},
		Port:           80,
		InternalLocal:  true,
		LocalEndpoints: aps("10.244.1.3:8080", "10.244.1.4:8080"),
	}
	empty := &cluster.ServicePort{Name: cluster.ServicePortName{Namespace: "lab", Name: "empty", Protocol: "TCP"},
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.53")}, Port: 80}
	for _, mode := range []string{hostrules.ModeIPTables, hostrules.ModeNFTables} {
		if res := checkChains(t, dnsPort("10.244.1.5:53"), mode, aps("10.244.1.5:53"), nil); len(res.drifting) != 0 {
			t.Errorf("%s, no local chain: drifting %+v", mode, res.drifting)
		}
		if res := checkChains(t, local, mode, nil, slices.Clone(local.LocalEndpoints)); len(res.drifting) != 0 {
			t.Errorf("%s, no cluster chain: drifting %+v", mode, res.drifting)
		}
		if res := checkChains(t, empty, mode, nil, nil); len(res.drifting) != 0 {
			t.Errorf("%s, no chain: drifting %+v", mode, res.drifting)
		}
	}
}

// A difference is followed per chain: one that leaves a chain for the other starts its grace
// period anew.
func TestDriftAgesEachChainsDifference(t *testing.T) {
	sp := webNodePort()
	clusterChain, localChain := chainsFor(sp.Name, false)
	e := newDriftEngine(time.Minute)
	at := func(s int64, clusterEps, localEps []netip.AddrPort) checkResult {
		return e.check(snapshot(sp), programmedByFamily(stateOf(hostrules.ModeIPTables,
			map[string][]netip.AddrPort{clusterChain: clusterEps, localChain: localEps})), time.Unix(s, 0))
	}
	all, local := sp.ClusterEndpoints, sp.LocalEndpoints
	without := func(eps []netip.AddrPort) []netip.AddrPort {
		return slices.DeleteFunc(slices.Clone(eps), func(ep netip.AddrPort) bool { return ep == ap("10.244.1.3:8080") })
	}
	at(1000, all, without(local)) // missing from the local chain from 1000
	if res := at(1040, without(all), local); len(res.drifting) != 0 {
		t.Errorf("at 1040: %+v", res.drifting)
	}
	if res := at(1080, without(all), local); len(res.drifting) != 0 {
		t.Errorf("at 1080, missing from the cluster chain for 40 s only: %+v", res.drifting)
	}
	if res := at(1101, without(all), local); len(res.drifting) != 1 || res.drifting[0].missing != 1 || !res.drifting[0].since.Equal(time.Unix(1040, 0)) {
		t.Errorf("at 1101: %+v, want 1 missing since 1040", res.drifting)
	}
}
