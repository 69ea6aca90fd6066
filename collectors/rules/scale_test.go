package rules

import (
	"bytes"
	"fmt"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/proxyhealth/proxyhealth/internal/cluster"
	"github.com/proxyhealth/proxyhealth/internal/hostrules"
	"github.com/proxyhealth/proxyhealth/internal/kubeproxynames"
	"github.com/proxyhealth/proxyhealth/internal/ruleset"
)

// generateCluster writes kube-proxy iptables-mode nat rules for services x endpoints, the way
// kube-proxy v1.36 writes them, and the matching API view.
func generateCluster(services, endpoints int) ([]byte, *cluster.Snapshot) {
	var b bytes.Buffer
	snap := &cluster.Snapshot{Synced: true, Fresh: true}
	b.WriteString("*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n:KUBE-MARK-MASQ - [0:0]\n:KUBE-SERVICES - [0:0]\n")
	var rules strings.Builder
	for s := range services {
		name := cluster.ServicePortName{Namespace: fmt.Sprintf("ns%d", s%100), Name: fmt.Sprintf("svc%d", s), Port: "http", Protocol: "TCP"}
		vip := netip.AddrFrom4([4]byte{10, 96, byte(s >> 8), byte(s)})
		sp := &cluster.ServicePort{Name: name, ClusterIPs: []netip.Addr{vip}, Port: 80}
		svc := clusterChain(name)
		fmt.Fprintf(&b, ":%s - [0:0]\n", svc)
		fmt.Fprintf(&rules, "-A KUBE-SERVICES -d %s/32 -p tcp -m comment --comment \"%s cluster IP\" -m tcp --dport 80 -j %s\n", vip, name, svc)
		for e := range endpoints {
			ep := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(128 + s>>13), byte(s >> 5), byte(s<<3 | e&7)}), uint16(8080+e))
			sp.ClusterEndpoints = append(sp.ClusterEndpoints, ep)
			sep := kubeproxynames.IPTablesEndpointChain(name.Namespace, name.Name, name.Port, name.Protocol, ep)
			fmt.Fprintf(&b, ":%s - [0:0]\n", sep)
			fmt.Fprintf(&rules, "-A %s -m comment --comment \"%s -> %s\" -m statistic --mode random --probability %.11f -j %s\n", svc, name, ep, 1/float64(endpoints-e), sep)
			fmt.Fprintf(&rules, "-A %s -s %s/32 -m comment --comment \"%s\" -j KUBE-MARK-MASQ\n", sep, ep.Addr(), name)
			fmt.Fprintf(&rules, "-A %s -p tcp -m comment --comment \"%s\" -m tcp -j DNAT --to-destination %s\n", sep, name, ep)
		}
		snap.Ports = append(snap.Ports, sp)
	}
	b.WriteString(rules.String())
	b.WriteString("COMMIT\n")
	return b.Bytes(), snap
}

func TestGeneratedClusterHasNoDrift(t *testing.T) {
	nat, snap := generateCluster(50, 10)
	rules, _, err := readIPTablesNAT(bytes.NewReader(nat))
	if err != nil {
		t.Fatal(err)
	}
	res := newDriftEngine(0).check(snap, map[bool]programmedRules{false: byChains{rules}}, time.Unix(1, 0))
	if res.checked != 50 || len(res.drifting) != 0 || res.orphans != 0 {
		t.Errorf("checked %d drifting %d orphans %d, want 50, 0, 0", res.checked, len(res.drifting), res.orphans)
	}
}

// BenchmarkParseAndCompare measures the exporter's side of a drift check: reading the nat
// table and comparing it with the API view. Run at scale with
// go test -bench ParseAndCompare -benchtime 3x ./collectors/rules (-services=10000 is the default).
func BenchmarkParseAndCompare(b *testing.B) {
	services := 10000
	if testing.Short() {
		services = 200
	}
	nat, snap := generateCluster(services, 10)
	b.SetBytes(int64(len(nat)))
	b.ReportAllocs()
	e := newDriftEngine(time.Minute)
	for b.Loop() {
		rules, _, err := readIPTablesNAT(bytes.NewReader(nat))
		if err != nil {
			b.Fatal(err)
		}
		res := e.check(snap, map[bool]programmedRules{false: byChains{rules}}, time.Unix(1, 0))
		if res.checked != services {
			b.Fatalf("checked %d", res.checked)
		}
	}
}

// BenchmarkCompareOnly is a check whose rules did not change: the comparison against the API
// still runs (incident 3 is "rules unchanged, API changed"), the read and parse do not. The
// rules are handed in as the collector does, from the netfilter reader's state.
func BenchmarkCompareOnly(b *testing.B) {
	services := 10000
	if testing.Short() {
		services = 200
	}
	nat, snap := generateCluster(services, 10)
	read, _, err := readIPTablesNAT(bytes.NewReader(nat))
	if err != nil {
		b.Fatal(err)
	}
	e := newDriftEngine(time.Minute)
	rules := programmedByFamily(stateOf(hostrules.ModeIPTables, read.chains))
	b.ReportAllocs()
	for b.Loop() {
		if res := e.check(snap, rules, time.Unix(1, 0)); res.checked != services || len(res.drifting) != 0 {
			b.Fatalf("checked %d, drifting %d; want %d, 0", res.checked, len(res.drifting), services)
		}
	}
}

func FuzzProgrammedRules(f *testing.F) {
	nat, _ := generateCluster(2, 2)
	f.Add(string(nat))
	f.Add("*nat\n:KUBE-SVC-X - [0:0]\n:KUBE-SEP-Y - [0:0]\n-A KUBE-SVC-X -j KUBE-SEP-Y\n-A KUBE-SEP-Y -j DNAT --to-destination [fd00::1]:80\nCOMMIT\n")
	f.Fuzz(func(t *testing.T, s string) {
		r, _, err := readIPTablesNAT(strings.NewReader(s))
		if err != nil {
			return
		}
		// Whatever the input, the result is usable by the drift engine.
		newDriftEngine(0).check(&cluster.Snapshot{Fresh: true, Ports: []*cluster.ServicePort{dnsPort("10.244.1.5:53")}},
			map[bool]programmedRules{false: byChains{r}}, time.Unix(1, 0))
	})
}

// churnCluster is services ClusterIP service ports of endpoints endpoints each and kube-proxy's
// iptables-mode chains programmed to match, endpoint lists sorted as the API view and the
// netfilter readers hand them in.
func churnCluster(services, endpoints int) (*cluster.Snapshot, map[string][]netip.AddrPort) {
	snap := &cluster.Snapshot{Synced: true, Fresh: true, LastHeard: heardAtEveryCheck}
	chains := make(map[string][]netip.AddrPort, services)
	for s := range services {
		name := cluster.ServicePortName{Namespace: fmt.Sprintf("ns%d", s%100), Name: fmt.Sprintf("svc%d", s), Port: "http", Protocol: "TCP"}
		sp := &cluster.ServicePort{Name: name, ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, byte(s >> 8), byte(s)})}, Port: 80}
		for e := range endpoints {
			sp.ClusterEndpoints = append(sp.ClusterEndpoints, netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(128 + s>>13), byte(s >> 5), byte(s<<3 | e&7)}), uint16(8080+e)))
		}
		slices.SortFunc(sp.ClusterEndpoints, netip.AddrPort.Compare)
		chains[clusterChain(name)] = slices.Clone(sp.ClusterEndpoints)
		snap.Ports = append(snap.Ports, sp)
	}
	return snap, chains
}

// BenchmarkCheckUnderChurn is one drift check at 10,000 service ports x 10 endpoints under
// endpoint churn: since the last check the API moved one endpoint of one port, and kube-proxy's
// rules followed the previous port's move, so one difference is in flight at each check. In
// "followed" the other ports' endpoint lists are those of the last check, as the API view and
// a reader that follows the rules' changes hand them on; in "re-read" every chain's list is new,
// as after a whole read of the table.
func BenchmarkCheckUnderChurn(b *testing.B) {
	services := 10000
	if testing.Short() {
		services = 500
	}
	for _, reread := range []bool{false, true} {
		name := "followed"
		if reread {
			name = "re-read"
		}
		b.Run(name, func(b *testing.B) {
			snap, chains := churnCluster(services, 10)
			e := newDriftEngine(time.Minute)
			table := &ruleset.ProxyTable{Chains: chains}
			st := &hostrules.State{Seq: 1, Mode: hostrules.ModeIPTables, Proxy: map[bool]*ruleset.ProxyTable{false: table}}
			now := time.Unix(1, 0)
			e.check(snap, programmedByFamily(st), now)
			b.ReportAllocs()
			for k := 0; b.Loop(); k++ {
				b.StopTimer()
				// A moved port is a new ServicePort, as the API view publishes it.
				moved := *snap.Ports[k%services]
				eps := slices.Clone(moved.ClusterEndpoints)
				eps[k%len(eps)] = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 64, byte(k >> 8), byte(k)}), 8080)
				slices.SortFunc(eps, netip.AddrPort.Compare)
				moved.ClusterEndpoints = eps
				snap.Ports[k%services] = &moved
				if k > 0 {
					followed := snap.Ports[(k-1)%services]
					chains[clusterChain(followed.Name)] = slices.Clone(followed.ClusterEndpoints)
				}
				if reread {
					for c, eps := range chains {
						chains[c] = slices.Clone(eps)
					}
				}
				b.StartTimer()
				res := e.check(snap, programmedByFamily(st), now)
				if res.checked != services || len(res.drifting) != 0 || res.nextDeadline.IsZero() || e.pendingCount() != 2 {
					b.Fatalf("checked %d, drifting %d, next deadline %v, %d differences followed; want %d, 0, set, 2",
						res.checked, len(res.drifting), res.nextDeadline, e.pendingCount(), services)
				}
			}
		})
	}
}

// BenchmarkCheckBeforeRulesSync is a drift check of kube-proxy's rules before its first sync
// wrote any service chain, as the exporter meets them when both start together: at 10,000
// service ports x 10 endpoints every endpoint is missing, 100,000 differences followed through
// the grace period until the rules catch up. It reports what the engine holds for each
// (B/difference: the live heap with the engine less without it, after the checks).
func BenchmarkCheckBeforeRulesSync(b *testing.B) {
	services := 10000
	if testing.Short() {
		services = 500
	}
	snap, _ := churnCluster(services, 10)
	st := &hostrules.State{Seq: 1, Mode: hostrules.ModeIPTables, Proxy: map[bool]*ruleset.ProxyTable{false: {Chains: map[string][]netip.AddrPort{}}}}
	rules := programmedByFamily(st)
	before := liveHeap()
	e := newDriftEngine(time.Minute)
	b.ReportAllocs()
	for k := 0; b.Loop(); k++ {
		res := e.check(snap, rules, time.Unix(int64(1+k), 0))
		if res.checked != services || len(res.drifting) != 0 || e.pendingCount() != services*10 {
			b.Fatalf("checked %d, drifting %d, %d differences followed; want %d, 0, %d", res.checked, len(res.drifting), e.pendingCount(), services, services*10)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(liveHeap()-before)/float64(e.pendingCount()), "B/difference")
	runtime.KeepAlive(snap) // held by the measure before
	runtime.KeepAlive(rules)
}

// pendingCount is how many differences the engine follows.
func (e *driftEngine) pendingCount() int {
	n := 0
	for _, st := range e.ports.order {
		n += len(st.pending)
	}
	return n
}

// liveHeap is the heap's live bytes after a collection.
func liveHeap() int64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}
