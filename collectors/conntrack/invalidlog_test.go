package conntrack

import (
	"context"
	"encoding/binary"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/promslog"
	"github.com/proxyhealth/proxyhealth/internal/cluster"
	"github.com/proxyhealth/proxyhealth/internal/hostrules"
	"github.com/proxyhealth/proxyhealth/internal/ruleset"
)

// webRules is kube-proxy's view of one TCP Service port, default/web 10.96.0.20:80, with one
// endpoint 10.0.0.1:8080.
var webRules = &hostrules.State{Seq: 1, Mode: hostrules.ModeIPTables, Proxy: map[bool]*ruleset.ProxyTable{false: {
	Chains: map[string][]netip.AddrPort{"KUBE-SVC-WEB": {netip.MustParseAddrPort("10.0.0.1:8080")}},
	Services: []ruleset.Service{
		{ClusterIP: netip.MustParseAddr("10.96.0.20"), Port: 80, Protocol: ruleset.ProtoTCP, Namespace: "default", Name: "web", Chain: "KUBE-SVC-WEB"},
	}}}}

// invalidProcfs is a procfs with conntrack's log settings at the values given.
func invalidProcfs(t *testing.T, logInvalid, ipv4, ipv6 string) string {
	t.Helper()
	dir := t.TempDir()
	nf := filepath.Join(dir, "sys", "net", "netfilter")
	if err := os.MkdirAll(filepath.Join(nf, "nf_log"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, v := range map[string]string{"nf_conntrack_log_invalid": logInvalid, "nf_log/2": ipv4, "nf_log/10": ipv6,
		"nf_conntrack_tcp_be_liberal": "0", "nf_conntrack_events": "1"} {
		if v == "" {
			continue
		}
		if err := os.WriteFile(filepath.Join(nf, name), []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// readSettings is "log_invalid nf_log/2 nf_log/10" as procfs has them.
func readSettings(t *testing.T, procfs string) string {
	t.Helper()
	var vals []string
	for _, name := range []string{"nf_conntrack_log_invalid", "nf_log/2", "nf_log/10"} {
		b, err := os.ReadFile(filepath.Join(procfs, "sys", "net", "netfilter", name))
		if err != nil {
			t.Fatal(err)
		}
		vals = append(vals, strings.TrimSpace(string(b)))
	}
	return strings.Join(vals, " ")
}

func newInvalidTestCollector(t *testing.T, procfs string, open func(int) (eventSource, error)) *Collector {
	t.Helper()
	cfg := Config{ProcPath: procfs, UnrepliedAfter: time.Second, MaxTrackedFlows: 10, MaxServiceSeries: 10,
		SocketBufferBytes: 1, ServiceRefreshInterval: time.Hour, ResyncMinInterval: time.Hour,
		Rules: &rulesAt{webRules}, InvalidReasons: true, InvalidReasonsStateDir: filepath.Join(t.TempDir(), "state")}
	c, err := New(cfg, promslog.NewNopLogger())
	if err != nil {
		t.Fatal(err)
	}
	c.loadNet = func() (*localNet, error) { return &localNet{}, nil }
	c.openEvents = func(int) (eventSource, error) { return nil, errors.New("no event stream in this test") }
	c.invalid.open = open
	return c
}

func TestInvalidLogCountsByReasonAndService(t *testing.T) {
	procfs := invalidProcfs(t, "0", "NONE", "nf_log_ipv6")
	synFin := append(ports(34567, 80), 0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x03)
	msgs := [][]byte{
		// The client's SYN+FIN to the cluster IP.
		logMessage(2, "nf_ct_proto_6: invalid tcp flag combination ", ipv4Packet(5, 6, "10.0.0.2", "10.96.0.20", 0, synFin), 0),
		// Incident 2: the endpoint's out-of-window segment back to the client, un-NATed.
		logMessage(2, "nf_ct_proto_6: SEQ is over upper bound 2296793663 (over the window of the receiver) ", ipv4Packet(5, 6, "10.0.0.1", "10.0.0.2", 0, ports(8080, 34567)), 1),
		// Three packets lost before this one (4, 5, 6 missing); to no Service.
		logMessage(2, "nf_ct_proto_17: bad checksum ", ipv4Packet(5, 17, "10.0.0.2", "10.0.0.9", 0, ports(5000, 53)), 5),
		// A bad checksum towards the endpoint (after DNAT, as over a bridge).
		logMessage(2, "nf_ct_proto_6: bad checksum ", ipv4Packet(5, 6, "10.0.0.2", "10.0.0.1", 0, ports(1, 8080)), 6),
		logMessage(10, "nf_ct_proto_58: invalid icmpv6 type ", ipv6Packet(58, "fd00::2", "fd00::1", []byte{200, 0}), 7),
		// Another NFLOG user of group 0, on the same sequence: not conntrack's, so counted
		// apart however its text reads, and no gap.
		logMessage(2, "DROP bad checksum", ipv4Packet(5, 6, "10.0.0.2", "10.96.0.20", 0, synFin), 8),
		logMessage(2, "fw: ignored host", ipv4Packet(5, 6, "10.0.0.2", "10.0.0.1", 0, ports(1, 8080)), 9),
		logMessage(2, "nf_ct_ftp: dropping packet: bad checksum ", ipv4Packet(5, 6, "10.0.0.2", "10.0.0.1", 0, ports(1, 8080)), 10),
		logMessage(2, "nf_ct_proto_6: invalid tcp flag combination ", ipv4Packet(5, 6, "10.0.0.2", "10.96.0.20", 0, synFin), 11),
	}
	var mu sync.Mutex
	var log []string
	src := &fakeSource{name: "nflog", msgs: msgs, log: &log, mu: &mu, closed: make(chan struct{})}
	c := newInvalidTestCollector(t, procfs, func(int) (eventSource, error) {
		// The settings are set after the group is bound, not before.
		if got := readSettings(t, procfs); got != "0 NONE nf_log_ipv6" {
			t.Errorf("settings changed before the bind: %s", got)
		}
		return src, nil
	})
	// The map of Services and endpoints is read before the log.
	c.view.Store(&attributionView{services: emptyServiceMap{}, endpoints: emptyServiceMap{}, net: &localNet{}})
	m, eps, _ := c.services.load()
	c.view.Store(&attributionView{services: m, endpoints: eps, net: &localNet{}})

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.invalid.run(ctx); close(done) }()
	waitFor(t, "the log's packets to be counted", func() bool {
		s := c.invalid.snapshot()
		return s.err == nil && s.foreign == 3 && s.counts[invalidKey{invalidTCPFlags, "default", "web"}] == 2
	})
	if got := readSettings(t, procfs); got != "255 nfnetlink_log nfnetlink_log" {
		t.Errorf("settings while reading: %s", got)
	}
	out := scrape(t, c)
	for _, want := range []string{
		`proxyhealth_conntrack_invalid_reason_packets_total{reason="tcp_flags",service_name="web",service_namespace="default"} 2`,
		`proxyhealth_conntrack_invalid_reason_packets_total{reason="seq_over_window",service_name="web",service_namespace="default"} 1`,
		`proxyhealth_conntrack_invalid_reason_packets_total{reason="checksum",service_name="",service_namespace=""} 1`,
		`proxyhealth_conntrack_invalid_reason_packets_total{reason="checksum",service_name="web",service_namespace="default"} 1`,
		`proxyhealth_conntrack_invalid_reason_packets_total{reason="icmp_type",service_name="",service_namespace=""} 1`,
		`proxyhealth_conntrack_invalid_reason_packets_lost_total 3`,
		`proxyhealth_conntrack_invalid_log_foreign_messages_total 3`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("scrape lacks %s:\n%s", want, out)
		}
	}
	if got := strings.Count(out, "\nproxyhealth_conntrack_invalid_reason_packets_total{"); got != 5 {
		t.Errorf("%d INVALID series, want 5 (the foreign messages in none):\n%s", got, out)
	}
	cancel()
	<-done
	if got := readSettings(t, procfs); got != "0 NONE nf_log_ipv6" {
		t.Errorf("settings after the reader stopped: %s, want the old ones", got)
	}
	select {
	case <-src.closed:
	default:
		t.Error("the NFLOG socket is still open after the reader stopped")
	}
}

// A receive error closes the socket before the group is bound again: the kernel keeps the
// group for the failed socket until it is closed, and refuses the new bind as if another
// process read it. The settings stay set across the re-bind and are put back at the end.
func TestInvalidLogRebindsAfterReceiveError(t *testing.T) {
	procfs := invalidProcfs(t, "0", "NONE", "NONE")
	var mu sync.Mutex
	var log []string
	sources := []*fakeSource{
		{name: "first", err: errors.New("receive conntrack events: no buffer space"), log: &log, mu: &mu, closed: make(chan struct{})},
		{name: "second", msgs: [][]byte{
			logMessage(2, "nf_ct_proto_6: bad checksum ", ipv4Packet(5, 6, "10.0.0.2", "10.0.0.9", 0, ports(1, 8080)), 0),
		}, log: &log, mu: &mu, closed: make(chan struct{})},
	}
	opened := 0
	c := newInvalidTestCollector(t, procfs, func(int) (eventSource, error) {
		// As the kernel: one socket per group, until it is closed.
		if opened > 0 {
			select {
			case <-sources[opened-1].closed:
			default:
				return nil, errGroupTaken
			}
		}
		if opened == len(sources) {
			return nil, errors.New("no more sources in this test")
		}
		if opened == 1 {
			if got := readSettings(t, procfs); got != "255 nfnetlink_log nfnetlink_log" {
				t.Errorf("settings at the re-bind: %s, want them still set", got)
			}
		}
		opened++
		return sources[opened-1], nil
	})
	c.view.Store(&attributionView{services: emptyServiceMap{}, endpoints: emptyServiceMap{}, net: &localNet{}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.invalid.run(ctx); close(done) }()
	waitFor(t, "the packet of the second socket to be counted", func() bool {
		s := c.invalid.snapshot()
		return s.err == nil && s.counts[invalidKey{invalidChecksum, "", ""}] == 1
	})
	if got := readSettings(t, procfs); got != "255 nfnetlink_log nfnetlink_log" {
		t.Errorf("settings after the re-bind: %s", got)
	}
	cancel()
	<-done
	if got := readSettings(t, procfs); got != "0 NONE NONE" {
		t.Errorf("settings after the reader stopped: %s, want the old ones", got)
	}
	for _, src := range sources {
		select {
		case <-src.closed:
		default:
			t.Errorf("NFLOG socket %s still open after the reader stopped", src.name)
		}
	}
}

func TestInvalidLogCap(t *testing.T) {
	l := newInvalidLog(&Config{MaxServiceSeries: 1}, promslog.NewNopLogger(), nil)
	var p loggedPacket
	l.count(&p, invalidKey{invalidChecksum, "default", "web"})
	l.count(&p, invalidKey{invalidChecksum, "default", "api"})
	l.count(&p, invalidKey{invalidTCPFlags, "default", "web"}) // a new label set of a listed Service is over the cap too
	l.count(&p, invalidKey{invalidChecksum, "", ""})           // packets of no Service are outside the cap
	s := l.snapshot()
	if len(s.counts) != 2 || s.counts[invalidKey{invalidChecksum, "default", "web"}] != 1 || s.counts[invalidKey{invalidChecksum, "", ""}] != 1 {
		t.Errorf("listed: %v", s.counts)
	}
	if s.unlisted[invalidChecksum] != 1 || s.unlisted[invalidTCPFlags] != 1 {
		t.Errorf("unlisted: %v", s.unlisted)
	}
}

// A deleted Service's series is dropped once it has been out of the view and unmoved for
// serviceSeriesIdle, and its place under the cap goes to a new Service; a Service still in the
// view keeps its series however idle.
func TestInvalidLogFreesSeriesOfDeletedServices(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	view := &attributionView{services: apiServiceMap(webSnapshot(1, "web", "old")), endpoints: emptyServiceMap{}, net: &localNet{}}
	l := newInvalidLog(&Config{MaxServiceSeries: 2, Now: func() time.Time { return now }}, promslog.NewNopLogger(),
		func() *attributionView { return view })
	var p loggedPacket
	web, old, added := invalidKey{invalidChecksum, "lab", "web"}, invalidKey{invalidChecksum, "lab", "old"}, invalidKey{invalidChecksum, "lab", "new"}
	l.count(&p, web)
	l.count(&p, old)
	l.snapshot()

	// lab/old is deleted and lab/new created; a packet of lab/old counted just before the
	// view changed moves its series once more.
	view = &attributionView{services: apiServiceMap(webSnapshot(2, "web", "new")), endpoints: emptyServiceMap{}, net: &localNet{}}
	l.count(&p, old)
	l.count(&p, added)
	s := l.snapshot()
	if s.unlisted[invalidChecksum] != 1 || s.counts[old] != 2 {
		t.Fatalf("before a pass: counts %v, unlisted %v; want lab/new unlisted, lab/old kept", s.counts, s.unlisted)
	}
	// Not dropped while it moved since the last pass.
	now = now.Add(serviceSeriesIdle)
	if s := l.snapshot(); s.counts[old] != 2 {
		t.Fatalf("lab/old dropped although it moved since the last pass: %v", s.counts)
	}
	now = now.Add(serviceSeriesIdle - time.Second)
	if s := l.snapshot(); s.counts[old] != 2 {
		t.Fatalf("a pass before serviceSeriesIdle passed: %v", s.counts)
	}
	now = now.Add(time.Second)
	s = l.snapshot()
	if _, listed := s.counts[old]; listed || s.counts[web] != 1 {
		t.Fatalf("after the deleted Service was idle: %v; want lab/old dropped, lab/web kept", s.counts)
	}
	l.count(&p, added)
	if s := l.snapshot(); s.counts[added] != 1 || s.unlisted[invalidChecksum] != 1 {
		t.Errorf("the new Service did not take the freed place: counts %v, unlisted %v", s.counts, s.unlisted)
	}
}

// With no Services in the view (a source not read yet, more likely than a node without
// Services) nothing is dropped.
func TestInvalidLogKeepsSeriesWhileViewEmpty(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	view := &attributionView{services: emptyServiceMap{}, endpoints: emptyServiceMap{}, net: &localNet{}}
	l := newInvalidLog(&Config{MaxServiceSeries: 2, Now: func() time.Time { return now }}, promslog.NewNopLogger(),
		func() *attributionView { return view })
	var p loggedPacket
	web := invalidKey{invalidChecksum, "lab", "web"}
	l.count(&p, web)
	for range 3 {
		l.snapshot()
		now = now.Add(serviceSeriesIdle)
	}
	if s := l.snapshot(); s.counts[web] != 1 {
		t.Errorf("dropped with an empty view: %v", s.counts)
	}
}

func TestInvalidLogGroupTaken(t *testing.T) {
	procfs := invalidProcfs(t, "0", "NONE", "NONE")
	c := newInvalidTestCollector(t, procfs, func(int) (eventSource, error) {
		return nil, errGroupTaken
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.invalid.run(ctx); close(done) }()
	waitFor(t, "the failure", func() bool { return errors.Is(c.invalid.snapshot().err, errGroupTaken) })
	err := c.Update(make(chan prometheus.Metric, 200))
	if !errors.Is(err, errGroupTaken) {
		t.Errorf("Update: %v, want the taken group", err)
	}
	if got := readSettings(t, procfs); got != "0 NONE NONE" {
		t.Errorf("settings changed although the group was not bound: %s", got)
	}
	cancel()
	<-done
}

func TestInvalidLogSettingNotWritable(t *testing.T) {
	// No nf_log/10: nothing is set.
	procfs := invalidProcfs(t, "1", "nf_log_ipv4", "")
	var mu sync.Mutex
	var log []string
	src := &fakeSource{name: "nflog", log: &log, mu: &mu, closed: make(chan struct{})}
	c := newInvalidTestCollector(t, procfs, func(int) (eventSource, error) { return src, nil })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.invalid.run(ctx); close(done) }()
	waitFor(t, "the failure", func() bool {
		err := c.invalid.snapshot().err
		return err != nil && strings.Contains(err.Error(), "nf_log/10")
	})
	for path, want := range map[string]string{"nf_conntrack_log_invalid": "1", "nf_log/2": "nf_log_ipv4"} {
		b, err := os.ReadFile(filepath.Join(procfs, "sys", "net", "netfilter", path))
		if err != nil || strings.TrimSpace(string(b)) != want {
			t.Errorf("%s = %q, %v; want %q", path, b, err, want)
		}
	}
	select {
	case <-src.closed:
	default:
		t.Error("the NFLOG socket stays open although the settings could not be set")
	}
	// The rest of the collector keeps working: its settings are still read.
	if !strings.Contains(scrape(t, c), "proxyhealth_conntrack_tcp_be_liberal 0") {
		t.Error("the collector's other series are missing")
	}
	cancel()
	<-done
}

func TestCloseRestoresSettings(t *testing.T) {
	procfs := invalidProcfs(t, "0", "NONE", "NONE")
	var mu sync.Mutex
	var log []string
	src := &fakeSource{name: "nflog", log: &log, mu: &mu, closed: make(chan struct{})}
	c := newInvalidTestCollector(t, procfs, func(int) (eventSource, error) { return src, nil })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go c.invalid.run(ctx)
	waitFor(t, "the settings", func() bool { return readSettings(t, procfs) == "255 nfnetlink_log nfnetlink_log" })
	// Close, as the exporter calls it on SIGTERM, while the reader still runs.
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if got := readSettings(t, procfs); got != "0 NONE NONE" {
		t.Errorf("settings after Close: %s", got)
	}
	// Nothing is set again after Close, even if the reader tries once more.
	if err := c.invalid.start(); err == nil {
		t.Error("start after Close succeeded")
	}
	if got := readSettings(t, procfs); got != "0 NONE NONE" {
		t.Errorf("settings after a start following Close: %s", got)
	}
}

func TestAPIEndpointMap(t *testing.T) {
	dns := &cluster.ServicePort{
		Name:             cluster.ServicePortName{Namespace: "kube-system", Name: "kube-dns", Port: "dns", Protocol: "UDP"},
		ClusterIPs:       []netip.Addr{netip.MustParseAddr("10.96.0.10")},
		Port:             53,
		ClusterEndpoints: []netip.AddrPort{netip.MustParseAddrPort("10.0.0.5:5353"), netip.MustParseAddrPort("[fd00::5]:5353")},
	}
	// A second Service on the same endpoint; the first in the view's order names it.
	alias := &cluster.ServicePort{
		Name:           cluster.ServicePortName{Namespace: "kube-system", Name: "z-alias", Protocol: "UDP"},
		ClusterIPs:     []netip.Addr{netip.MustParseAddr("10.96.0.11")},
		Port:           53,
		LocalEndpoints: []netip.AddrPort{netip.MustParseAddrPort("10.0.0.5:5353"), netip.MustParseAddrPort("10.0.0.6:5353")},
	}
	m := apiEndpointMap(&cluster.Snapshot{Synced: true, Ports: []*cluster.ServicePort{dns, alias}})
	for _, tc := range []struct {
		ep   string
		want string
	}{{"10.0.0.5:5353", "kube-dns"}, {"[fd00::5]:5353", "kube-dns"}, {"10.0.0.6:5353", "z-alias"}} {
		ep := netip.MustParseAddrPort(tc.ep)
		if got, ok := m.Lookup(ep.Addr(), ep.Port(), 17); !ok || got.Name != tc.want {
			t.Errorf("Lookup(%s/udp) = %+v, %v; want %s", tc.ep, got, ok, tc.want)
		}
	}
	if _, ok := m.Lookup(netip.MustParseAddr("10.0.0.5"), 5353, 6); ok {
		t.Error("found the UDP endpoint over TCP")
	}
	if _, ok := m.Lookup(netip.MustParseAddr("10.96.0.10"), 53, 17); ok {
		t.Error("a cluster IP is in the endpoint map")
	}
}

// BenchmarkInvalidLogMessage is the user-space work per logged packet: decode, reason,
// Service lookup and count (the kernel's receive is measured by bench/conntrack-events).
func BenchmarkInvalidLogMessage(b *testing.B) {
	rules := newRulesServices(&rulesAt{webRules}, promslog.NewNopLogger(), true)
	m, eps, _ := rules.load()
	view := &attributionView{services: m, endpoints: eps, net: &localNet{}}
	l := newInvalidLog(&Config{MaxServiceSeries: 100}, promslog.NewNopLogger(), func() *attributionView { return view })
	msgs := [][]byte{
		logMessage(2, "nf_ct_proto_6: invalid tcp flag combination ", ipv4Packet(5, 6, "10.0.0.2", "10.96.0.20", 0, ports(34567, 80)), 0),
		logMessage(2, "nf_ct_proto_6: SEQ is over upper bound 2296793663 (over the window of the receiver) ", ipv4Packet(5, 6, "10.0.0.1", "10.0.0.2", 0, ports(8080, 34567)), 1),
	}
	src := &benchSource{msgs: msgs}
	b.ReportAllocs()
	b.ResetTimer()
	src.n = b.N
	if err := l.consumeFrom(src); err != nil {
		b.Fatal(err)
	}
}

// benchSource hands out its messages in turn, n in all.
type benchSource struct {
	msgs [][]byte
	n    int
}

func (s *benchSource) receiveBatches(fn func([]byte) error) error {
	for i := 0; i < s.n; i++ {
		m := s.msgs[i%len(s.msgs)]
		// Each message its own sequence number, as the kernel numbers them.
		binary.BigEndian.PutUint32(m[len(m)-4:], uint32(i))
		if err := fn(m); err != nil {
			return err
		}
	}
	return nil
}
func (s *benchSource) drops() (uint32, error) { return 0, nil }
func (s *benchSource) Close() error           { return nil }
