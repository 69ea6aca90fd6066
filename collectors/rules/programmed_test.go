package rules

import (
	"net/netip"
	"os"
	"slices"
	"testing"

	"github.com/proxyhealth/proxyhealth/internal/ruleset"
	"github.com/proxyhealth/proxyhealth/internal/testsupport/fixture"
)

const realNAT = "testdata/kube-proxy-v1.36.3/iptables-save-nat.txt"

func fixtureTable(t *testing.T) *ruleset.ProxyTable {
	t.Helper()
	f, err := os.Open(realNAT)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	table, err := fixture.IPTablesProxyTable(f)
	if err != nil {
		t.Fatal(err)
	}
	return table
}

// The fixture's reading of the real capture, which the exporter's golden scrape feeds through
// Config.Read, is the streaming reader's: the same chains (those with rules) and endpoints.
func TestFixtureTableIsTheReaders(t *testing.T) {
	want := loadRules(t, "kube-proxy-v1.36.3/iptables-save-nat.txt")
	got := fixtureTable(t)
	if len(got.Chains) < 8 || len(got.Services) < 8 {
		t.Fatalf("fixture read %d chains and %d services from the capture", len(got.Chains), len(got.Services))
	}
	for chain, eps := range want.chains {
		eps = slices.Clone(eps)
		slices.SortFunc(eps, netip.AddrPort.Compare)
		if g, ok := got.Chains[chain]; !slices.Equal(g, eps) || ok != (len(eps) > 0) {
			t.Errorf("%s: fixture %v (present %v), reader %v", chain, g, ok, eps)
		}
	}
	for chain := range got.Chains {
		if _, ok := want.chains[chain]; !ok {
			t.Errorf("%s: read by the fixture only", chain)
		}
	}
}

// Config.Read replaces the rules reading and nothing else: the same rules give the same check
// as when read from iptables-nft-save.
