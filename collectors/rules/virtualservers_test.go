package rules

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyhealth/proxyhealth/collectors/collectortest"
	"github.com/proxyhealth/proxyhealth/internal/cluster"
	"github.com/proxyhealth/proxyhealth/internal/hostrules"
	"github.com/proxyhealth/proxyhealth/internal/ipvs"
	"github.com/proxyhealth/proxyhealth/internal/proxyversion"
)

// The drift check in kube-proxy's IPVS mode: the API's objects go through the view's own
// computation (cluster.ServicePortsFor) for each supported kube-proxy version, and each
// virtual server is compared with what kube-proxy's IPVS proxier gives it (pkg/proxy/ipvs:
// syncProxyRules, syncEndpoint, graceful_termination.go).

const (
	ipvsNode   = "node-a"
	ipvsZone   = "zone-a"
	nodeAddr   = "192.168.1.5"
	webPort    = 80
	webNodePrt = 30080
)

var ipvsVersions = []string{"v1.34.4", "v1.37.2"}

func ipvsService(mod ...func(*corev1.Service)) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "lab", Name: "web"},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeClusterIP, ClusterIP: "10.96.0.80", ClusterIPs: []string{"10.96.0.80"},
			IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol},
			Ports:      []corev1.ServicePort{{Name: "http", Port: webPort, Protocol: corev1.ProtocolTCP}},
		},
	}
	for _, m := range mod {
		m(s)
	}
	return s
}

func nodePort(s *corev1.Service) {
	s.Spec.Type = corev1.ServiceTypeNodePort
	s.Spec.Ports[0].NodePort = webNodePrt
}

func externalLocal(s *corev1.Service) {
	s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
}

func internalLocal(s *corev1.Service) {
	p := corev1.ServiceInternalTrafficPolicyLocal
	s.Spec.InternalTrafficPolicy = &p
}

// ipvsEP is an endpoint at 10.244.0.<n>:8080 on node, ready unless told otherwise.
type ipvsEP struct {
	n           int
	node        string
	terminating bool // and serving, not ready
	zoneHint    string
}

func (e ipvsEP) addr() string { return fmt.Sprintf("10.244.0.%d:8080", e.n) }

func ipvsSlice(eps ...ipvsEP) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "lab", Name: "web-1", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(int32(8080)), Protocol: ptr(corev1.ProtocolTCP)}},
	}
	for _, e := range eps {
		ep := discoveryv1.Endpoint{
			Addresses: []string{fmt.Sprintf("10.244.0.%d", e.n)},
			NodeName:  ptr(e.node),
			Conditions: discoveryv1.EndpointConditions{
				Ready: ptr(!e.terminating), Serving: ptr(true), Terminating: ptr(e.terminating),
			},
		}
		if e.zoneHint != "" {
			ep.Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: e.zoneHint}}}
		}
		s.Endpoints = append(s.Endpoints, ep)
	}
	return s
}

func ptr[T any](v T) *T { return &v }

// vs is a virtual server of the web Service's port at addr:port holding the real servers rs.
func vs(addr string, port uint16, rs ...ipvs.RealServer) ipvs.VirtualServer {
	return ipvs.VirtualServer{Key: ipvs.Key{Addr: netip.MustParseAddr(addr), Port: port, Protocol: "TCP"}, RealServers: rs}
}

// rs is a real server 10.244.0.<n>:8080 as kube-proxy adds it (weight 1).
func rs(n int) ipvs.RealServer {
	return ipvs.RealServer{Addr: netip.MustParseAddrPort(fmt.Sprintf("10.244.0.%d:8080", n)), Weight: 1}
}

// draining is a real server kube-proxy keeps at weight 0 while its connections end.
func draining(n int, conns uint32) ipvs.RealServer {
	r := rs(n)
	r.Weight, r.ActiveConns = 0, conns
	return r
}

func rsOf(ns ...int) []ipvs.RealServer {
	var out []ipvs.RealServer
	for _, n := range ns {
		out = append(out, rs(n))
	}
	return out
}

// ipvsCheck compares the Service's ports, as kube-proxy of version v computes them, with the
// virtual servers read at the two reads (the second a minute later), past the grace period.
func ipvsCheck(t *testing.T, v string, svc *corev1.Service, slice *discoveryv1.EndpointSlice, reads ...[]ipvs.VirtualServer) checkResult {
	t.Helper()
	version, ok := proxyversion.Parse(v)
	if !ok {
		t.Fatalf("version %q", v)
	}
	ports := cluster.ServicePortsFor(version, svc, []*discoveryv1.EndpointSlice{slice}, ipvsNode, ipvsZone)
	snap := &cluster.Snapshot{Ports: ports, Synced: true, Fresh: true, LastHeard: heardAtEveryCheck}
	bound := []netip.Addr{netip.MustParseAddr("10.96.0.80"), netip.MustParseAddr("203.0.113.7")}
	e := newDriftEngine(time.Minute)
	var table *ipvs.Table
	var res checkResult
	at := time.Unix(1000, 0)
	for i, servers := range reads {
		table = ipvs.NewTable(table, slices.Clone(servers), bound, at)
		st := &hostrules.State{Seq: uint64(i + 1), Mode: hostrules.ModeIPVS, Backend: hostrules.BackendIPVS, IPVS: table}
		res = e.check(snap, programmedByFamily(st), at)
		at = at.Add(61 * time.Second)
		res = e.check(snap, programmedByFamily(st), at)
	}
	if res.checked != len(ports) {
		t.Errorf("checked %d service ports, want %d", res.checked, len(ports))
	}
	return res
}

// wantDrift checks res's one drifting port (or none, with no addresses given).
func wantDrift(t *testing.T, res checkResult, stale, missing []string) {
	t.Helper()
	if len(stale)+len(missing) == 0 {
		if len(res.drifting) != 0 {
			t.Errorf("drift %+v, want none", res.drifting)
		}
		return
	}
	if len(res.drifting) != 1 {
		t.Fatalf("%d drifting ports, want 1: %+v", len(res.drifting), res.drifting)
	}
	d := res.drifting[0]
	str := func(eps []netip.AddrPort) []string {
		var out []string
		for _, ep := range eps {
			out = append(out, ep.String())
		}
		return out
	}
	if !slices.Equal(str(d.staleAddrs), stale) || !slices.Equal(str(d.missingAddrs), missing) {
		t.Errorf("stale %v missing %v, want %v and %v", d.staleAddrs, d.missingAddrs, stale, missing)
	}
}

func TestIPVSDrift(t *testing.T) {
	ready3 := ipvsSlice(ipvsEP{n: 1, node: ipvsNode}, ipvsEP{n: 2, node: "node-b"}, ipvsEP{n: 3, node: "node-b"})
	cases := []struct {
		name           string
		svc            *corev1.Service
		slice          *discoveryv1.EndpointSlice
		reads          [][]ipvs.VirtualServer
		stale, missing []string
	}{
		{
			name: "cluster IP in step", svc: ipvsService(), slice: ready3,
			reads: [][]ipvs.VirtualServer{{vs("10.96.0.80", webPort, rsOf(1, 2, 3)...)}},
		},
		{
			name: "a deleted endpoint kept and a new one not added (a cut-off kube-proxy)", svc: ipvsService(), slice: ready3,
			reads: [][]ipvs.VirtualServer{{vs("10.96.0.80", webPort, rsOf(1, 2, 4)...)}},
			stale: []string{"10.244.0.4:8080"}, missing: []string{"10.244.0.3:8080"},
		},
		{
			name: "a removed endpoint draining at weight 0 with connections", svc: ipvsService(), slice: ready3,
			reads: [][]ipvs.VirtualServer{
				{vs("10.96.0.80", webPort, rs(1), rs(2), rs(3), draining(4, 2))},
				{vs("10.96.0.80", webPort, rs(1), rs(2), rs(3), draining(4, 1))},
			},
		},
		{
			name: "a removed endpoint at weight 0 without connections, past kube-proxy's deletion", svc: ipvsService(), slice: ready3,
			reads: [][]ipvs.VirtualServer{
				{vs("10.96.0.80", webPort, rs(1), rs(2), rs(3), draining(4, 0))},
				{vs("10.96.0.80", webPort, rs(1), rs(2), rs(3), draining(4, 0))},
				{vs("10.96.0.80", webPort, rs(1), rs(2), rs(3), draining(4, 0))},
			},
			stale: []string{"10.244.0.4:8080"},
		},
		{
			name: "the virtual server of a Service kube-proxy never saw", svc: ipvsService(), slice: ready3,
			reads:   [][]ipvs.VirtualServer{{}},
			missing: []string{"10.244.0.1:8080", "10.244.0.2:8080", "10.244.0.3:8080"},
		},
		{
			name: "terminating endpoints are not used while ready ones exist", svc: ipvsService(),
			slice: ipvsSlice(ipvsEP{n: 1, node: ipvsNode}, ipvsEP{n: 2, node: "node-b", terminating: true}),
			reads: [][]ipvs.VirtualServer{{vs("10.96.0.80", webPort, rsOf(1)...)}},
		},
		{
			name: "serving terminating endpoints when none is ready", svc: ipvsService(),
			slice: ipvsSlice(ipvsEP{n: 1, node: ipvsNode, terminating: true}, ipvsEP{n: 2, node: "node-b", terminating: true}),
			reads: [][]ipvs.VirtualServer{{vs("10.96.0.80", webPort, rsOf(1, 2)...)}},
		},
		{
			name: "topology hints: this zone's endpoints", svc: ipvsService(),
			slice: ipvsSlice(ipvsEP{n: 1, node: ipvsNode, zoneHint: ipvsZone}, ipvsEP{n: 2, node: "node-b", zoneHint: "zone-b"}, ipvsEP{n: 3, node: "node-c", zoneHint: ipvsZone}),
			reads: [][]ipvs.VirtualServer{{vs("10.96.0.80", webPort, rsOf(1, 3)...)}},
		},
		{
			name: "topology hints: another zone's endpoint held is stale", svc: ipvsService(),
			slice: ipvsSlice(ipvsEP{n: 1, node: ipvsNode, zoneHint: ipvsZone}, ipvsEP{n: 2, node: "node-b", zoneHint: "zone-b"}),
			reads: [][]ipvs.VirtualServer{{vs("10.96.0.80", webPort, rsOf(1, 2)...)}},
			stale: []string{"10.244.0.2:8080"},
		},
		{
			name: "session affinity: a persistent virtual server holds the same endpoints",
			svc: ipvsService(func(s *corev1.Service) {
				s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
			}), slice: ready3,
			reads: [][]ipvs.VirtualServer{{func() ipvs.VirtualServer {
				v := vs("10.96.0.80", webPort, rsOf(1, 2, 3)...)
				v.Persistent, v.Timeout = true, 10800
				return v
			}()}},
		},
		{
			name: "NodePort with externalTrafficPolicy Local: the node port holds this node's endpoints",
			svc:  ipvsService(nodePort, externalLocal), slice: ready3,
			reads: [][]ipvs.VirtualServer{{vs("10.96.0.80", webPort, rsOf(1, 2, 3)...), vs(nodeAddr, webNodePrt, rsOf(1)...)}},
		},
		{
			name: "NodePort with externalTrafficPolicy Local: a remote endpoint in the node port is stale",
			svc:  ipvsService(nodePort, externalLocal), slice: ready3,
			reads: [][]ipvs.VirtualServer{{vs("10.96.0.80", webPort, rsOf(1, 2, 3)...), vs(nodeAddr, webNodePrt, rsOf(1, 2)...)}},
			stale: []string{"10.244.0.2:8080"},
		},
		{
			name:  "externalTrafficPolicy Local without a local endpoint: the node port holds the cluster endpoints",
			svc:   ipvsService(nodePort, externalLocal),
			slice: ipvsSlice(ipvsEP{n: 2, node: "node-b"}, ipvsEP{n: 3, node: "node-b"}),
			reads: [][]ipvs.VirtualServer{{vs("10.96.0.80", webPort, rsOf(2, 3)...), vs(nodeAddr, webNodePrt, rsOf(2, 3)...)}},
		},
		{
			name: "NodePort with externalTrafficPolicy Cluster: every node address holds all endpoints",
			svc:  ipvsService(nodePort), slice: ready3,
			reads:   [][]ipvs.VirtualServer{{vs("10.96.0.80", webPort, rsOf(1, 2, 3)...), vs(nodeAddr, webNodePrt, rsOf(1, 2, 3)...), vs("10.0.0.5", webNodePrt, rsOf(1, 2)...)}},
			missing: []string{"10.244.0.3:8080"},
		},
		{
			name: "internalTrafficPolicy Local: the cluster IP holds this node's endpoints",
			svc:  ipvsService(internalLocal), slice: ready3,
			reads: [][]ipvs.VirtualServer{{vs("10.96.0.80", webPort, rsOf(1)...)}},
		},
		{
			name: "internalTrafficPolicy Local without a local endpoint: nothing",
			svc:  ipvsService(internalLocal), slice: ipvsSlice(ipvsEP{n: 2, node: "node-b"}),
			reads: [][]ipvs.VirtualServer{{vs("10.96.0.80", webPort)}},
		},
		{
			name: "an external IP holds the cluster endpoints",
			svc: ipvsService(func(s *corev1.Service) {
				s.Spec.ExternalIPs = []string{"203.0.113.7"}
			}), slice: ready3,
			reads:   [][]ipvs.VirtualServer{{vs("10.96.0.80", webPort, rsOf(1, 2, 3)...), vs("203.0.113.7", webPort, rsOf(1, 3)...)}},
			missing: []string{"10.244.0.2:8080"},
		},
	}
	for _, v := range ipvsVersions {
		for _, tc := range cases {
			t.Run(v+"/"+tc.name, func(t *testing.T) {
				wantDrift(t, ipvsCheck(t, v, tc.svc, tc.slice, tc.reads...), tc.stale, tc.missing)
			})
		}
	}
}

// Virtual servers no Service port accounts for are orphans; an IPVS read that failed
// compares nothing.
func TestIPVSOrphansAndFamilies(t *testing.T) {
	table := ipvs.NewTable(nil, []ipvs.VirtualServer{vs("10.96.0.99", 443, rsOf(1)...), vs("10.96.0.80", webPort, rsOf(1)...)},
		[]netip.Addr{netip.MustParseAddr("10.96.0.80")}, time.Unix(1000, 0))
	byFamily := programmedByFamily(&hostrules.State{Mode: hostrules.ModeIPVS, IPVS: table})
	if _, ok := byFamily[true]; ok || byFamily[false] == nil {
		t.Fatalf("families %v: want IPv4 only", byFamily)
	}
	ports := cluster.ServicePorts(ipvsService(), []*discoveryv1.EndpointSlice{ipvsSlice(ipvsEP{n: 1, node: ipvsNode})}, ipvsNode, ipvsZone)
	res := newDriftEngine(0).check(&cluster.Snapshot{Ports: ports, Fresh: true, Synced: true, LastHeard: heardAtEveryCheck}, byFamily, time.Unix(1000, 0))
	if res.orphans != 1 || len(res.drifting) != 0 {
		t.Errorf("orphans %d drifting %v: want 1 and none", res.orphans, res.drifting)
	}
	if got := programmedByFamily(&hostrules.State{Mode: hostrules.ModeIPVS}); len(got) != 0 {
		t.Errorf("an unread IPVS: families %v", got)
	}
}

// generateIPVS is services virtual servers of endpoints real servers each, one per cluster IP,
// as kube-proxy's IPVS mode programs ClusterIP Services, and the matching API view.
func generateIPVS(services, endpoints int) ([]ipvs.VirtualServer, []netip.Addr, *cluster.Snapshot) {
	snap := &cluster.Snapshot{Synced: true, Fresh: true}
	servers := make([]ipvs.VirtualServer, 0, services)
	bound := make([]netip.Addr, 0, services)
	for s := range services {
		name := cluster.ServicePortName{Namespace: fmt.Sprintf("ns%d", s%100), Name: fmt.Sprintf("svc%d", s), Port: "http", Protocol: "TCP"}
		vip := netip.AddrFrom4([4]byte{10, 96, byte(s >> 8), byte(s)})
		sp := &cluster.ServicePort{Name: name, ClusterIPs: []netip.Addr{vip}, Port: 80}
		v := ipvs.VirtualServer{Key: ipvs.Key{Addr: vip, Port: 80, Protocol: "TCP"}, Scheduler: "rr"}
		for e := range endpoints {
			ep := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(128 + s>>13), byte(s >> 5), byte(s<<3 | e&7)}), uint16(8080+e))
			sp.ClusterEndpoints = append(sp.ClusterEndpoints, ep)
			v.RealServers = append(v.RealServers, ipvs.RealServer{Addr: ep, Weight: 1})
		}
		slices.SortFunc(sp.ClusterEndpoints, netip.AddrPort.Compare)
		slices.SortFunc(v.RealServers, func(a, b ipvs.RealServer) int { return a.Addr.Compare(b.Addr) })
		snap.Ports = append(snap.Ports, sp)
		servers = append(servers, v)
		bound = append(bound, vip)
	}
	slices.SortFunc(servers, func(a, b ipvs.VirtualServer) int { return a.Key.Compare(b.Key) })
	return servers, bound, snap
}

func TestGeneratedIPVSHasNoDrift(t *testing.T) {
	servers, bound, snap := generateIPVS(50, 10)
	table := ipvs.NewTable(nil, servers, bound, time.Unix(1, 0))
	res := newDriftEngine(0).check(snap, virtualServersByFamily(table), time.Unix(1, 0))
	if res.checked != 50 || len(res.drifting) != 0 || res.orphans != 0 {
		t.Errorf("checked %d drifting %d orphans %d, want 50, 0, 0", res.checked, len(res.drifting), res.orphans)
	}
}

// BenchmarkIPVSIndexAndCompare measures the exporter's side of a drift check in IPVS mode after
// a read: indexing the dump (ipvs.NewTable, with the previous read for drain times) and
// comparing every virtual server with the API view (a new table shares nothing with the last
// check's). The dump itself needs ip_vs (internal/ipvs's kernel test, in the kernel matrix).
// go test -bench IPVSIndexAndCompare -benchtime 20x ./collectors/rules (10,000 x 10).
func BenchmarkIPVSIndexAndCompare(b *testing.B) {
	services := 10000
	if testing.Short() {
		services = 200
	}
	servers, bound, snap := generateIPVS(services, 10)
	b.ReportAllocs()
	e := newDriftEngine(time.Minute)
	var prev *ipvs.Table
	at := time.Unix(1, 0)
	for b.Loop() {
		prev = ipvs.NewTable(prev, servers, bound, at)
		res := e.check(snap, virtualServersByFamily(prev), at)
		if res.checked != services || len(res.drifting) != 0 {
			b.Fatalf("checked %d drifting %d", res.checked, len(res.drifting))
		}
		at = at.Add(time.Second)
	}
}

// The collector in IPVS mode: the same series as in the other modes, mode ipvs; an IPVS that
// cannot be read fails the collector with the reason and still says the mode.
func TestCollectorIPVSExposition(t *testing.T) {
	view := fakeView{snapshot(dnsPort("10.244.1.5:53", "10.244.2.6:53", "10.244.4.1:53"), kubernetesPort())}
	udp := func(addr string, port uint16, eps ...string) ipvs.VirtualServer {
		v := ipvs.VirtualServer{Key: ipvs.Key{Addr: netip.MustParseAddr(addr), Port: port, Protocol: "UDP"}}
		for _, ep := range eps {
			v.RealServers = append(v.RealServers, ipvs.RealServer{Addr: netip.MustParseAddrPort(ep), Weight: 1})
		}
		return v
	}
	api := kubernetesPort()
	apiServer := ipvs.VirtualServer{Key: ipvs.Key{Addr: api.ClusterIPs[0], Port: api.Port, Protocol: "TCP"}}
	for _, ep := range api.ClusterEndpoints {
		apiServer.RealServers = append(apiServer.RealServers, ipvs.RealServer{Addr: ep, Weight: 1})
	}
	// kube-dns's virtual server kept a deleted endpoint and lacks a new one.
	table := ipvs.NewTable(nil, []ipvs.VirtualServer{apiServer, udp("10.96.0.10", 53, "10.244.1.5:53", "10.244.2.6:53", "10.244.3.7:53")},
		[]netip.Addr{netip.MustParseAddr("10.96.0.10"), api.ClusterIPs[0]}, time.Unix(4000, 0))
	st := &hostrules.State{Seq: 1, Mode: hostrules.ModeIPVS, Backend: hostrules.BackendIPVS, IPVS: table}
	c := checkedOnce(t, view, fakeRules{st})
	want := `
# TYPE proxyhealth_proxy_mode gauge
proxyhealth_proxy_mode{mode="iptables"} 0
proxyhealth_proxy_mode{mode="ipvs"} 1
proxyhealth_proxy_mode{mode="nftables"} 0
proxyhealth_proxy_mode{mode="none"} 0
# TYPE proxyhealth_rules_endpoints_missing gauge
proxyhealth_rules_endpoints_missing 1
# TYPE proxyhealth_rules_endpoints_stale gauge
proxyhealth_rules_endpoints_stale 1
# TYPE proxyhealth_rules_orphan_chains gauge
proxyhealth_rules_orphan_chains 0
# TYPE proxyhealth_rules_services_checked gauge
proxyhealth_rules_services_checked 2
# TYPE proxyhealth_rules_services_drifted gauge
proxyhealth_rules_services_drifted 1
# TYPE proxyhealth_service_drift_endpoints gauge
proxyhealth_service_drift_endpoints{kind="missing",protocol="udp",service_name="kube-dns",service_namespace="kube-system",service_port="53"} 1
proxyhealth_service_drift_endpoints{kind="stale",protocol="udp",service_name="kube-dns",service_namespace="kube-system",service_port="53"} 1
`
	if err := scrape(t, c).Compare(want,
		"proxyhealth_proxy_mode", "proxyhealth_rules_endpoints_missing", "proxyhealth_rules_endpoints_stale", "proxyhealth_rules_orphan_chains",
		"proxyhealth_rules_services_checked", "proxyhealth_rules_services_drifted", "proxyhealth_service_drift_endpoints"); err != nil {
		t.Error(err)
	}

	// IPVS unreadable: the reason, the mode, nothing compared.
	c.cfg.Rules = fakeRules{&hostrules.State{Seq: 2, Mode: hostrules.ModeIPVS, Backend: hostrules.BackendIPVS, ProxyErr: ipvs.ErrNotLoaded}}
	c.check()
	s, err := collectortest.Collect(t, c)
	if !errors.Is(err, ipvs.ErrNotLoaded) {
		t.Errorf("Update error %v, want the IPVS read's", err)
	}
	if err := s.Compare(`
# TYPE proxyhealth_proxy_mode gauge
proxyhealth_proxy_mode{mode="iptables"} 0
proxyhealth_proxy_mode{mode="ipvs"} 1
proxyhealth_proxy_mode{mode="nftables"} 0
proxyhealth_proxy_mode{mode="none"} 0
# TYPE proxyhealth_rules_services_drifted gauge
proxyhealth_rules_services_drifted 0
`, "proxyhealth_proxy_mode", "proxyhealth_rules_services_drifted"); err != nil {
		t.Error(err)
	}
}

// The drift of a virtual server names it: a node port's virtual server that kept a deleted
// remote endpoint, while the cluster IP's agrees with the API.
func TestIPVSDriftNamesTheVirtualServer(t *testing.T) {
	ready3 := ipvsSlice(ipvsEP{n: 1, node: ipvsNode}, ipvsEP{n: 2, node: "node-b"}, ipvsEP{n: 3, node: "node-b"})
	res := ipvsCheck(t, "v1.37.2", ipvsService(nodePort), ready3, []ipvs.VirtualServer{
		vs("10.96.0.80", webPort, rsOf(1, 2, 3)...),
		vs(nodeAddr, webNodePrt, rsOf(1, 2, 3, 4)...),
		vs("10.0.0.5", webNodePrt, rsOf(1, 2, 3, 4)...),
	})
	wantDrift(t, res, []string{"10.244.0.4:8080"}, nil)
	c := &Collector{cfg: Config{View: fakeView{&cluster.Snapshot{Fresh: true}}}, now: time.Now, last: &res}
	c.last.at = time.Now()
	c.cfg.CheckInterval = time.Minute
	d := c.LastCheck().Drifting
	if len(d) != 1 || len(d[0].StaleInServers) != 1 || !slices.Equal(d[0].StaleInServers[0], []string{"10.0.0.5:30080/TCP", nodeAddr + ":30080/TCP"}) {
		t.Errorf("stale in %+v, want both node port virtual servers", d)
	}
	if len(d) == 1 && d[0].MissingFromServers != nil {
		t.Errorf("missing from %v, want nothing", d[0].MissingFromServers)
	}
}
