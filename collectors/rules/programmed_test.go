package rules

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/promslog"

	"github.com/proxyhealth/proxyhealth/internal/fixture"
	"github.com/proxyhealth/proxyhealth/internal/ruleset"
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
func TestReadFromConfig(t *testing.T) {
	nat, err := os.ReadFile(realNAT)
	if err != nil {
		t.Fatal(err)
	}
	snap := apiSnapshot(t, "testdata/kube-proxy-v1.36.3/api-objects.json")
	for i := range snap.Ports {
		if snap.Ports[i].Name.Name == "backend" {
			snap.Ports[i].ClusterEndpoints = snap.Ports[i].ClusterEndpoints[1:] // one stale endpoint
		}
	}
	cfg := Config{View: fakeView{snap}, ProcPath: t.TempDir(), CheckInterval: time.Second, MaxSeries: 10, CommandTimeout: time.Second,
		Now: func() time.Time { return time.Unix(5000, 0) }}
	fromCommand, err := New(cfg, promslog.NewNopLogger())
	if err != nil {
		t.Fatal(err)
	}
	fromCommand.reader.ipvsActive = func() bool { return false }
	fromCommand.reader.generation = func() (uint32, error) { return 0, errors.New("no netlink here") }
	fromCommand.reader.lookPath = func(bin string) (string, error) { return "/usr/sbin/" + bin, nil }
	fromCommand.reader.run = func(_ context.Context, name string, _ ...string) ([]byte, error) {
		if strings.HasSuffix(name, "/iptables-nft-save") {
			return nat, nil
		}
		return nil, errors.New("exit status 1")
	}
	table := fixtureTable(t)
	cfg.Read = func(context.Context, bool) (Programmed, error) {
		return Programmed{Mode: "iptables", Source: "fixture", Tables: map[bool]*ruleset.ProxyTable{false: table}}, nil
	}
	fromConfig, err := New(cfg, promslog.NewNopLogger())
	if err != nil {
		t.Fatal(err)
	}
	fromCommand.check(context.Background())
	fromConfig.check(context.Background())
	a, b := fromCommand.last, fromConfig.last
	if a.err != nil || b.err != nil || a.mode != b.mode || a.checked != b.checked || a.orphans != b.orphans ||
		!slices.Equal(a.drifting, b.drifting) || len(a.drifting) != 1 {
		t.Errorf("from iptables-nft-save: %+v\nfrom Config.Read: %+v", a, b)
	}
}
