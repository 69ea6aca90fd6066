package rules

import (
	"bytes"
	"net/netip"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/common/promslog"

	"github.com/proxyhealth/proxyhealth/internal/hostrules"
)

func aps(ss ...string) []netip.AddrPort {
	out := make([]netip.AddrPort, 0, len(ss))
	for _, s := range ss {
		out = append(out, ap(s))
	}
	return out
}

// A drifting port keeps the addresses it counted, and how many endpoints each side had.
func TestDriftKeepsAddresses(t *testing.T) {
	rules := map[bool]programmedRules{false: byChains{loadRules(t, "kube-proxy-nat.txt")}}
	e := newDriftEngine(0)
	// Programmed: 10.244.1.5, 10.244.2.6, 10.244.3.7. The API dropped 10.244.3.7 and added two.
	snap := snapshot(dnsPort("10.244.1.5:53", "10.244.2.6:53", "10.244.4.2:53", "10.244.4.1:53"), kubernetesPort())
	res := e.check(snap, rules, time.Unix(2000, 0))
	if len(res.drifting) != 1 {
		t.Fatalf("drifting %+v, want kube-dns", res.drifting)
	}
	d := res.drifting[0]
	if !slices.Equal(d.staleAddrs, aps("10.244.3.7:53")) || !slices.Equal(d.missingAddrs, aps("10.244.4.1:53", "10.244.4.2:53")) {
		t.Errorf("stale %v missing %v, want [10.244.3.7:53] and [10.244.4.1:53 10.244.4.2:53] (sorted)", d.staleAddrs, d.missingAddrs)
	}
	if d.programmed != 3 || d.expected != 4 {
		t.Errorf("programmed %d expected %d, want 3 and 4", d.programmed, d.expected)
	}
}

// At most maxDriftAddresses addresses per kind are kept; the counts stay whole.
func TestDriftAddressesAreBounded(t *testing.T) {
	rules := map[bool]programmedRules{false: byChains{loadRules(t, "kube-proxy-nat.txt")}}
	e := newDriftEngine(0)
	eps := []string{"10.244.1.5:53", "10.244.2.6:53", "10.244.3.7:53"}
	for i := 30; i > 0; i-- { // in descending order: the kept ones must be the lowest
		eps = append(eps, netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 250, 0, byte(i)}), 53).String())
	}
	res := e.check(snapshot(dnsPort(eps...), kubernetesPort()), rules, time.Unix(2000, 0))
	if len(res.drifting) != 1 {
		t.Fatalf("drifting %+v", res.drifting)
	}
	d := res.drifting[0]
	if d.missing != 30 || len(d.missingAddrs) != maxDriftAddresses {
		t.Fatalf("missing %d with %d addresses, want 30 with %d", d.missing, len(d.missingAddrs), maxDriftAddresses)
	}
	if d.missingAddrs[0] != ap("10.250.0.1:53") || d.missingAddrs[maxDriftAddresses-1] != ap("10.250.0.20:53") {
		t.Errorf("kept %v, want 10.250.0.1 to 10.250.0.20", d.missingAddrs)
	}
	if d.stale != 0 || d.staleAddrs != nil || d.programmed != 3 || d.expected != 33 {
		t.Errorf("drift %+v", d)
	}
}

// Both families of a dual-stack port are counted together.
func TestDriftCountsBothFamilies(t *testing.T) {
	v4 := loadRules(t, "kube-proxy-nat.txt")
	v6 := fakeProgrammed{chains: map[string][]netip.AddrPort{clusterChain(dns): aps("[fd00::5]:53", "[fd00::6]:53")}}
	rules := map[bool]programmedRules{false: byChains{v4}, true: byChains{v6}}
	e := newDriftEngine(0)
	sp := dnsPort("10.244.1.5:53", "10.244.2.6:53", "10.244.3.7:53", "[fd00::5]:53")
	sp.ClusterIPs = append(sp.ClusterIPs, netip.MustParseAddr("fd00:96::a"))
	res := e.check(snapshot(sp, kubernetesPort()), rules, time.Unix(2000, 0))
	if len(res.drifting) != 1 {
		t.Fatalf("drifting %+v", res.drifting)
	}
	d := res.drifting[0]
	if !slices.Equal(d.staleAddrs, aps("[fd00::6]:53")) || d.programmed != 5 || d.expected != 4 {
		t.Errorf("drift %+v, want [fd00::6]:53 stale, 5 programmed, 4 expected", d)
	}
	// Each family's part: the one stale endpoint is IPv6's.
	if d.staleByFamily != [2]int{0, 1} || d.missingByFamily != [2]int{0, 0} {
		t.Errorf("stale by family %v, missing by family %v, want [0 1] and [0 0]", d.staleByFamily, d.missingByFamily)
	}
	// An IPv4 endpoint gone from the API too: IPv4 has one stale, IPv6 still one.
	sp = dnsPort("10.244.1.5:53", "10.244.2.6:53", "[fd00::5]:53")
	sp.ClusterIPs = append(sp.ClusterIPs, netip.MustParseAddr("fd00:96::a"))
	res = e.check(snapshot(sp, kubernetesPort()), rules, time.Unix(2001, 0))
	if len(res.drifting) != 1 || res.drifting[0].staleByFamily != [2]int{1, 1} || res.drifting[0].stale != 2 {
		t.Errorf("drifting %+v, want 1 stale endpoint of each family", res.drifting)
	}
}

// fakeProgrammed is one family's rules given as chains, iptables-named.
type fakeProgrammed struct{ chains map[string][]netip.AddrPort }

func (f fakeProgrammed) nftables() bool { return false }
func (f fakeProgrammed) chain(name string) ([]netip.AddrPort, bool) {
	eps, ok := f.chains[name]
	return eps, ok
}
func (f fakeProgrammed) chainCount() int { return len(f.chains) }
func (f fakeProgrammed) identity() any   { return nil } // modified in place by some tests

// LastCheck and Drifting tell what the metrics tell, with the addresses; nothing while the
// view is stale. The metrics are unchanged.
func TestLastCheckAccessor(t *testing.T) {
	nat, err := os.ReadFile("testdata/kube-proxy-nat.txt")
	if err != nil {
		t.Fatal(err)
	}
	read, _, err := readIPTablesNAT(bytes.NewReader(nat))
	if err != nil {
		t.Fatal(err)
	}
	view := &notifyingView{snap: snapshot(dnsPort("10.244.1.5:53", "10.244.2.6:53", "10.244.4.1:53", "10.244.4.2:53"), kubernetesPort()), changed: make(chan struct{}, 1)}
	c, err := New(Config{View: view, Rules: fakeRules{stateOf(hostrules.ModeIPTables, read.chains)}, CheckInterval: time.Second, GracePeriod: 0, MaxSeries: 10}, promslog.NewNopLogger())
	if err != nil {
		t.Fatal(err)
	}
	if got := c.LastCheck(); !got.At.IsZero() || got.Drifting != nil {
		t.Fatalf("before the first check: %+v", got)
	}
	at := time.Unix(5000, 0)
	c.now = func() time.Time { return at }
	c.check()

	got := c.LastCheck()
	if !got.At.Equal(at) || got.Mode != hostrules.ModeIPTables || !got.Fresh || !got.Compared || got.Checked != 2 || got.Err != nil {
		t.Errorf("summary %+v", got)
	}
	want := DriftingPort{Name: dns, Port: 53, Stale: aps("10.244.3.7:53"), Missing: aps("10.244.4.1:53", "10.244.4.2:53"),
		StaleCount: 1, MissingCount: 2, Programmed: 3, Expected: 4, Since: at}
	drifting := c.Drifting()
	if len(drifting) != 1 {
		t.Fatalf("Drifting() = %+v", drifting)
	}
	d := drifting[0]
	if d.Name != want.Name || d.Port != want.Port || !slices.Equal(d.Stale, want.Stale) || !slices.Equal(d.Missing, want.Missing) ||
		d.StaleCount != 1 || d.MissingCount != 2 || d.Programmed != 3 || d.Expected != 4 || !d.Since.Equal(at) ||
		!slices.Equal(d.StaleIn, []Chains{ClusterChain}) || !slices.Equal(d.MissingFrom, []Chains{ClusterChain, ClusterChain}) ||
		d.StaleByFamily != [2]int{1, 0} || d.MissingByFamily != [2]int{2, 0} {
		t.Errorf("Drifting()[0] = %+v, want %+v", d, want)
	}
	// A copy: changing it changes nothing published.
	d.Stale[0] = ap("1.2.3.4:5")
	if c.Drifting()[0].Stale[0] != ap("10.244.3.7:53") {
		t.Error("Drifting returned the published addresses, not a copy")
	}
	if v, _ := scrape(t, c).Value("proxyhealth_rules_endpoints_missing"); v != 2 {
		t.Errorf("proxyhealth_rules_endpoints_missing = %v, want 2", v)
	}

	stale := *view.snap
	stale.Fresh = false
	view.set(&stale)
	if got := c.LastCheck(); got.Fresh || got.Checked != 0 || len(got.Drifting) != 0 || !got.At.Equal(at) {
		t.Errorf("with the view gone stale: %+v, want the check's time and nothing drifting", got)
	}
	// A check with the stale view compared nothing, even once the view is fresh again.
	c.check()
	view.set(view.snap)
	fresh := *view.snap
	fresh.Fresh = true
	view.set(&fresh)
	if got := c.LastCheck(); !got.Fresh || got.Compared {
		t.Errorf("check made with a stale view: %+v, want Compared false", got)
	}
}
