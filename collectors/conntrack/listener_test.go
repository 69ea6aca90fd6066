package conntrack

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/promslog"
)

// fakeSource replays messages, then fails with err (or blocks until closed when err is nil).
type fakeSource struct {
	name   string
	msgs   [][]byte
	err    error
	dropN  uint32
	log    *[]string
	mu     *sync.Mutex
	closed chan struct{}
	once   sync.Once
}

func (f *fakeSource) record(s string) {
	f.mu.Lock()
	*f.log = append(*f.log, s)
	f.mu.Unlock()
}

func (f *fakeSource) receiveBatches(fn func([]byte) error) error {
	for _, m := range f.msgs {
		if err := fn(m); err != nil {
			return err
		}
	}
	f.msgs = nil
	if f.err != nil {
		return f.err
	}
	<-f.closed
	return errors.New("use of closed file")
}

func (f *fakeSource) drops() (uint32, error) { return f.dropN, nil }
func (f *fakeSource) Close() error {
	f.once.Do(func() { f.record("close " + f.name); close(f.closed) })
	return nil
}

func TestListenerRecoversFromReceiveError(t *testing.T) {
	var (
		mu  sync.Mutex
		log []string
	)
	orig, reply := dnatTuples(1)
	newFlow := encodeFlowMessage(t, eventNew, 1, statusDstNAT, orig, reply)
	sources := []*fakeSource{
		{name: "first", msgs: [][]byte{newFlow}, err: errors.New("receive conntrack events: no buffer space"), dropN: 7},
		{name: "second"},
	}
	cfg := Config{ProcPath: "testdata/proc-full", UnrepliedAfter: time.Second, MaxTrackedFlows: 10, MaxServiceSeries: 10, SocketBufferBytes: 1, ServiceRefreshInterval: time.Hour, ResyncMinInterval: time.Hour}
	c, err := New(cfg, promslog.NewNopLogger())
	if err != nil {
		t.Fatal(err)
	}
	c.view.Store(labView())
	opened := 0
	c.openEvents = func(int) (eventSource, error) {
		s := sources[opened]
		s.log, s.mu, s.closed = &log, &mu, make(chan struct{})
		s.record("open " + s.name)
		opened++
		return s, nil
	}
	dumps := 0
	c.dump = func(fn func(*flowEvent)) error {
		dumps++
		if dumps == 2 {
			// The table still holds the flow seen on the first socket.
			fn(event(eventNone, 1, statusDstNAT, orig, reply))
		}
		return nil
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.listenLoop(ctx); close(done) }()
	deadline := time.Now().Add(5 * time.Second)
	for c.resyncs.Load() < 2 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	<-done

	mu.Lock()
	defer mu.Unlock()
	want := []string{"open first", "open second", "close first", "close second"}
	if len(log) != len(want) {
		t.Fatalf("socket lifecycle %v, want %v", log, want)
	}
	for i := range want {
		if log[i] != want[i] {
			t.Fatalf("socket lifecycle %v, want %v (the new socket must open before the old closes)", log, want)
		}
	}
	if got := c.receiveErrors.Load(); got != 1 {
		t.Errorf("receive errors = %d, want 1", got)
	}
	if got := c.events[eventNew].Load(); got != 1 {
		t.Errorf("new events = %d, want 1", got)
	}
	c.mu.Lock()
	if c.lostBase != 7 {
		t.Errorf("lost events carried over from the replaced socket = %d, want 7", c.lostBase)
	}
	c.mu.Unlock()
	if s := c.tracker.snapshot(time.Now().UnixNano(), labView()); s.tracked != 1 {
		t.Errorf("tracked flows after recovery = %d, want the one flow still in the table", s.tracked)
	}
}

func TestListenerReportsOpenFailure(t *testing.T) {
	cfg := Config{ProcPath: "testdata/proc-full", UnrepliedAfter: time.Second, MaxTrackedFlows: 10, SocketBufferBytes: 1, ServiceRefreshInterval: time.Hour, ResyncMinInterval: time.Hour}
	c, err := New(cfg, promslog.NewNopLogger())
	if err != nil {
		t.Fatal(err)
	}
	c.openEvents = func(int) (eventSource, error) {
		return nil, describeNetlinkError("open conntrack netlink socket", errors.New("operation not permitted"))
	}
	c.stats = func() (tableStats, error) { return tableStats{}, nil }
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	c.listenLoop(ctx)
	if err := c.Update(make(chan prometheus.Metric, 200)); err == nil {
		t.Error("Update succeeded while the event socket cannot be opened")
	}
}

func TestShortBatchPause(t *testing.T) {
	if got := shortBatchPause(32 << 20); got != maxShortBatchPause {
		t.Errorf("with the default 32 MiB buffer: %v, want the most, %v", got, maxShortBatchPause)
	}
	// A small buffer gets a wait that fills at most a quarter of it.
	small := 212992 // net.core.rmem_default's usual value
	if got := shortBatchPause(small); got <= 0 || got >= maxShortBatchPause ||
		float64(eventQueueRate)*got.Seconds() > float64(small)/4 {
		t.Errorf("with a %d-byte buffer: %v", small, got)
	}
}
