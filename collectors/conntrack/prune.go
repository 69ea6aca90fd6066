package conntrack

import (
	"sync"
	"time"
)

// serviceSeriesIdle is how long a series of a Service that left the attribution view must
// not move before it is dropped, freeing its place under --conntrack.max-service-series. Far
// longer than a scrape interval, so its last value has been scraped, and a Service that the
// view misses only briefly keeps its series.
const serviceSeriesIdle = 10 * time.Minute

// prunedSeries is one per-Service counter series' count, and its count at the last prune pass.
type prunedSeries struct{ count, atLastPass uint64 }

// pruneServiceSeries drops, at most once per serviceSeriesIdle, the series of counts whose
// Service is no longer in the attribution view and that have not moved since the last pass:
// a deleted Service would otherwise hold its place under the cap until restart, and every new
// one would go unlisted. Callers run it as a scrape reads, so a dropped series' last value was
// scraped at the pass before. serviceOf names a key's Service; keys of no Service (the zero
// serviceName) keep their series. mu guards counts and lastPass, and is not held on entry.
func pruneServiceSeries[K comparable](mu *sync.Mutex, lastPass *time.Time, now time.Time,
	view func() *attributionView, counts map[K]*prunedSeries, serviceOf func(K) serviceName) {
	mu.Lock()
	due := now.Sub(*lastPass) >= serviceSeriesIdle
	mu.Unlock()
	if !due || view == nil {
		return
	}
	// Read outside the lock: the map may be large, and the counting goes on meanwhile.
	present, known := viewServices(view())
	if !known {
		return
	}
	mu.Lock()
	defer mu.Unlock()
	*lastPass = now
	for k, s := range counts {
		svc := serviceOf(k)
		if svc == (serviceName{}) {
			continue
		}
		if _, ok := present[svc]; !ok && s.count == s.atLastPass {
			delete(counts, k)
			continue
		}
		s.atLastPass = s.count
	}
}

// serviceName is a Service as the per-Service series label it, without its port.
type serviceName struct{ namespace, name string }

// viewServices returns the Services v attributes packets to, by address or endpoint. known is
// false when that cannot be told: no view, a map of a kind it cannot list, or no Services at
// all (more likely a source not read yet than a node without Services); nothing is pruned then.
func viewServices(v *attributionView) (present map[serviceName]struct{}, known bool) {
	if v == nil || v.services == nil || v.services.Len() == 0 {
		return nil, false
	}
	present = make(map[serviceName]struct{})
	for _, m := range []ServiceMap{v.services, v.endpoints} {
		if m == nil {
			continue
		}
		for svc := range m.Services() {
			present[serviceName{svc.Namespace, svc.Name}] = struct{}{}
		}
	}
	return present, true
}
