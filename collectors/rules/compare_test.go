package rules

import (
	"bytes"
	"net/netip"
	"os"
	"slices"
	"testing"

	"github.com/proxyhealth/proxyhealth/internal/hostrules"
)

func TestServiceEndpoints(t *testing.T) {
	nat, err := os.ReadFile("testdata/kube-proxy-nat.txt")
	if err != nil {
		t.Fatal(err)
	}
	read, _, err := readIPTablesNAT(bytes.NewReader(nat))
	if err != nil {
		t.Fatal(err)
	}
	st := stateOf(hostrules.ModeIPTables, read.chains)
	snap := snapshot(dnsPort("10.244.4.1:53", "10.244.1.5:53", "10.244.2.6:53", "10.244.1.5:53"), kubernetesPort())

	got := ServiceEndpoints(snap, st, "kube-system", "kube-dns")
	if len(got) != 1 {
		t.Fatalf("ports %+v", got)
	}
	p := got[0]
	if p.Name != dns || p.Port != 53 || !slices.Equal(p.ClusterIPs, []netip.Addr{netip.MustParseAddr("10.96.0.10")}) ||
		!slices.Equal(p.Expected, aps("10.244.1.5:53", "10.244.2.6:53", "10.244.4.1:53")) ||
		!slices.Equal(p.Programmed, aps("10.244.1.5:53", "10.244.2.6:53", "10.244.3.7:53")) ||
		!slices.Equal(p.Chains, []string{clusterChain(dns)}) {
		t.Errorf("kube-dns %+v", p)
	}
	if !slices.Equal(p.Stale, aps("10.244.3.7:53")) || !slices.Equal(p.Missing, aps("10.244.4.1:53")) || len(p.ByChain) != 1 ||
		p.ByChain[0].Chain != ClusterChain || p.ByChain[0].Name != clusterChain(dns) || !slices.Equal(p.ByChain[0].Programmed, p.Programmed) ||
		!slices.Equal(p.ByChain[0].Stale, p.Stale) || !slices.Equal(p.ByChain[0].Missing, p.Missing) {
		t.Errorf("kube-dns differences %v stale, %v missing, by chain %+v", p.Stale, p.Missing, p.ByChain)
	}
	if got := ServiceEndpoints(snap, st, "kube-system", "absent"); got != nil {
		t.Errorf("absent service: %+v", got)
	}
	// Rules not read, or no kube-proxy rules: the API's side alone.
	got = ServiceEndpoints(snap, nil, "kube-system", "kube-dns")
	if len(got) != 1 || got[0].Programmed != nil || len(got[0].Expected) != 3 || got[0].Stale != nil || got[0].Missing != nil ||
		len(got[0].ByChain) != 1 || got[0].ByChain[0].Name != "" || len(got[0].ByChain[0].Expected) != 3 {
		t.Errorf("without rules %+v", got)
	}
}

// Side by side, each chain is compared with what it should hold: a local endpoint's jump
// removed from the local chain only is missing, though the cluster chain holds it, and a
// remote endpoint in the local chain is stale, though the cluster chain should hold it.
func TestServiceEndpointsPerChain(t *testing.T) {
	for _, mode := range []string{hostrules.ModeIPTables, hostrules.ModeNFTables} {
		sp := webNodePort()
		clusterName, localName := chainsFor(sp.Name, mode == hostrules.ModeNFTables)
		st := stateOf(mode, map[string][]netip.AddrPort{
			clusterName: slices.Clone(sp.ClusterEndpoints),
			localName:   aps("10.244.1.4:8080", "10.244.3.50:8080"),
		})
		got := ServiceEndpoints(snapshot(sp, kubernetesPort()), st, "lab", "web-nodeport")
		if len(got) != 1 {
			t.Fatalf("%s: ports %+v", mode, got)
		}
		p := got[0]
		if !slices.Equal(p.Expected, sp.ClusterEndpoints) || !slices.Equal(p.Programmed, sp.ClusterEndpoints) ||
			!slices.Equal(p.Stale, aps("10.244.3.50:8080")) || !slices.Equal(p.Missing, aps("10.244.1.3:8080")) ||
			!slices.Equal(p.Chains, []string{clusterName, localName}) {
			t.Errorf("%s: %+v, want 10.244.3.50 stale and 10.244.1.3 missing", mode, p)
		}
		want := []ChainEndpoints{
			{Chain: ClusterChain, Name: clusterName, Expected: sp.ClusterEndpoints, Programmed: sp.ClusterEndpoints},
			{Chain: LocalChain, Name: localName, Expected: sp.LocalEndpoints, Programmed: aps("10.244.1.4:8080", "10.244.3.50:8080"),
				Stale: aps("10.244.3.50:8080"), Missing: aps("10.244.1.3:8080")},
		}
		if len(p.ByChain) != len(want) {
			t.Fatalf("%s: by chain %+v", mode, p.ByChain)
		}
		for i, w := range want {
			g := p.ByChain[i]
			if g.Chain != w.Chain || g.Name != w.Name || !slices.Equal(g.Expected, w.Expected) || !slices.Equal(g.Programmed, w.Programmed) ||
				!slices.Equal(g.Stale, w.Stale) || !slices.Equal(g.Missing, w.Missing) {
				t.Errorf("%s: %s chain %+v, want %+v", mode, w.Chain, g, w)
			}
		}

		// The local chain gone: its endpoints are missing from it, and it is listed, empty.
		delete(st.Proxy[false].Chains, localName)
		p = ServiceEndpoints(snapshot(sp), st, "lab", "web-nodeport")[0]
		if !slices.Equal(p.Missing, sp.LocalEndpoints) || len(p.Stale) != 0 || p.Stale == nil || len(p.ByChain) != 2 ||
			p.ByChain[1].Programmed != nil || !slices.Equal(p.ByChain[1].Missing, sp.LocalEndpoints) {
			t.Errorf("%s, no local chain: %+v", mode, p)
		}
	}
}
