package conntrack

import (
	"errors"
	"testing"
	"time"

	"github.com/prometheus/common/promslog"
)

// fakeClock is a clock tests move by hand.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time          { return c.t }
func (c *fakeClock) advance(d time.Duration) { c.t = c.t.Add(d) }
func newFakeClock() *fakeClock               { return &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)} }

// admitAt admits n packets spread evenly over d from the clock's time, and returns how many
// were admitted before admit said stop (n when it never did).
func admitAt(b *invalidFloodBound, clock *fakeClock, n int, d time.Duration) int {
	step := d / time.Duration(n)
	for i := range n {
		if !b.admit(clock.now()) {
			return i + 1
		}
		clock.advance(step)
	}
	return n
}

func TestInvalidFloodBoundUnderTheRateReadsEverything(t *testing.T) {
	clock := newFakeClock()
	b := newInvalidFloodBound(1000)
	b.listen(clock.now())
	// 900 packets a second for 30 seconds: never the budget of a window.
	for s := range 30 {
		if got := admitAt(&b, clock, 900, time.Second); got != 900 {
			t.Fatalf("second %d: stopped after %d packets at 900/s under a bound of 1000/s", s, got)
		}
	}
	if b.sampling {
		t.Error("sampling under the rate")
	}
}

func TestInvalidFloodBoundSamplesAboveTheRate(t *testing.T) {
	clock := newFakeClock()
	b := newInvalidFloodBound(1000)
	b.listen(clock.now())
	start := clock.now()
	// 10,000 packets a second: the first window stops at its budget, a tenth of a second in.
	if got := admitAt(&b, clock, 10000, time.Second); got != 1000 {
		t.Fatalf("first window read %d packets, want the budget of 1000", got)
	}
	if !b.sampling {
		t.Fatal("not sampling after a window over the rate")
	}
	if got := b.resumeAt().Sub(start); got != invalidSamplePeriod {
		t.Errorf("next window %v after the first began, want %v", got, invalidSamplePeriod)
	}
	// The flood goes on: each window, one period apart, reads its budget and stops again.
	for w := range 5 {
		clock.t = b.resumeAt()
		b.listen(clock.now())
		if got := admitAt(&b, clock, 10000, time.Second); got != 1000 {
			t.Fatalf("window %d read %d packets, want 1000", w, got)
		}
		if !b.sampling {
			t.Fatalf("window %d: not sampling while the flood goes on", w)
		}
	}
	// The flood ends: a window that runs its length under the budget reads throughout again,
	// with no pause.
	clock.t = b.resumeAt()
	b.listen(clock.now())
	if got := admitAt(&b, clock, 500, time.Second); got != 500 {
		t.Fatalf("quiet window stopped after %d packets", got)
	}
	clock.advance(time.Millisecond)
	if !b.admit(clock.now()) || b.sampling {
		t.Error("still sampling after a window under the rate")
	}
}

func TestInvalidFloodBoundZeroReadsEverything(t *testing.T) {
	clock := newFakeClock()
	b := newInvalidFloodBound(0)
	b.listen(clock.now())
	if got := admitAt(&b, clock, 1_000_000, time.Second); got != 1_000_000 {
		t.Fatalf("stopped after %d packets with no bound", got)
	}
}

// The reader stops reading at the budget, says so, and counts the time it listened by its
// clock; a quiet sampled window ends at its length even with no packet to tell it.
func TestInvalidLogFloodSamplesAndCountsTimeListened(t *testing.T) {
	clock := newFakeClock()
	view := &attributionView{services: emptyServiceMap{}, endpoints: emptyServiceMap{}, net: &localNet{}}
	procfs := invalidProcfs(t, "0", "NONE", "NONE")
	l := newInvalidLog(&Config{ProcPath: procfs, MaxServiceSeries: 10, InvalidReasonsMaxRate: 100}, promslog.NewNopLogger(),
		func() *attributionView { return view })
	l.now = clock.now
	src := &benchSource{n: 1000, msgs: [][]byte{
		logMessage(2, "nf_ct_proto_6: invalid tcp flag combination ", ipv4Packet(5, 6, "10.0.0.2", "10.96.0.20", 0, ports(34567, 80)), 0),
	}}
	l.open = func(int) (eventSource, error) { return src, nil }
	if err := l.start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.restore)
	clock.advance(100 * time.Millisecond)
	if err := l.consume(t.Context()); !errors.Is(err, errInvalidFlood) {
		t.Fatalf("consume: %v, want the flood's stop", err)
	}
	s := l.snapshot()
	if got := s.counts[invalidKey{invalidTCPFlags, "", ""}]; got != 100 {
		t.Errorf("counted %d packets, want the window's budget of 100", got)
	}
	if !s.sampling {
		t.Error("not sampling after the budget was spent")
	}
	if s.listened != 100*time.Millisecond {
		t.Errorf("listened %v, want 100ms", s.listened)
	}
	// Unbound until the next window: no time listened accrues.
	clock.t = l.resumeAt()
	if s := l.snapshot(); s.listened != 100*time.Millisecond {
		t.Errorf("listened %v while unbound, want 100ms", s.listened)
	}
	// The next window binds and nothing comes: once it has run its length, the reader reads
	// throughout again.
	src.n = 0
	if err := l.start(); err != nil {
		t.Fatal(err)
	}
	clock.advance(invalidSampleWindow / 2)
	if s := l.snapshot(); !s.sampling || s.listened != 100*time.Millisecond+invalidSampleWindow/2 {
		t.Errorf("half way through a quiet window: sampling %v, listened %v", s.sampling, s.listened)
	}
	clock.advance(invalidSampleWindow / 2)
	if s := l.snapshot(); s.sampling {
		t.Error("still sampling after a quiet window")
	}
}
