package cluster

import (
	"runtime/debug"
	"sync"
)

// listGCPercent is the garbage collector's target while a paged list is read. A list of
// 10,000 EndpointSlices allocates some 180 MB of decoded pages, garbage as soon as each is
// converted; at Go's default target (100) the heap grows to twice the live view between
// collections, and the process's peak, which the DaemonSet's memory limit must cover, is set
// there. Half the target costs more collections during lists only: at 10,000 Services x 10
// endpoints the view's peak went from 42.0 to 37.1 MiB (median of 3, bench/apiview).
const listGCPercent = 50

// listGC counts the lists being read: the view lists its kinds at once, so the first list
// lowers the target and the last one restores it.
var listGC struct {
	mu    sync.Mutex
	lists int
	saved int // the target before the first list
}

// lowerGCForList lowers the collector's target for a list being read and returns the
// function that ends it. A target already lower, or collection turned off (GOGC=off), is left
// alone.
func lowerGCForList() (done func()) {
	listGC.mu.Lock()
	defer listGC.mu.Unlock()
	if listGC.lists == 0 {
		prev := debug.SetGCPercent(listGCPercent)
		if prev < listGCPercent {
			debug.SetGCPercent(prev)
		}
		listGC.saved = prev
	}
	listGC.lists++
	return func() {
		listGC.mu.Lock()
		defer listGC.mu.Unlock()
		if listGC.lists--; listGC.lists == 0 {
			debug.SetGCPercent(listGC.saved)
		}
	}
}
