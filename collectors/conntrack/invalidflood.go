package conntrack

import (
	"errors"
	"time"
)

// Every packet conntrack logs costs the reader of its INVALID log a few microseconds
// (BENCHMARKS.md), and anyone who can send a Service SYN+FIN segments decides how many there
// are. Above a rate, the reader therefore stops reading every packet: it listens in short
// windows and leaves NFLOG group 0 unbound in between, where the kernel, finding no listener,
// drops each log line at once. The counts are then a sample; the share of the time listened is
// exported next to them (proxyhealth_conntrack_invalid_log_listened_seconds_total).
const (
	// invalidSampleWindow is the longest a sampled window listens, and the span over which
	// the rate is measured while the reader listens throughout.
	invalidSampleWindow = time.Second
	// invalidSamplePeriod is the time from one sampled window's start to the next's: the
	// reader listens at most invalidSampleWindow of it.
	invalidSamplePeriod = 10 * time.Second
)

// errInvalidFlood ends a read when the log runs above the bound: the group is left unbound
// until the next sampled window.
var errInvalidFlood = errors.New("conntrack INVALID log above --conntrack.invalid-reasons.max-rate")

// invalidFloodBound decides when the reader listens. While it listens throughout, the rate is
// counted over consecutive windows; a window that reaches maxRate × window packets before it
// ends starts sampling. While sampling, each window listens until it ends or reaches the same
// budget, and the next starts one period after it: a window that ends under the budget
// returns to listening throughout. The reader thus reads at most maxRate × window packets per
// window, and while sampling at most that per period.
type invalidFloodBound struct {
	maxRate float64 // packets per second; 0: no bound
	window  time.Duration
	period  time.Duration

	sampling      bool
	sampledBefore bool // sampling has started at least once (it is logged the first time)
	windowStart   time.Time
	packets       uint64 // read in the window that started at windowStart
}

func newInvalidFloodBound(maxRate float64) invalidFloodBound {
	return invalidFloodBound{maxRate: maxRate, window: invalidSampleWindow, period: invalidSamplePeriod}
}

// budget is the most packets a window reads.
func (b *invalidFloodBound) budget() uint64 {
	return uint64(max(1, b.maxRate*b.window.Seconds()))
}

// listen starts a window at now: the group was just bound.
func (b *invalidFloodBound) listen(now time.Time) {
	b.windowStart, b.packets = now, 0
}

// admit counts a packet read at now, and reports whether the reader may read on; false is the
// end of the window: the reader unbinds the group until resumeAt.
func (b *invalidFloodBound) admit(now time.Time) bool {
	if b.maxRate <= 0 {
		return true
	}
	if now.Sub(b.windowStart) >= b.window {
		b.windowEnded(now)
	}
	b.packets++
	if b.packets < b.budget() {
		return true
	}
	b.sampling = true
	return false
}

// windowEnded is the end of the window at now, under the budget (admit ends those that reach
// it): the rate is below the bound, and the reader listens throughout from now on.
func (b *invalidFloodBound) windowEnded(now time.Time) {
	b.sampling = false
	b.windowStart, b.packets = now, 0
}

// windowEnd is when the current window ends.
func (b *invalidFloodBound) windowEnd() time.Time {
	return b.windowStart.Add(b.window)
}

// resumeAt is when the reader binds the group again after a window that reached the budget.
func (b *invalidFloodBound) resumeAt() time.Time {
	return b.windowStart.Add(b.period)
}
