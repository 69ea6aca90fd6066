package conntrack

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/promslog"
	"golang.org/x/sys/unix"

	"github.com/proxyhealth/proxyhealth/collectors/collectortest"
	"github.com/proxyhealth/proxyhealth/internal/cluster"
)

var webService = Service{Namespace: "lab", Name: "web", Port: 80}

// labView attributes 10.96.0.10:80/tcp to lab/web, with cni0 on 10.244.1.0/24 and a pod routed
// per host route at 10.244.9.9.
func labView() *attributionView {
	return &attributionView{
		services: serviceMap{{vip, 80, 6}: webService},
		net: &localNet{
			bridges: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")},
			local:   []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("10.244.9.9/32")},
		},
	}
}

func event(typ eventType, id, status uint32, orig, reply tuple) *flowEvent {
	return &flowEvent{typ: typ, id: id, status: status, hasStatus: true, orig: orig, reply: reply}
}

// dumpOf is a table dump of events.
func dumpOf(events ...*flowEvent) func(fn func(*flowEvent)) error {
	return func(fn func(*flowEvent)) error {
		for _, ev := range events {
			fn(ev)
		}
		return nil
	}
}

func TestTrackerCountsUnrepliedDestroy(t *testing.T) {
	tr := newFlowTracker(10, 10)
	view := labView()
	orig, reply := dnatTuples(1000)
	tr.handle(event(eventNew, 1, statusDstNAT, orig, reply), 0, view)
	tr.handle(event(eventDestroy, 1, statusDstNAT, orig, reply), 1, view)

	// A replied flow and a flow that was never DNAT'ed do not count.
	orig2, reply2 := dnatTuples(1001)
	tr.handle(event(eventNew, 2, statusDstNAT, orig2, reply2), 0, view)
	tr.handle(event(eventUpdate, 2, statusDstNAT|statusSeenReply, orig2, reply2), 1, view)
	tr.handle(event(eventDestroy, 2, statusDstNAT|statusSeenReply, orig2, reply2), 2, view)
	plain := tuple{src: client, dst: endpoint, srcPort: 5, dstPort: 8080, proto: 6}
	plainReply := tuple{src: endpoint, dst: client, srcPort: 8080, dstPort: 5, proto: 6}
	tr.handle(event(eventDestroy, 3, 0, plain, plainReply), 2, view)

	s := tr.snapshot(0, view)
	want := []seriesCount{{seriesKey{webService, 6, reasonSameBridge}, 1}}
	if len(s.unreplied) != 1 || s.unreplied[0] != want[0] {
		t.Errorf("unreplied = %+v, want %+v", s.unreplied, want)
	}
	if s.tracked != 0 {
		t.Errorf("tracked = %d after every flow ended, want 0", s.tracked)
	}
}

func TestTrackerOpenUnreplied(t *testing.T) {
	tr := newFlowTracker(10, 10)
	view := labView()
	orig, reply := dnatTuples(1000)
	tr.handle(event(eventNew, 1, statusDstNAT, orig, reply), 100, view)
	// Retransmitted SYNs update the flow without a reply: it stays tracked from its first event.
	tr.handle(event(eventUpdate, 1, statusDstNAT, orig, reply), 200, view)
	if got := tr.snapshot(99, view).open; len(got) != 0 {
		t.Errorf("open before unreplied-after = %+v, want none", got)
	}
	got := tr.snapshot(150, view).open
	if len(got) != 1 || got[0].value != 1 || got[0].key.reason != reasonSameBridge {
		t.Errorf("open = %+v, want one same_bridge flow", got)
	}
	tr.handle(event(eventUpdate, 1, statusDstNAT|statusSeenReply, orig, reply), 300, view)
	if got := tr.snapshot(1000, view).open; len(got) != 0 {
		t.Errorf("open after reply = %+v, want none", got)
	}
}

func TestTrackerReasons(t *testing.T) {
	view := labView()
	cases := []struct {
		name     string
		dst      netip.Addr
		endpoint string
		want     reason
	}{
		{"same bridge", vip, "10.244.1.3", reasonSameBridge},
		{"local host route", vip, "10.244.9.9", reasonLocalEndpoint},
		{"remote", vip, "10.244.2.2", reasonRemoteEndpoint},
		{"no service", netip.MustParseAddr("10.96.7.7"), "10.244.1.3", reasonNoService},
	}
	for i, tc := range cases {
		orig := tuple{src: client, dst: tc.dst, srcPort: uint16(i + 1), dstPort: 80, proto: 6}
		reply := tuple{src: netip.MustParseAddr(tc.endpoint), dst: client, srcPort: 8080, dstPort: uint16(i + 1), proto: 6}
		if got := view.attribute(&orig, &reply).reason; got != tc.want {
			t.Errorf("%s: reason %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestTrackerBoundsMemory(t *testing.T) {
	tr := newFlowTracker(3, 1)
	view := labView()
	for id := uint32(1); id <= 5; id++ {
		orig, reply := dnatTuples(uint16(id))
		tr.handle(event(eventNew, id, statusDstNAT, orig, reply), 0, view)
	}
	s := tr.snapshot(0, view)
	if s.tracked != 3 || s.untracked != 2 {
		t.Errorf("tracked %d untracked %d, want 3 and 2", s.tracked, s.untracked)
	}
	// Untracked flows still count when they end unreplied.
	orig, reply := dnatTuples(5)
	tr.handle(event(eventDestroy, 5, statusDstNAT, orig, reply), 1, view)
	// A second Service beyond the series cap goes to the unlisted counter.
	other := Service{Namespace: "lab", Name: "other", Port: 81}
	view.services.(serviceMap)[serviceKey{vip, 81, 6}] = other
	orig.dstPort = 81
	tr.handle(event(eventDestroy, 9, statusDstNAT, orig, reply), 1, view)
	s = tr.snapshot(0, view)
	if len(s.unreplied) != 1 || s.unreplied[0].value != 1 {
		t.Errorf("unreplied = %+v, want only lab/web once", s.unreplied)
	}
	if len(s.unlisted) != 1 || s.unlisted[0].value != 1 || s.unlisted[0].key != (overflowKey{6, reasonSameBridge}) {
		t.Errorf("unlisted = %+v, want one tcp same_bridge", s.unlisted)
	}
}

// The unreplied series of a Service deleted from the view are dropped once they have not moved
// for serviceSeriesIdle, and their place under the cap goes to a new Service; a Service still
// in the view, and flows of no Service, keep theirs.
func TestTrackerFreesSeriesOfDeletedServices(t *testing.T) {
	web := webService
	old := Service{Namespace: "lab", Name: "old", Port: 81}
	added := Service{Namespace: "lab", Name: "new", Port: 82}
	viewOf := func(svcs ...Service) *attributionView {
		v := labView()
		m := serviceMap{}
		for _, svc := range svcs {
			m[serviceKey{vip, svc.Port, 6}] = svc
		}
		v.services = m
		return v
	}
	// The cap holds lab/web, lab/old and the no_service series: len counts them all.
	tr := newFlowTracker(10, 3)
	id := uint32(0)
	// endUnreplied ends a new flow to port, unreplied, attributed by view.
	endUnreplied := func(port uint16, view *attributionView) {
		id++
		orig, reply := dnatTuples(uint16(id))
		orig.dstPort = port
		tr.handle(event(eventDestroy, id, statusDstNAT, orig, reply), 0, view)
	}
	counts := func(s snapshot) map[seriesKey]uint64 {
		m := make(map[seriesKey]uint64)
		for _, c := range s.unreplied {
			m[c.key] = c.value
		}
		return m
	}
	unlisted := func(s snapshot) uint64 {
		var n uint64
		for _, c := range s.unlisted {
			n += c.value
		}
		return n
	}
	webKey, oldKey, addedKey := seriesKey{web, 6, reasonSameBridge}, seriesKey{old, 6, reasonSameBridge}, seriesKey{added, 6, reasonSameBridge}
	noServiceKey := seriesKey{Service{}, 6, reasonNoService}

	now := time.Unix(1_700_000_000, 0)
	before := viewOf(web, old)
	endUnreplied(80, before)
	endUnreplied(81, before)
	endUnreplied(9, before) // no Service
	tr.prune(now, before)
	tr.snapshot(0, before)

	// lab/old is deleted and lab/new created; a flow of lab/old that ended just before the
	// view changed moves its series once more.
	after := viewOf(web, added)
	endUnreplied(81, before)
	endUnreplied(82, after)
	tr.prune(now, after)
	s := tr.snapshot(0, after)
	if c := counts(s); unlisted(s) != 1 || c[oldKey] != 2 {
		t.Fatalf("before a pass: counts %v, unlisted %d; want lab/new unlisted, lab/old kept", c, unlisted(s))
	}
	// Not dropped while it moved since the last pass.
	now = now.Add(serviceSeriesIdle)
	tr.prune(now, after)
	if c := counts(tr.snapshot(0, after)); c[oldKey] != 2 {
		t.Fatalf("lab/old dropped although it moved since the last pass: %v", c)
	}
	now = now.Add(serviceSeriesIdle - time.Second)
	tr.prune(now, after)
	if c := counts(tr.snapshot(0, after)); c[oldKey] != 2 {
		t.Fatalf("a pass before serviceSeriesIdle passed: %v", c)
	}
	now = now.Add(time.Second)
	tr.prune(now, after)
	c := counts(tr.snapshot(0, after))
	if _, listed := c[oldKey]; listed || c[webKey] != 1 || c[noServiceKey] != 1 {
		t.Fatalf("after the deleted Service was idle: %v; want lab/old dropped, lab/web and no_service kept", c)
	}
	endUnreplied(82, after)
	if s := tr.snapshot(0, after); counts(s)[addedKey] != 1 || unlisted(s) != 1 {
		t.Errorf("the new Service did not take the freed place: counts %v, unlisted %d", counts(s), unlisted(s))
	}
}

// With no Services in the view nothing is dropped.
func TestTrackerKeepsSeriesWhileViewEmpty(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	tr := newFlowTracker(10, 2)
	orig, reply := dnatTuples(1)
	tr.handle(event(eventDestroy, 1, statusDstNAT, orig, reply), 0, labView())
	empty := labView()
	empty.services = serviceMap{}
	for range 3 {
		tr.prune(now, empty)
		now = now.Add(serviceSeriesIdle)
	}
	if s := tr.snapshot(0, empty); len(s.unreplied) != 1 || s.unreplied[0].value != 1 {
		t.Errorf("dropped with an empty view: %+v", s.unreplied)
	}
}

func TestTrackerResync(t *testing.T) {
	tr := newFlowTracker(10, 10)
	view := labView()
	o1, r1 := dnatTuples(1)
	o2, r2 := dnatTuples(2)
	o3, r3 := dnatTuples(3)
	tr.handle(event(eventNew, 1, statusDstNAT, o1, r1), 10, view)
	tr.handle(event(eventNew, 2, statusDstNAT, o2, r2), 10, view)
	// The table now has flow 1 (still unreplied), flow 2 answered, and flow 3 we never saw.
	err := tr.resync(dumpOf(
		event(eventNone, 1, statusDstNAT, o1, r1),
		event(eventNone, 2, statusDstNAT|statusSeenReply, o2, r2),
		event(eventNone, 3, statusDstNAT, o3, r3),
	), 50, false)
	if err != nil {
		t.Fatal(err)
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if f := tr.flows.flows; len(f) != 2 || f[1].since != 10 || f[3].since != 50 {
		t.Errorf("after resync: %+v, want flow 1 since 10 and flow 3 since 50", f)
	}
}

func TestCollectorExposition(t *testing.T) {
	cfg := Config{ProcPath: "testdata/proc-full", UnrepliedAfter: time.Second, MaxTrackedFlows: 10, MaxServiceSeries: 10, SocketBufferBytes: 1 << 20, ServiceRefreshInterval: time.Minute, TableStats: true}
	c, err := New(cfg, promslog.NewNopLogger())
	if err != nil {
		t.Fatal(err)
	}
	c.stats = func() (tableStats, error) {
		return tableStats{entries: 5, limit: 262144, cpu: cpuStats{invalid: 50, insertFailed: 1, drop: 2, earlyDrop: 3}}, nil
	}
	c.view.Store(labView())
	orig, reply := dnatTuples(1)
	c.tracker.handle(event(eventNew, 1, statusDstNAT, orig, reply), time.Now().Add(-time.Hour).UnixNano(), c.view.Load())
	orig2, reply2 := dnatTuples(2)
	c.tracker.handle(event(eventDestroy, 2, statusDstNAT, orig2, reply2), time.Now().UnixNano(), c.view.Load())

	want := `
# TYPE proxyhealth_conntrack_entries gauge
proxyhealth_conntrack_entries 5
# TYPE proxyhealth_conntrack_invalid_packets_total counter
proxyhealth_conntrack_invalid_packets_total 50
# TYPE proxyhealth_conntrack_open_unreplied_flows gauge
proxyhealth_conntrack_open_unreplied_flows{protocol="tcp",reason="same_bridge",service_name="web",service_namespace="lab",service_port="80"} 1
# TYPE proxyhealth_conntrack_unreplied_flows_total counter
proxyhealth_conntrack_unreplied_flows_total{protocol="tcp",reason="same_bridge",service_name="web",service_namespace="lab",service_port="80"} 1
`
	got, _ := collectortest.Collect(t, c)
	if err := got.Compare(want,
		"proxyhealth_conntrack_entries", "proxyhealth_conntrack_invalid_packets_total",
		"proxyhealth_conntrack_open_unreplied_flows", "proxyhealth_conntrack_unreplied_flows_total"); err != nil {
		t.Error(err)
	}

	c.stats = func() (tableStats, error) { return tableStats{}, describeNetlinkError("x", unix.EPERM) }
	if err := c.Update(make(chan prometheus.Metric, 100)); err == nil || !strings.Contains(err.Error(), "CAP_NET_ADMIN") {
		t.Errorf("Update with stats refused = %v, want an error naming CAP_NET_ADMIN", err)
	}
}

// TestTableStatsOff: --no-conntrack.table-stats leaves out exactly the series node_exporter's
// conntrack collector also exports (node_nf_conntrack_entries, _entries_limit and
// _stat_{found,invalid,ignore,insert,insert_failed,drop,early_drop,search_restart}); the
// kernel's error counter, which node_exporter lacks, and the event-stream series stay.
func TestTableStatsOff(t *testing.T) {
	series := func(exportTableStats bool) map[string]bool {
		cfg := Config{ProcPath: "testdata/proc-full", UnrepliedAfter: time.Second, MaxTrackedFlows: 10, MaxServiceSeries: 10, SocketBufferBytes: 1 << 20, ServiceRefreshInterval: time.Minute, TableStats: exportTableStats}
		c, err := New(cfg, promslog.NewNopLogger())
		if err != nil {
			t.Fatal(err)
		}
		c.stats = func() (tableStats, error) {
			return tableStats{entries: 5, limit: 262144, cpu: cpuStats{invalid: 50, error: 7}}, nil
		}
		names := map[string]bool{}
		for _, name := range collectortest.CollectOK(t, c).Names() {
			names[name] = true
		}
		return names
	}
	on, off := series(true), series(false)
	overlap := []string{"entries", "entries_limit", "found_total", "invalid_packets_total", "ignore_total", "insert_total",
		"insert_failed_total", "drop_total", "early_drop_total", "search_restart_total"}
	for _, name := range overlap {
		name = "proxyhealth_conntrack_" + name
		if !on[name] {
			t.Errorf("with table stats on, %s is missing", name)
		}
		if off[name] {
			t.Errorf("with table stats off, %s is still exported", name)
		}
	}
	for name := range on {
		if !off[name] && !slices.Contains(overlap, strings.TrimPrefix(name, "proxyhealth_conntrack_")) {
			t.Errorf("with table stats off, %s is gone too", name)
		}
	}
	if !off["proxyhealth_conntrack_error_total"] || !off["proxyhealth_conntrack_events_total"] {
		t.Errorf("with table stats off, error_total or events_total is gone: %v", off)
	}
}

func TestTrackerSilentFlows(t *testing.T) {
	tr := newFlowTracker(10, 10)
	view := labView()
	o1, r1 := dnatTuples(1)
	o2, r2 := dnatTuples(2)
	o3, r3 := dnatTuples(3)
	err := tr.resync(dumpOf(
		event(eventNone, 1, statusDstNAT, o1, r1),
		event(eventNone, 2, statusDstNAT, o2, r2),
		event(eventNone, 3, statusDstNAT, o3, r3),
	), 0, true)
	if err != nil {
		t.Fatal(err)
	}
	if !tr.hasSilent() {
		t.Fatal("flows found at start-up are not silent")
	}
	// Flow 3 turns out to send events: it is no longer silent, and its end counts.
	tr.handle(event(eventUpdate, 3, statusDstNAT, o3, r3), 1, view)
	// The table now shows flow 1 still unreplied; flow 2 is gone.
	if err := tr.checkSilent(dumpOf(
		event(eventNone, 1, statusDstNAT, o1, r1),
		event(eventNone, 3, statusDstNAT, o3, r3),
	)); err != nil {
		t.Fatal(err)
	}
	if s := tr.snapshot(0, view); s.tracked != 2 || len(s.unreplied) != 0 {
		t.Errorf("after check: tracked %d unreplied %+v, want 2 tracked and nothing counted", s.tracked, s.unreplied)
	}
	tr.handle(event(eventDestroy, 3, statusDstNAT, o3, r3), 2, view)
	if err := tr.checkSilent(dumpOf()); err != nil {
		t.Fatal(err)
	}
	if tr.hasSilent() {
		t.Error("silent flows left after the table lost them")
	}
	if s := tr.snapshot(0, view); s.tracked != 0 || len(s.unreplied) != 1 || s.unreplied[0].value != 1 {
		t.Errorf("end: tracked %d unreplied %+v, want 0 tracked and flow 3 counted", s.tracked, s.unreplied)
	}
}

type staticView struct{ snap *cluster.Snapshot }

func (v staticView) Snapshot() *cluster.Snapshot { return v.snap }

func TestAPIServiceMap(t *testing.T) {
	snap := &cluster.Snapshot{Synced: true, Ports: []*cluster.ServicePort{{
		Name:       cluster.ServicePortName{Namespace: "kube-system", Name: "kube-dns", Port: "dns", Protocol: "UDP"},
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("fd00:96::a")},
		Port:       53,
	}}}
	m := apiServiceMap(staticView{snap}.Snapshot())
	want := Service{Namespace: "kube-system", Name: "kube-dns", Port: 53}
	for _, ip := range []string{"10.96.0.10", "fd00:96::a"} {
		if got, ok := m.Lookup(netip.MustParseAddr(ip), 53, 17); !ok || got != want {
			t.Errorf("Lookup(%s:53/udp) = %+v, %v; want %+v", ip, got, ok, want)
		}
	}
	if _, ok := m.Lookup(netip.MustParseAddr("10.96.0.10"), 53, 6); ok {
		t.Error("Lookup(10.96.0.10:53/tcp) found the UDP port")
	}

	// Len counts the Service ports known by cluster IP, not their other addresses; a cluster IP
	// keeps its Service when another Service lists it as an external IP.
	withExternal := &cluster.ServicePort{
		Name:        cluster.ServicePortName{Namespace: "lab", Name: "claims-dns", Protocol: "UDP"},
		ClusterIPs:  []netip.Addr{netip.MustParseAddr("10.96.0.99")},
		ExternalIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("192.0.2.99")},
		Port:        53,
		NodePort:    30053,
	}
	m = apiServiceMap(&cluster.Snapshot{Synced: true, Ports: []*cluster.ServicePort{withExternal, snap.Ports[0]}})
	if m.Len() != 3 {
		t.Errorf("Len() = %d, want the 3 cluster IP keys", m.Len())
	}
	if got, _ := m.Lookup(netip.MustParseAddr("10.96.0.10"), 53, 17); got != want {
		t.Errorf("Lookup(10.96.0.10:53/udp) = %+v, want the cluster IP's %+v", got, want)
	}
	claims := Service{Namespace: "lab", Name: "claims-dns", Port: 53}
	if got, ok := m.Lookup(netip.MustParseAddr("192.0.2.99"), 53, 17); !ok || got != claims {
		t.Errorf("Lookup(192.0.2.99:53/udp) = %+v, %v; want %+v", got, ok, claims)
	}
	if got, ok := m.LookupNodePort(netip.MustParseAddr("192.168.0.5"), 30053, 17); !ok || got != claims {
		t.Errorf("node port 30053/udp: %+v, %v; want %+v", got, ok, claims)
	}
	if _, ok := m.LookupNodePort(netip.MustParseAddr("fd00::5"), 30053, 17); ok {
		t.Error("an IPv4-only Service's node port is open over IPv6")
	}
	if _, ok := m.LookupNodePort(netip.MustParseAddr("192.168.0.5"), 30053, 6); ok {
		t.Error("a UDP node port is open over TCP")
	}

	// An endpoint change leaves the map as it is; a changed, added or removed cluster IP,
	// external IP, node port, port or name does not.
	other := &cluster.ServicePort{
		Name:       cluster.ServicePortName{Namespace: "lab", Name: "web", Protocol: "TCP"},
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.52")},
		Port:       80,
	}
	ports := []*cluster.ServicePort{snap.Ports[0], other}
	if !sameServices(ports, ports) {
		t.Error("a view is not the same as itself")
	}
	// A new view's changed port is a new ServicePort (published ones are never modified);
	// the others are shared.
	movedPort := *snap.Ports[0]
	movedPort.ClusterEndpoints = []netip.AddrPort{netip.MustParseAddrPort("10.244.1.5:53")}
	if !sameServices(ports, []*cluster.ServicePort{&movedPort, other}) {
		t.Error("an endpoint change made the map stale")
	}
	for what, change := range map[string]func(sp *cluster.ServicePort){
		"cluster IP": func(sp *cluster.ServicePort) { sp.ClusterIPs = sp.ClusterIPs[:1] },
		"port":       func(sp *cluster.ServicePort) { sp.Port = 5353 },
		"name":       func(sp *cluster.ServicePort) { sp.Name.Name = "coredns" },
		"protocol":   func(sp *cluster.ServicePort) { sp.Name.Protocol = "TCP" },
		"node port":  func(sp *cluster.ServicePort) { sp.NodePort = 30053 },
		"external IP": func(sp *cluster.ServicePort) {
			sp.ExternalIPs = []netip.Addr{netip.MustParseAddr("192.0.2.53")}
		},
	} {
		changedPort := *snap.Ports[0]
		change(&changedPort)
		if sameServices(ports, []*cluster.ServicePort{&changedPort, other}) {
			t.Errorf("a changed %s still counts as the same Services", what)
		}
	}
	if sameServices(ports, ports[:1]) || sameServices(ports, nil) {
		t.Error("a view with a port removed counts as the same Services")
	}
	if sameServices(ports, []*cluster.ServicePort{snap.Ports[0], &movedPort}) {
		t.Error("a port replaced by another counts as the same Services")
	}
}

// Unreplied IPv6 flows are attributed as IPv4 ones are: a dual-stack Service's IPv6 cluster IP
// (from the API view) names the same Service, and the endpoint's place in the node's IPv6
// bridges and routes gives the reason; the two families' flows count in the same series.
func TestTrackerAttributesIPv6(t *testing.T) {
	snap := &cluster.Snapshot{Synced: true, Ports: []*cluster.ServicePort{{
		Name:       cluster.ServicePortName{Namespace: "lab", Name: "web", Port: "http", Protocol: "TCP"},
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("fd00:10:96::a")},
		Port:       80,
	}}}
	view := &attributionView{
		services: apiServiceMap(staticView{snap}.Snapshot()),
		net: &localNet{
			bridges: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd00:10:244:1::/64")},
			local: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd00:10:244:1::/64"),
				netip.MustParsePrefix("fd00:10:244:9::9/128")},
		},
	}
	client6 := netip.MustParseAddr("fd00:10:244:1::2")
	vip6 := netip.MustParseAddr("fd00:10:96::a")
	flow := func(src, dst netip.Addr, endpoint string, port uint16) (orig, reply tuple) {
		orig = tuple{src: src, dst: dst, srcPort: port, dstPort: 80, proto: 6}
		reply = tuple{src: netip.MustParseAddr(endpoint), dst: src, srcPort: 8080, dstPort: port, proto: 6}
		return orig, reply
	}
	for i, tc := range []struct {
		name     string
		dst      netip.Addr
		endpoint string
		want     reason
	}{
		{"same bridge", vip6, "fd00:10:244:1::3", reasonSameBridge},
		{"local host route", vip6, "fd00:10:244:9::9", reasonLocalEndpoint},
		{"remote", vip6, "fd00:10:244:2::2", reasonRemoteEndpoint},
		{"no service", netip.MustParseAddr("fd00:10:96::77"), "fd00:10:244:1::3", reasonNoService},
	} {
		orig, reply := flow(client6, tc.dst, tc.endpoint, uint16(i+1))
		key := view.attribute(&orig, &reply)
		if key.reason != tc.want {
			t.Errorf("%s: reason %v, want %v", tc.name, key.reason, tc.want)
		}
		if tc.want != reasonNoService && key.svc != webService {
			t.Errorf("%s: service %+v, want %+v", tc.name, key.svc, webService)
		}
	}

	// One unreplied flow of each family to the same-bridge endpoint, counted when they end in
	// the one series of lab/web.
	tr := newFlowTracker(10, 10)
	orig4, reply4 := flow(client, vip, "10.244.1.3", 1000)
	orig6, reply6 := flow(client6, vip6, "fd00:10:244:1::3", 1000)
	tr.handle(event(eventNew, 1, statusDstNAT, orig4, reply4), 0, view)
	tr.handle(event(eventNew, 2, statusDstNAT, orig6, reply6), 0, view)
	if open := tr.snapshot(150, view).open; len(open) != 1 || open[0].value != 2 || open[0].key != (seriesKey{webService, 6, reasonSameBridge}) {
		t.Errorf("open = %+v, want the 2 flows as lab/web same_bridge", open)
	}
	tr.handle(event(eventDestroy, 1, statusDstNAT, orig4, reply4), 200, view)
	tr.handle(event(eventDestroy, 2, statusDstNAT, orig6, reply6), 200, view)
	s := tr.snapshot(200, view)
	if want := (seriesCount{seriesKey{webService, 6, reasonSameBridge}, 2}); len(s.unreplied) != 1 || s.unreplied[0] != want {
		t.Errorf("unreplied = %+v, want %+v", s.unreplied, want)
	}
}

func TestTrackerDestroyWithoutStatusUsesTrackedFlow(t *testing.T) {
	tr := newFlowTracker(10, 10)
	view := labView()
	orig, reply := dnatTuples(1)
	tr.handle(event(eventNew, 1, statusDstNAT, orig, reply), 0, view)
	// An end without a status or tuples: the tracked flow says what it was.
	tr.handle(&flowEvent{typ: eventDestroy, id: 1}, 1, view)
	want := seriesCount{view.attribute(&orig, &reply), 1}
	if s := tr.snapshot(1, view); len(s.unreplied) != 1 || s.unreplied[0] != want {
		t.Errorf("unreplied = %+v, want %+v", s.unreplied, want)
	}
}

func TestTrackedFlowKeepsWhatAttributionReads(t *testing.T) {
	for _, tc := range []struct{ client, service, endpoint string }{
		{"10.244.1.2", "10.96.0.10", "10.244.2.3"},
		{"fd00:10:244:1::2", "fd00:10:96::a", "fd00:10:244:2::3"},
		{"::ffff:10.244.1.2", "::ffff:10.96.0.10", "::ffff:10.244.2.3"}, // IPv6 family, mapped
	} {
		a := netip.MustParseAddr
		ev := event(eventNew, 1, statusDstNAT,
			tuple{src: a(tc.client), dst: a(tc.service), srcPort: 40000, dstPort: 53, proto: 17},
			tuple{src: a(tc.endpoint), dst: a(tc.client), srcPort: 5353, dstPort: 40000, proto: 17})
		s := newFlowSet()
		s.add(ev, 7, false)
		f, _ := s.get(1)
		orig, reply := s.tuples(1, &f)
		if orig.src != ev.orig.src || orig.dst != ev.orig.dst || orig.dstPort != 53 || orig.proto != 17 || reply.src != ev.reply.src {
			t.Errorf("%s: tuples() = %+v, %+v from %+v, %+v", tc.client, orig, reply, ev.orig, ev.reply)
		}
		s.delete(1, &f)
		if s.len() != 0 || len(s.ipv6) != 0 {
			t.Errorf("%s: %d flows and %d IPv6 addresses left after delete", tc.client, s.len(), len(s.ipv6))
		}
	}
}

func TestTrackerResyncKeepsIPv6Addresses(t *testing.T) {
	tr := newFlowTracker(10, 10)
	view := labView()
	a := netip.MustParseAddr
	orig := tuple{src: a("fd00:10:244:1::2"), dst: a("fd00:10:96::a"), srcPort: 40000, dstPort: 80, proto: 6}
	reply := tuple{src: a("fd00:10:244:2::3"), dst: orig.src, srcPort: 8080, dstPort: 40000, proto: 6}
	tr.handle(event(eventNew, 1, statusDstNAT, orig, reply), 10, view)
	if err := tr.resync(dumpOf(event(eventNone, 1, statusDstNAT, orig, reply)), 50, false); err != nil {
		t.Fatal(err)
	}
	tr.mu.Lock()
	f, ok := tr.flows.get(1)
	gotOrig, gotReply := tr.flows.tuples(1, &f)
	tr.mu.Unlock()
	if !ok || f.since != 10 || gotOrig.src != orig.src || gotOrig.dst != orig.dst || gotReply.src != reply.src {
		t.Errorf("after resync: %+v (%v) with %+v, %+v, want the flow since 10 with %+v, %+v", f, ok, gotOrig, gotReply, orig, reply)
	}
	tr.handle(event(eventDestroy, 1, statusDstNAT|statusSeenReply, orig, reply), 60, view)
	if tr.flows.len() != 0 || len(tr.flows.ipv6) != 0 {
		t.Errorf("%d flows and %d IPv6 addresses left after the end", tr.flows.len(), len(tr.flows.ipv6))
	}
}

func TestTrackerResyncAtTheCap(t *testing.T) {
	tr := newFlowTracker(2, 10)
	view := labView()
	var o, r [6]tuple
	for i := 1; i <= 5; i++ {
		o[i], r[i] = dnatTuples(uint16(i))
	}
	// Flows 1 and 2 ended while events were lost; the table holds 3, 4 and 5.
	tr.handle(event(eventNew, 1, statusDstNAT, o[1], r[1]), 10, view)
	tr.handle(event(eventNew, 2, statusDstNAT, o[2], r[2]), 10, view)
	err := tr.resync(dumpOf(
		event(eventNone, 3, statusDstNAT, o[3], r[3]),
		event(eventNone, 4, statusDstNAT, o[4], r[4]),
		event(eventNone, 5, statusDstNAT, o[5], r[5]),
	), 50, false)
	if err != nil {
		t.Fatal(err)
	}
	s := tr.snapshot(0, view)
	_, has3 := tr.flows.get(3)
	_, has4 := tr.flows.get(4)
	if s.tracked != 2 || !has3 || !has4 || s.untracked != 1 {
		t.Errorf("after resync: %d tracked (3: %v, 4: %v), %d untracked; want flows 3 and 4, and 5 untracked", s.tracked, has3, has4, s.untracked)
	}
	// The stale flows were dropped, not counted as unreplied.
	if len(s.unreplied) != 0 {
		t.Errorf("unreplied = %+v, want none", s.unreplied)
	}
}
