package rules

import (
	"bytes"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/promslog"

	"github.com/proxyhealth/proxyhealth/collectors/collectortest"
	"github.com/proxyhealth/proxyhealth/internal/cluster"
	"github.com/proxyhealth/proxyhealth/internal/hostrules"
	"github.com/proxyhealth/proxyhealth/internal/ruleset"
)

var (
	dns        = cluster.ServicePortName{Namespace: "kube-system", Name: "kube-dns", Port: "dns", Protocol: "UDP"}
	kubernetes = cluster.ServicePortName{Namespace: "default", Name: "kubernetes", Port: "https", Protocol: "TCP"}
)

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

// clusterChain is the iptables-mode cluster chain of a service port.
func clusterChain(n cluster.ServicePortName) string {
	c, _ := chainsFor(n, false)
	return c
}

func loadRules(t testing.TB, file string) *iptablesRules {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", file))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rules, hasServices, err := readIPTablesNAT(f)
	if err != nil || !hasServices {
		t.Fatalf("read %s: %v (KUBE-SERVICES found: %v)", file, err, hasServices)
	}
	return rules
}

func TestIPTablesProgrammedEndpoints(t *testing.T) {
	r := loadRules(t, "kube-proxy-nat.txt")
	dnsCluster, dnsLocal := r.chainsFor(dns)
	got := r.endpoints(dnsCluster)
	want := []netip.AddrPort{ap("10.244.1.5:53"), ap("10.244.2.6:53"), ap("10.244.3.7:53")}
	if !slices.Equal(got, want) {
		t.Errorf("dns endpoints = %v, want %v", got, want)
	}
	if got := r.endpoints(dnsLocal); got != nil {
		t.Errorf("dns local chain = %v, want none", got)
	}
	if got := r.endpoints(clusterChain(kubernetes)); !slices.Equal(got, []netip.AddrPort{ap("192.168.0.10:6443")}) {
		t.Errorf("kubernetes endpoints = %v", got)
	}
}

// heardAtEveryCheck is a LastHeard later than any check's time: the view was confirmed current
// at each check (the engine takes the earlier of LastHeard and now).
var heardAtEveryCheck = time.Unix(1<<33, 0)

// snapshot is a fresh view with the given ports.
func snapshot(ports ...*cluster.ServicePort) *cluster.Snapshot {
	return &cluster.Snapshot{Ports: ports, Synced: true, Fresh: true, LastHeard: heardAtEveryCheck}
}

func dnsPort(endpoints ...string) *cluster.ServicePort {
	sp := &cluster.ServicePort{Name: dns, ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10")}, Port: 53}
	for _, e := range endpoints {
		sp.ClusterEndpoints = append(sp.ClusterEndpoints, ap(e))
	}
	return sp
}

func kubernetesPort() *cluster.ServicePort {
	return &cluster.ServicePort{Name: kubernetes, ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.1")}, Port: 443,
		ClusterEndpoints: []netip.AddrPort{ap("192.168.0.10:6443")}}
}

func TestDriftNeedsTheGracePeriod(t *testing.T) {
	rules := map[bool]programmedRules{false: byChains{loadRules(t, "kube-proxy-nat.txt")}}
	e := newDriftEngine(time.Minute)
	t0 := time.Unix(2000, 0)
	// The API dropped 10.244.3.7 and added two endpoints: 1 stale, 2 missing.
	snap := snapshot(dnsPort("10.244.1.5:53", "10.244.2.6:53", "10.244.4.1:53", "10.244.4.2:53"), kubernetesPort())
	if res := e.check(snap, rules, t0); len(res.drifting) != 0 || res.checked != 2 {
		t.Fatalf("at first sight: %+v, want 2 checked and nothing drifting yet", res)
	}
	if res := e.check(snap, rules, t0.Add(59*time.Second)); len(res.drifting) != 0 {
		t.Fatalf("inside the grace period: drifting %+v", res.drifting)
	}
	res := e.check(snap, rules, t0.Add(61*time.Second))
	if len(res.drifting) != 1 {
		t.Fatalf("past the grace period: drifting %+v, want kube-dns", res.drifting)
	}
	d := res.drifting[0]
	if d.name != dns || d.stale != 1 || d.missing != 2 || !d.since.Equal(t0) || d.port != 53 {
		t.Errorf("drift = %+v, want kube-dns stale 1 missing 2 since t0", d)
	}
	if res.orphans != 1 {
		t.Errorf("orphan chains = %d, want the one chain no API service port accounts for", res.orphans)
	}
	// Healed: the next check finds nothing.
	healed := snapshot(dnsPort("10.244.1.5:53", "10.244.2.6:53", "10.244.3.7:53"), kubernetesPort())
	if res := e.check(healed, rules, t0.Add(62*time.Second)); len(res.drifting) != 0 {
		t.Errorf("after healing: drifting %+v", res.drifting)
	}
}

// During steady churn a difference exists at every check, but each endpoint's difference is
// short-lived: that is kube-proxy's sync lag, not drift.
func TestChurnIsNotDrift(t *testing.T) {
	rules := map[bool]programmedRules{false: byChains{loadRules(t, "kube-proxy-nat.txt")}}
	e := newDriftEngine(30 * time.Second)
	t0 := time.Unix(2000, 0)
	for i := 0; i < 20; i++ {
		// Each check the API has one new endpoint the rules do not have yet.
		extra := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, 9, byte(i)}), 53).String()
		snap := snapshot(dnsPort("10.244.1.5:53", "10.244.2.6:53", "10.244.3.7:53", extra), kubernetesPort())
		if res := e.check(snap, rules, t0.Add(time.Duration(i)*10*time.Second)); len(res.drifting) != 0 {
			t.Fatalf("check %d: churn reported as drift: %+v", i, res.drifting)
		}
	}
}

func TestStaleViewReportsNoDrift(t *testing.T) {
	rules := map[bool]programmedRules{false: byChains{loadRules(t, "kube-proxy-nat.txt")}}
	e := newDriftEngine(0)
	snap := snapshot(dnsPort("10.244.1.5:53"), kubernetesPort())
	if res := e.check(snap, rules, time.Unix(1, 0)); len(res.drifting) != 1 {
		t.Fatalf("fresh view: drifting %+v, want kube-dns", res.drifting)
	}
	snap.Fresh = false
	res := e.check(snap, rules, time.Unix(2, 0))
	if res.fresh || res.checked != 0 || len(res.drifting) != 0 {
		t.Errorf("stale view: %+v, want nothing compared", res)
	}
	if n := e.pendingCount(); n != 0 {
		t.Errorf("grace periods kept across a stale view: %d differences followed", n)
	}
}

// A view should list a service port once; one that lists it twice gets the differences of
// both entries followed, each from when it was first seen.
func TestPortListedTwice(t *testing.T) {
	rules := map[bool]programmedRules{false: byChains{loadRules(t, "kube-proxy-nat.txt")}} // kube-dns: 10.244.1.5, 10.244.2.6, 10.244.3.7
	e := newDriftEngine(2 * time.Second)
	snap := snapshot(dnsPort("10.244.1.5:53", "10.244.7.7:53"), dnsPort("10.244.2.6:53", "10.244.8.8:53"))
	if res := e.check(snap, rules, time.Unix(1, 0)); len(res.drifting) != 0 || e.pendingCount() != 5 {
		t.Fatalf("first check: drifting %+v, %d differences followed; want none, 5", res.drifting, e.pendingCount())
	}
	for _, at := range []int64{3, 4} {
		res := e.check(snap, rules, time.Unix(at, 0))
		if len(res.drifting) != 1 {
			t.Fatalf("at %d: drifting %+v, want kube-dns", at, res.drifting)
		}
		d := res.drifting[0]
		want := []netip.AddrPort{ap("10.244.1.5:53"), ap("10.244.2.6:53"), ap("10.244.3.7:53")}
		if d.stale != 3 || d.missing != 2 || !slices.Equal(d.staleAddrs, want) || !d.since.Equal(time.Unix(1, 0)) {
			t.Errorf("at %d: %+v, want stale %v, missing 10.244.7.7 and 10.244.8.8, since 1", at, d, want)
		}
	}
}

func TestDriftPerFamily(t *testing.T) {
	rules := map[bool]programmedRules{false: byChains{loadRules(t, "kube-proxy-nat.txt")}} // no IPv6 rules read
	e := newDriftEngine(0)
	sp := dnsPort("10.244.1.5:53", "10.244.2.6:53", "10.244.3.7:53", "[fd00::5]:53")
	sp.ClusterIPs = append(sp.ClusterIPs, netip.MustParseAddr("fd00:96::a"))
	// The IPv6 endpoint is not compared with the IPv4 chain, and IPv6 was not read.
	if res := e.check(snapshot(sp, kubernetesPort()), rules, time.Unix(1, 0)); len(res.drifting) != 0 {
		t.Errorf("drifting %+v: an IPv6 endpoint was compared with IPv4 rules", res.drifting)
	}
}

type fakeView struct{ snap *cluster.Snapshot }

func (f fakeView) Snapshot() *cluster.Snapshot { return f.snap }

// fakeRules serves one read of the node's rules.
type fakeRules struct{ st *hostrules.State }

func (f fakeRules) State() *hostrules.State    { return f.st }
func (f fakeRules) Subscribe() <-chan struct{} { return make(chan struct{}) }

// stateOf is a read that found kube-proxy in mode with these IPv4 chains.
func stateOf(mode string, chains map[string][]netip.AddrPort) *hostrules.State {
	return &hostrules.State{Seq: 1, Mode: mode, Backend: hostrules.BackendIPTablesNFT,
		Proxy: map[bool]*ruleset.ProxyTable{false: {Chains: chains}}}
}

func TestCollectorExposition(t *testing.T) {
	nat, err := os.ReadFile("testdata/kube-proxy-nat.txt")
	if err != nil {
		t.Fatal(err)
	}
	view := fakeView{snapshot(dnsPort("10.244.1.5:53", "10.244.2.6:53", "10.244.4.1:53", "10.244.4.2:53"), kubernetesPort())}
	read, _, err := readIPTablesNAT(bytes.NewReader(nat))
	if err != nil {
		t.Fatal(err)
	}
	c := checkedOnce(t, view, fakeRules{stateOf(hostrules.ModeIPTables, read.chains)})

	want := `
# TYPE proxyhealth_proxy_mode gauge
proxyhealth_proxy_mode{mode="iptables"} 1
proxyhealth_proxy_mode{mode="ipvs"} 0
proxyhealth_proxy_mode{mode="nftables"} 0
proxyhealth_proxy_mode{mode="none"} 0
# TYPE proxyhealth_rules_endpoints_missing gauge
proxyhealth_rules_endpoints_missing 2
# TYPE proxyhealth_rules_endpoints_stale gauge
proxyhealth_rules_endpoints_stale 1
# TYPE proxyhealth_rules_services_checked gauge
proxyhealth_rules_services_checked 2
# TYPE proxyhealth_rules_services_drifted gauge
proxyhealth_rules_services_drifted 1
# TYPE proxyhealth_service_drift_endpoints gauge
proxyhealth_service_drift_endpoints{kind="missing",protocol="udp",service_name="kube-dns",service_namespace="kube-system",service_port="53"} 2
proxyhealth_service_drift_endpoints{kind="stale",protocol="udp",service_name="kube-dns",service_namespace="kube-system",service_port="53"} 1
`
	if err := scrape(t, c).Compare(want,
		"proxyhealth_proxy_mode", "proxyhealth_rules_endpoints_missing", "proxyhealth_rules_endpoints_stale",
		"proxyhealth_rules_services_checked", "proxyhealth_rules_services_drifted", "proxyhealth_service_drift_endpoints"); err != nil {
		t.Error(err)
	}

	// The cap: no per-service series, the drifting port counted as unlisted.
	c.cfg.MaxSeries = 0
	if n := scrape(t, c).Count("proxyhealth_service_drift_endpoints"); n != 0 {
		t.Errorf("%d per-service series with a cap of 0", n)
	}
	if v, _ := scrape(t, c).Value("proxyhealth_rules_drift_unlisted"); v != 1 {
		t.Errorf("proxyhealth_rules_drift_unlisted = %v, want 1", v)
	}
}

// A difference first seen after the view last heard from the API is not counted however long
// it lasts: the view may simply not have received the change (the exporter's own connection
// died), which is no sign of a stale kube-proxy.
func TestDriftCountsOnlyWhileTheViewIsConfirmed(t *testing.T) {
	rules := map[bool]programmedRules{false: byChains{loadRules(t, "kube-proxy-nat.txt")}}
	e := newDriftEngine(3 * time.Second)
	t0 := time.Unix(2000, 0)
	snap := snapshot(dnsPort("10.244.1.5:53", "10.244.2.6:53"), kubernetesPort()) // 10.244.3.7 stale
	snap.LastHeard = t0.Add(-time.Second)                                         // heard just before the difference
	for _, at := range []time.Duration{0, 2 * time.Second, 4 * time.Second, 10 * time.Second} {
		if res := e.check(snap, rules, t0.Add(at)); len(res.drifting) != 0 {
			t.Fatalf("at +%v with the view last heard before the difference: drifting %+v", at, res.drifting)
		}
	}
	// Heard from again: the difference has now been confirmed for longer than the grace period.
	snap.LastHeard = t0.Add(11 * time.Second)
	if res := e.check(snap, rules, t0.Add(11*time.Second)); len(res.drifting) != 1 || res.drifting[0].stale != 1 {
		t.Errorf("confirmed: drifting %+v, want kube-dns with 1 stale", res.drifting)
	}
}

// scrape runs one Update of c; its error is the test's to look at where it matters, and here
// it does not (the fakes' view is not always fresh).
func scrape(t *testing.T, c *Collector) *collectortest.Scrape {
	t.Helper()
	s, _ := collectortest.Collect(t, c)
	return s
}

// The collector needs both sides of the comparison: New names each one missing, with the bad
// flags, in one error.
func TestNewNeedsViewAndRules(t *testing.T) {
	_, err := New(Config{CheckInterval: 0, MaxSeries: 10}, promslog.NewNopLogger())
	if err == nil {
		t.Fatal("New without a view, rules or check interval: no error")
	}
	for _, want := range []string{"no API view", "no netfilter reader", "rules.check-interval"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}

// checkedOnce builds a collector comparing rules with view, with no grace period, and runs one
// check at a fixed time: a test then reads what that check published.
func checkedOnce(t *testing.T, view cluster.View, rules Rules) *Collector {
	t.Helper()
	c, err := New(Config{View: view, Rules: rules, CheckInterval: time.Second, GracePeriod: 0, MaxSeries: 10}, promslog.NewNopLogger())
	if err != nil {
		t.Fatal(err)
	}
	c.now = func() time.Time { return time.Unix(5000, 0) }
	c.check()
	return c
}
