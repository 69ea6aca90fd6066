package nodecondition

import (
	"sync"
	"time"

	"golang.org/x/time/rate"
	"k8s.io/utils/lru"
)

// eventLimiter bounds the Events one node sends: one per (object, reason) per interval, and
// eventBurst in all, refilled one every eventRefill. A finding that flaps is told once per
// interval; a node where many Services go stale at once does not flood the API server.
type eventLimiter struct {
	interval time.Duration
	now      func() time.Time
	mu       sync.Mutex
	last     *lru.Cache // key -> time.Time of the last Event sent
	global   *rate.Limiter
}

func newEventLimiter(interval time.Duration, now func() time.Time) *eventLimiter {
	return &eventLimiter{
		interval: interval,
		now:      now,
		last:     lru.New(eventKeys),
		global:   rate.NewLimiter(rate.Every(eventRefill), eventBurst),
	}
}

// allow tells whether an Event of key may be sent now, and counts it if so.
func (l *eventLimiter) allow(key string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	if v, ok := l.last.Get(key); ok && now.Sub(v.(time.Time)) < l.interval {
		return false
	}
	if !l.global.AllowN(now, 1) {
		return false
	}
	l.last.Add(key, now)
	return true
}
