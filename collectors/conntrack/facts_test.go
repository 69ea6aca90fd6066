package conntrack

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/common/promslog"
)

func TestStatsAndFlowsAccessors(t *testing.T) {
	cfg := Config{ProcPath: "testdata/proc-full", UnrepliedAfter: time.Millisecond, MaxTrackedFlows: 10, MaxServiceSeries: 10, SocketBufferBytes: 1, ServiceRefreshInterval: time.Hour, ResyncMinInterval: time.Hour}
	c, err := New(cfg, promslog.NewNopLogger())
	if err != nil {
		t.Fatal(err)
	}
	c.view.Store(labView())
	c.stats = func() (tableStats, error) {
		return tableStats{entries: 10, limit: 100, cpu: cpuStats{invalid: 3, insertFailed: 4, drop: 5, earlyDrop: 6, found: 99}}, nil
	}
	st, err := c.Stats()
	if err != nil || st != (Stats{Entries: 10, Limit: 100, Invalid: 3, InsertFailed: 4, Drop: 5, EarlyDrop: 6}) {
		t.Errorf("Stats() = %+v, %v", st, err)
	}
	denied := errors.New("open conntrack netlink socket for stats: operation not permitted (needs CAP_NET_ADMIN)")
	c.stats = func() (tableStats, error) { return tableStats{}, denied }
	if _, err := c.Stats(); !errors.Is(err, denied) {
		t.Errorf("Stats() error %v", err)
	}

	// Before Run: not listening.
	if f := c.Flows(); !errors.Is(f.Err, ErrNotListening) || len(f.Unreplied) != 0 {
		t.Errorf("before Run: %+v", f)
	}
	// One flow ended unreplied (client and endpoint on one bridge), one open and unreplied.
	view := c.view.Load()
	orig, reply := dnatTuples(1000)
	c.tracker.handle(event(eventNew, 1, statusDstNAT, orig, reply), time.Now().UnixNano(), view)
	c.tracker.handle(event(eventDestroy, 1, statusDstNAT, orig, reply), time.Now().UnixNano(), view)
	orig2, reply2 := dnatTuples(1001)
	c.tracker.handle(event(eventNew, 2, statusDstNAT, orig2, reply2), time.Now().Add(-time.Second).UnixNano(), view)
	c.mu.Lock()
	c.sock = &fakeSource{closed: make(chan struct{})}
	c.mu.Unlock()

	f := c.Flows()
	if f.Err != nil || len(f.Unreplied) != 1 {
		t.Fatalf("Flows() = %+v", f)
	}
	want := UnrepliedSeries{Namespace: "lab", Name: "web", Port: 80, Protocol: "tcp", Reason: "same_bridge", Ended: 1, Open: 1}
	if f.Unreplied[0] != want {
		t.Errorf("series %+v, want %+v", f.Unreplied[0], want)
	}
	c.setListenErr(errors.New("seed flow tracking: permission denied"))
	if f := c.Flows(); f.Err == nil {
		t.Error("a listener error is not told")
	}
}

func TestInvalidReasonsAccessor(t *testing.T) {
	cfg := Config{ProcPath: "testdata/proc-full", UnrepliedAfter: time.Millisecond, MaxTrackedFlows: 10, MaxServiceSeries: 3, SocketBufferBytes: 1, ServiceRefreshInterval: time.Hour, ResyncMinInterval: time.Hour}
	c, err := New(cfg, promslog.NewNopLogger())
	if err != nil {
		t.Fatal(err)
	}
	if r := c.InvalidReasons(); r.Enabled || r.Err != nil || r.Series != nil {
		t.Errorf("without --conntrack.invalid-reasons: %+v", r)
	}

	cfg.InvalidReasons = true
	c, err = New(cfg, promslog.NewNopLogger())
	if err != nil {
		t.Fatal(err)
	}
	if r := c.InvalidReasons(); !r.Enabled || !errors.Is(r.Err, ErrInvalidLogNotStarted) || len(r.Series) != 0 {
		t.Errorf("before the log started: %+v", r)
	}
	var p loggedPacket
	for range 3 {
		c.invalid.count(&p, invalidKey{invalidSeqOverWindow, "lab", "web"})
	}
	c.invalid.count(&p, invalidKey{invalidChecksum, "", ""})
	c.invalid.count(&p, invalidKey{invalidChecksum, "lab", "api"})
	c.invalid.count(&p, invalidKey{invalidTCPFlags, "lab", "db"}) // over the cap of 3 series
	c.invalid.count(&p, invalidKey{invalidTCPFlags, "lab", "db"})
	c.invalid.mu.Lock()
	c.invalid.err, c.invalid.lost = nil, 4
	c.invalid.mu.Unlock()

	r := c.InvalidReasons()
	want := []InvalidReasonSeries{
		{Reason: "checksum", Packets: 1},
		{Namespace: "lab", Name: "api", Reason: "checksum", Packets: 1},
		{Namespace: "lab", Name: "web", Reason: "seq_over_window", Packets: 3},
	}
	if !r.Enabled || r.Err != nil || !slices.Equal(r.Series, want) || r.Unlisted != 2 || r.Lost != 4 {
		t.Errorf("InvalidReasons() = %+v, want series %+v, 2 unlisted, 4 lost", r, want)
	}
}
