package conntrack

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/common/promslog"
	ticonntrack "github.com/ti-mo/conntrack"

	"github.com/proxyhealth/proxyhealth/collectors/collectortest"
	"github.com/proxyhealth/proxyhealth/internal/cluster"
	"github.com/proxyhealth/proxyhealth/internal/testsupport/fixture"
)

// fakeKernel serves fixed statistics, one table entry and one stream of events.
type fakeKernel struct {
	stream *fakeStream
	table  [][]byte
}

func (k *fakeKernel) Stats() ([]ticonntrack.Stats, ticonntrack.StatsGlobal, error) {
	return []ticonntrack.Stats{{Invalid: 3, Drop: 1}, {Invalid: 4, EarlyDrop: 2}},
		ticonntrack.StatsGlobal{Entries: 7, MaxEntries: 1024}, nil
}

func (k *fakeKernel) Subscribe(int) (EventStream, error) { return k.stream, nil }

func (k *fakeKernel) Dump(fn func([]byte) error) error {
	for _, m := range k.table {
		if err := fn(m); err != nil {
			return err
		}
	}
	return nil
}

func (k *fakeKernel) LocalNetwork() ([]netip.Prefix, []netip.Prefix, error) {
	cni0 := netip.MustParsePrefix("10.244.1.0/24")
	return []netip.Prefix{cni0}, []netip.Prefix{cni0}, nil
}

// fakeStream delivers its messages, says so on delivered, and then waits for Close.
type fakeStream struct {
	msgs      [][]byte
	delivered chan struct{}
	closed    chan struct{}
	once      sync.Once
}

func (s *fakeStream) Receive(fn func([]byte) error) error {
	for _, m := range s.msgs {
		if err := fn(m); err != nil {
			return err
		}
	}
	close(s.delivered)
	<-s.closed
	return errors.New("closed")
}

func (s *fakeStream) Drops() (uint32, error) { return 2, nil }
func (s *fakeStream) Close() error           { s.once.Do(func() { close(s.closed) }); return nil }

// Config.Kernel and Config.Now replace every kernel read and the clock: per-CPU statistics are
// summed, dumped and streamed netlink messages are decoded, and flows are timed by Now.
func TestKernelAndClockFromConfig(t *testing.T) {
	var clock atomic.Int64
	clock.Store(time.Unix(1000, 0).UnixNano())
	orig, reply := dnatTuples(40000)
	started, startedReply := dnatTuples(40001)
	k := &fakeKernel{
		stream: &fakeStream{
			msgs: [][]byte{
				encodeFlowMessage(t, eventNew, 1, statusDstNAT, orig, reply),
				encodeFlowMessage(t, eventDestroy, 1, statusDstNAT, orig, reply),
			},
			delivered: make(chan struct{}),
			closed:    make(chan struct{}),
		},
		table: [][]byte{encodeFlowMessage(t, eventNone, 2, statusDstNAT, started, startedReply)},
	}
	view := staticView{&cluster.Snapshot{Synced: true, Fresh: true, Generation: 1, Ports: []*cluster.ServicePort{{
		Name:       cluster.ServicePortName{Namespace: "lab", Name: "web", Port: "http", Protocol: "TCP"},
		ClusterIPs: []netip.Addr{vip}, Port: 80,
	}}}}
	cfg := Config{ProcPath: "testdata/proc-full", TableStats: true, UnrepliedAfter: time.Second, MaxTrackedFlows: 10, MaxServiceSeries: 10, SocketBufferBytes: 1,
		ServiceRefreshInterval: time.Hour, ResyncMinInterval: time.Hour, View: view, Kernel: k,
		Now: func() time.Time { return time.Unix(0, clock.Load()) }}
	c, err := New(cfg, promslog.NewNopLogger())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	viewDone := make(chan struct{})
	go func() { c.refreshViewLoop(ctx); close(viewDone) }()
	defer func() { cancel(); <-viewDone }()
	// Events wait for the Service map, so that they are attributed as they would be later on.
	for deadline := time.Now().Add(5 * time.Second); c.view.Load().services.Len() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the Service map was never loaded")
		}
	}
	listenDone := make(chan struct{})
	go func() { c.listenLoop(ctx); close(listenDone) }()
	defer func() { cancel(); <-listenDone }()
	select {
	case <-k.stream.delivered:
	case <-time.After(5 * time.Second):
		t.Fatal("the events were never received")
	}
	// The events and this scrape share one instant: the start-up flow is not open yet.
	want := `
# TYPE proxyhealth_conntrack_entries_limit gauge
proxyhealth_conntrack_entries_limit 1024
# TYPE proxyhealth_conntrack_events_lost_total counter
proxyhealth_conntrack_events_lost_total 2
# TYPE proxyhealth_conntrack_invalid_packets_total counter
proxyhealth_conntrack_invalid_packets_total 7
# TYPE proxyhealth_conntrack_tracked_flows gauge
proxyhealth_conntrack_tracked_flows 1
# TYPE proxyhealth_conntrack_unreplied_flows_total counter
proxyhealth_conntrack_unreplied_flows_total{protocol="tcp",reason="same_bridge",service_name="web",service_namespace="lab",service_port="80"} 1
`
	names := []string{"proxyhealth_conntrack_entries_limit", "proxyhealth_conntrack_events_lost_total", "proxyhealth_conntrack_invalid_packets_total",
		"proxyhealth_conntrack_tracked_flows", "proxyhealth_conntrack_unreplied_flows_total", "proxyhealth_conntrack_open_unreplied_flows"}
	got, _ := collectortest.Collect(t, c)
	if err := got.Compare(want, names...); err != nil {
		t.Error(err)
	}
	// Past --conntrack.unreplied-after by the collector's clock, the start-up flow is open.
	clock.Add(int64(2 * time.Second))
	want += `# TYPE proxyhealth_conntrack_open_unreplied_flows gauge
proxyhealth_conntrack_open_unreplied_flows{protocol="tcp",reason="same_bridge",service_name="web",service_namespace="lab",service_port="80"} 1
`
	got, _ = collectortest.Collect(t, c)
	if err := got.Compare(want, names...); err != nil {
		t.Error(err)
	}
}

// The fixture encoder tests and the exporter's golden scrape write conntrack-tools' text as
// netlink messages; they decode to what the kernel's messages for those flows decode to.
func TestFixtureMessagesDecode(t *testing.T) {
	msgs, err := fixture.ConntrackMessages(strings.NewReader(`# a table entry, then events
tcp      6 431999 ESTABLISHED src=10.244.1.2 dst=10.96.0.10 sport=40000 dport=80 src=10.244.1.3 dst=10.244.1.2 sport=8080 dport=40000 [ASSURED] mark=0 use=1 id=7
    [NEW] tcp      6 120 SYN_SENT src=10.244.1.2 dst=10.96.0.10 sport=40000 dport=80 [UNREPLIED] src=10.244.1.3 dst=10.244.1.2 sport=8080 dport=40000 id=7
 [UPDATE] udp      17 30 src=fd00::2 dst=fd00::2 sport=5 dport=6 src=fd00::2 dst=fd00::2 sport=6 dport=5 id=8
[DESTROY] tcp      6 src=10.244.1.2 dst=10.96.0.10 sport=40000 dport=80 [UNREPLIED] src=10.244.1.3 dst=10.244.1.2 sport=8080 dport=40000 id=7
`))
	if err != nil {
		t.Fatal(err)
	}
	orig, reply := dnatTuples(40000)
	six := netip.MustParseAddr("fd00::2")
	want := []flowEvent{
		{typ: eventUpdate, id: 7, status: statusSeenReply | statusDstNAT, hasStatus: true, orig: orig, reply: reply},
		{typ: eventNew, id: 7, status: statusDstNAT, hasStatus: true, orig: orig, reply: reply},
		{typ: eventUpdate, id: 8, status: statusSeenReply, hasStatus: true,
			orig: tuple{src: six, dst: six, srcPort: 5, dstPort: 6, proto: 17}, reply: tuple{src: six, dst: six, srcPort: 6, dstPort: 5, proto: 17}},
		{typ: eventDestroy, id: 7, status: statusDstNAT, hasStatus: true, orig: orig, reply: reply},
	}
	if len(msgs) != len(want) {
		t.Fatalf("%d messages, want %d", len(msgs), len(want))
	}
	for i, m := range msgs {
		var ev flowEvent
		if err := decodeFlowMessage(m, &ev); err != nil || ev != want[i] {
			t.Errorf("message %d: %+v (%v), want %+v", i, ev, err, want[i])
		}
	}
	if _, err := fixture.ConntrackMessages(strings.NewReader("[NEW] tcp 6 src=10.0.0.1 dst=10.0.0.2\n")); err == nil {
		t.Error("a line without a reply tuple was accepted")
	}
}

// A Config.Kernel replaces the INVALID log's socket too; one that has none fails that part
// alone, and nothing opens this namespace's NFLOG group instead.
func TestKernelWithoutInvalidLog(t *testing.T) {
	procfs := invalidProcfs(t, "0", "NONE", "NONE")
	cfg := Config{ProcPath: procfs, UnrepliedAfter: time.Second, MaxTrackedFlows: 10, MaxServiceSeries: 10, SocketBufferBytes: 1,
		ServiceRefreshInterval: time.Hour, ResyncMinInterval: time.Hour, Kernel: &fakeKernel{}, InvalidReasons: true}
	c, err := New(cfg, promslog.NewNopLogger())
	if err != nil {
		t.Fatal(err)
	}
	if err := c.invalid.start(); err == nil || !strings.Contains(err.Error(), "serves no INVALID log") {
		t.Errorf("start with a Kernel without the log: %v", err)
	}
	if got := readSettings(t, procfs); got != "0 NONE NONE" {
		t.Errorf("settings changed: %s", got)
	}
}
