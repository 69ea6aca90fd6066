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
	if got := ServiceEndpoints(snap, st, "kube-system", "absent"); got != nil {
		t.Errorf("absent service: %+v", got)
	}
	// Rules not read, or no kube-proxy rules: the API's side alone.
	got = ServiceEndpoints(snap, nil, "kube-system", "kube-dns")
	if len(got) != 1 || got[0].Programmed != nil || len(got[0].Expected) != 3 {
		t.Errorf("without rules %+v", got)
	}
}
