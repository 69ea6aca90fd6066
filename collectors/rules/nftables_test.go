package rules

import (
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/proxyhealth/proxyhealth/internal/cluster"
	"github.com/proxyhealth/proxyhealth/internal/hostrules"
	"github.com/proxyhealth/proxyhealth/internal/kubeproxynames"
	"github.com/proxyhealth/proxyhealth/internal/testsupport/nft"
)

const (
	nftCaptureDir  = "testdata/kube-proxy-v1.36.3-nftables/"
	nftCaptureJSON = nftCaptureDir + "nft-list-table-ip-kube-proxy.json"
)

func parseNFTRules(t testing.TB, js []byte, family string) *nftRules {
	t.Helper()
	rs, err := nft.Parse(bytes.NewReader(js))
	if err != nil {
		t.Fatal(err)
	}
	tb := rs.Table(family, "kube-proxy")
	if tb == nil {
		t.Fatalf("no table %s kube-proxy", family)
	}
	return newNFTRules(tb)
}

// realNFTCapture is a real kube-proxy v1.36.3 nftables-mode table and the API objects it was
// programmed from (test/e2e: TestCaptureNFTablesFixtures).
func realNFTCapture(t *testing.T) (*nftRules, *cluster.Snapshot) {
	t.Helper()
	js, err := os.ReadFile(nftCaptureJSON)
	if err != nil {
		t.Fatal(err)
	}
	return parseNFTRules(t, js, "ip"), apiSnapshot(t, nftCaptureDir+"api-objects.json")
}

func nftPort(snap *cluster.Snapshot, name string) *cluster.ServicePort {
	for _, sp := range snap.Ports {
		if sp.Name.Name == name {
			return sp
		}
	}
	return nil
}

// A converged node in nftables mode: the API view matches every chain kube-proxy wrote, in
// both forms (inline numgen map; per-endpoint chains behind a vmap for ClientIP affinity),
// cluster and local chains, zone hints, two protocols on one port, a Service without endpoints.
func TestRealNFTablesOutputHasNoDrift(t *testing.T) {
	rules, snap := realNFTCapture(t)
	if len(snap.Ports) != 10 {
		t.Fatalf("%d service ports in the capture, want 10", len(snap.Ports))
	}
	res := newDriftEngine(0).check(snap, map[bool]programmedRules{false: byChains{rules}}, time.Unix(1, 0))
	if len(res.drifting) != 0 || res.orphans != 0 || res.checked != len(snap.Ports) {
		t.Errorf("checked %d of %d, drifting %+v, orphans %d: want no drift", res.checked, len(snap.Ports), res.drifting, res.orphans)
	}
	if n := len(slices.Collect(rules.serviceChains())); n != 11 {
		t.Errorf("%d service chains, want 11 (8 service-, 3 local-)", n)
	}
	// And it really compared something.
	for _, tc := range []struct {
		svc          string
		cluster, loc int // endpoints in each chain; -1 for no chain
	}{
		{"backend", 11, -1},
		{"kube-dns", 2, -1},
		{"zonal", 2, -1},
		{"local-only", -1, 2},
		{"web-nodeport", 2, 1},
		{"sticky", 3, 1}, // the affinity form
		{"empty", -1, -1},
	} {
		sp := nftPort(snap, tc.svc)
		c, l := rules.chainsFor(sp.Name)
		for _, ch := range []struct {
			chain string
			want  int
		}{{c, tc.cluster}, {l, tc.loc}} {
			got := rules.endpoints(ch.chain)
			if (ch.want < 0 && got != nil) || (ch.want >= 0 && len(got) != ch.want) {
				t.Errorf("%s: %s has %v, want %d endpoints (-1: no chain)", tc.svc, ch.chain, got, ch.want)
			}
		}
	}
	sticky := nftPort(snap, "sticky")
	c, _ := rules.chainsFor(sticky.Name)
	want := []netip.AddrPort{ap("10.244.1.3:8080"), ap("10.244.3.70:8080"), ap("10.244.3.71:8080")}
	if got := rules.endpoints(c); !slices.Equal(got, want) {
		t.Errorf("sticky: %v, want %v", got, want)
	}
}

// Incident 3 on real nftables output: the API moves on, the table does not. Same numbers as
// the iptables capture (TestRealKubeProxyOutputStale), and the same for the affinity form.
func TestRealNFTablesOutputStale(t *testing.T) {
	rules, snap := realNFTCapture(t)
	backend := nftPort(snap, "backend")
	if backend == nil || len(backend.ClusterEndpoints) != 11 {
		t.Fatalf("backend service port: %+v", backend)
	}
	backend.ClusterEndpoints = append(slices.Clone(backend.ClusterEndpoints[1:]), ap("10.244.3.200:8080"), ap("10.244.3.201:8080"))
	sticky := nftPort(snap, "sticky")
	sticky.ClusterEndpoints = append(slices.DeleteFunc(slices.Clone(sticky.ClusterEndpoints), func(e netip.AddrPort) bool {
		return e == ap("10.244.3.71:8080")
	}), ap("10.244.3.72:8080"))
	// Its local chain: the one local endpoint gone, in the API.
	sticky.LocalEndpoints = nil

	e := newDriftEngine(time.Minute)
	rr := map[bool]programmedRules{false: byChains{rules}}
	if res := e.check(snap, rr, time.Unix(0, 0)); len(res.drifting) != 0 {
		t.Fatalf("inside the grace period: %+v", res.drifting)
	}
	res := e.check(snap, rr, time.Unix(61, 0))
	got := map[string][2]int{}
	for _, d := range res.drifting {
		got[d.name.Name] = [2]int{d.stale, d.missing}
	}
	// sticky: .71 stale and .72 missing in its cluster chain. .3 left its local chain in the
	// API while staying one of its cluster endpoints: each chain is compared with what it
	// should hold, so .3 is stale in the local chain, the cluster chain holding it too
	// notwithstanding.
	want := map[string][2]int{"backend": {1, 2}, "sticky": {2, 1}}
	if len(got) != len(want) || got["backend"] != want["backend"] || got["sticky"] != want["sticky"] {
		t.Errorf("drifting %v (stale, missing), want %v", got, want)
	}
	for _, d := range res.drifting {
		if d.name.Name == "sticky" && (!slices.Equal(d.staleAddrs, aps("10.244.1.3:8080", "10.244.3.71:8080")) ||
			!slices.Equal(d.staleIn, []Chains{LocalChain, ClusterChain})) {
			t.Errorf("sticky: stale %v in %v, want 10.244.1.3 in the local chain, 10.244.3.71 in the cluster chain", d.staleAddrs, d.staleIn)
		}
	}
	if res.checked != 10 || res.orphans != 0 {
		t.Errorf("checked %d, orphans %d; want 10 and 0", res.checked, res.orphans)
	}
	// A Service deleted from the API while its chains stay: orphans.
	snap.Ports = slices.DeleteFunc(snap.Ports, func(sp *cluster.ServicePort) bool { return sp.Name.Name == "web-nodeport" })
	if res := e.check(snap, rr, time.Unix(62, 0)); res.orphans != 2 {
		t.Errorf("orphans %d, want web-nodeport's service- and local- chains", res.orphans)
	}
}

// A chain kube-proxy stopped using is flushed first and deleted on a later sync: while empty
// it is neither an orphan nor a source of endpoints.
func TestNFTFlushedChainIsIgnored(t *testing.T) {
	js := []byte(`{"nftables": [{"table": {"family": "ip", "name": "kube-proxy"}},
		{"chain": {"family": "ip", "table": "kube-proxy", "name": "service-2QRHZV4L-default/kubernetes/tcp/https"}},
		{"chain": {"family": "ip", "table": "kube-proxy", "name": "services"}},
		{"rule": {"family": "ip", "table": "kube-proxy", "chain": "services", "expr": [{"goto": {"target": "service-2QRHZV4L-default/kubernetes/tcp/https"}}]}}]}`)
	r := parseNFTRules(t, js, "ip")
	if chains := slices.Collect(r.serviceChains()); len(chains) != 0 || r.endpoints("service-2QRHZV4L-default/kubernetes/tcp/https") != nil {
		t.Errorf("flushed chain read as %v / %v", chains, r.chains)
	}
}

// The collector, its engine and its metrics are the same in nftables mode.
func TestCollectorNFTablesExposition(t *testing.T) {
	js, err := os.ReadFile(nftCaptureJSON)
	if err != nil {
		t.Fatal(err)
	}
	snap := apiSnapshot(t, nftCaptureDir+"api-objects.json")
	snap.LastHeard = heardAtEveryCheck
	var dnsPort *cluster.ServicePort
	for _, sp := range snap.Ports {
		if sp.Name == dns {
			dnsPort = sp
		}
	}
	dnsPort.ClusterEndpoints = []netip.AddrPort{ap("10.244.1.3:53"), ap("10.244.4.1:53"), ap("10.244.4.2:53")}
	rules := fakeRules{stateOf(hostrules.ModeNFTables, parseNFTRules(t, js, "ip").chains)}
	c := checkedOnce(t, fakeView{snap}, rules)

	want := `
# TYPE proxyhealth_proxy_mode gauge
proxyhealth_proxy_mode{mode="iptables"} 0
proxyhealth_proxy_mode{mode="ipvs"} 0
proxyhealth_proxy_mode{mode="nftables"} 1
proxyhealth_proxy_mode{mode="none"} 0
# TYPE proxyhealth_rules_endpoints_missing gauge
proxyhealth_rules_endpoints_missing 2
# TYPE proxyhealth_rules_endpoints_stale gauge
proxyhealth_rules_endpoints_stale 1
# TYPE proxyhealth_rules_services_checked gauge
proxyhealth_rules_services_checked 10
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
}

// FuzzNFTRules checks that no table makes the nftables reader or the drift engine on it panic,
// and that what it reads is well formed: only service port chains with rules, valid endpoints,
// each listed once.
func FuzzNFTRules(f *testing.F) {
	js, err := os.ReadFile(nftCaptureJSON)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(string(js))
	f.Add(`{"nftables": [{"table": {"family": "ip", "name": "kube-proxy"}}, {"chain": {"family": "ip", "table": "kube-proxy", "name": "service-X-a/b/tcp/p"}}, {"chain": {"family": "ip", "table": "kube-proxy", "name": "endpoint-Y-a/b/tcp/p__10.0.0.1/80"}}, {"rule": {"family": "ip", "table": "kube-proxy", "chain": "endpoint-Y-a/b/tcp/p__10.0.0.1/80", "expr": [{"dnat": {"addr": "10.0.0.1", "port": 80}}, {"goto": {"target": "service-X-a/b/tcp/p"}}]}}, {"rule": {"family": "ip", "table": "kube-proxy", "chain": "service-X-a/b/tcp/p", "expr": [{"vmap": {"key": {"numgen": {"mode": "random", "mod": 2}}, "data": {"set": [[0, {"goto": {"target": "endpoint-Y-a/b/tcp/p__10.0.0.1/80"}}], [1, {"jump": {"target": "service-X-a/b/tcp/p"}}]]}}}]}}]}`)
	f.Add(`{"nftables": [{"table": {"family": "ip", "name": "kube-proxy"}}, {"chain": {"family": "ip", "table": "kube-proxy", "name": "local-X-a/b/udp/"}}, {"rule": {"family": "ip", "table": "kube-proxy", "chain": "local-X-a/b/udp/", "expr": [{"dnat": {"family": "ip", "addr": {"map": {"key": {"numgen": {"mode": "random", "mod": 3}}, "data": {"set": [[0, {"concat": ["10.0.0.1", 53]}], [1, {"concat": ["10.0.0.1", 53]}], [2, {"concat": ["fd00::1", 53]}], 7, [3], [4, {"concat": ["x", "y"]}]]}}}}}]}}]}`)
	snapFor := func(r *nftRules) *cluster.Snapshot {
		snap := &cluster.Snapshot{Synced: true, Fresh: true}
		for _, name := range []cluster.ServicePortName{dns, kubernetes, {Namespace: "a", Name: "b", Port: "p", Protocol: "TCP"}} {
			c, _ := r.chainsFor(name)
			snap.Ports = append(snap.Ports, &cluster.ServicePort{Name: name, ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.1")},
				ClusterEndpoints: []netip.AddrPort{ap("10.0.0.1:80")}, LocalEndpoints: r.endpoints(c)})
		}
		return snap
	}
	f.Fuzz(func(t *testing.T, in string) {
		rs, err := nft.Parse(strings.NewReader(in))
		if err != nil {
			return
		}
		for _, family := range []string{"ip", "ip6"} {
			tb := rs.Table(family, "kube-proxy")
			r := newNFTRules(tb)
			for name := range r.serviceChains() {
				if !kubeproxynames.IsNFTServiceChain(name) || tb.Chain(name) == nil || len(tb.Chain(name).Rules) == 0 {
					t.Errorf("chain %q listed", name)
				}
				eps := r.endpoints(name)
				for i, ep := range eps {
					if !ep.IsValid() || ep.Addr().Is4In6() || slices.Contains(eps[:i], ep) {
						t.Errorf("chain %q: endpoint %v invalid or repeated in %v", name, ep, eps)
					}
				}
			}
			newDriftEngine(0).check(snapFor(r), map[bool]programmedRules{family == "ip6": byChains{r}}, time.Unix(1, 0))
		}
	})
}

// nftTableJSON is `nft -j list table ip kube-proxy` as nftables 1.0.6 prints it for n service
// ports of e endpoints each in the inline form.
func nftTableJSON(n, e int) []byte {
	var b bytes.Buffer
	b.WriteString(`{"nftables": [{"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}}, {"table": {"family": "ip", "name": "kube-proxy", "handle": 3}}`)
	var r nftRules
	for i := range n {
		c, _ := r.chainsFor(cluster.ServicePortName{Namespace: fmt.Sprintf("ns%d", i%50), Name: fmt.Sprintf("svc%d", i), Port: "http", Protocol: "TCP"})
		fmt.Fprintf(&b, `, {"chain": {"family": "ip", "table": "kube-proxy", "name": %q, "handle": %d}}`, c, 2*i+10)
		fmt.Fprintf(&b, `, {"rule": {"family": "ip", "table": "kube-proxy", "chain": %q, "handle": %d, "expr": [{"match": {"op": "==", "left": {"meta": {"key": "l4proto"}}, "right": "tcp"}}, {"dnat": {"family": "ip", "addr": {"map": {"key": {"numgen": {"mode": "random", "mod": %d, "offset": 0}}, "data": {"set": [`, c, 2*i+11, e)
		for j := range e {
			if j > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, `[%d, {"concat": ["10.%d.%d.%d", 8080]}]`, j, (i>>8)&255, i&255, j+1)
		}
		b.WriteString(`]}}}}}]}}`)
	}
	b.WriteString("]}\n")
	return b.Bytes()
}

// What a changed table costs to read once nft has printed it: parsing and the endpoints.
func BenchmarkNFTRules5000x5(b *testing.B) {
	js := nftTableJSON(5000, 5)
	b.SetBytes(int64(len(js)))
	b.ReportAllocs()
	for b.Loop() {
		rs, err := nft.Parse(bytes.NewReader(js))
		if err != nil {
			b.Fatal(err)
		}
		if r := newNFTRules(rs.Table("ip", "kube-proxy")); len(r.chains) != 5000 {
			b.Fatalf("%d chains", len(r.chains))
		}
	}
}
