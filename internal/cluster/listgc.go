package cluster

import (
	"runtime/debug"
	"sync"

	"k8s.io/apimachinery/pkg/watch"
)

// listGCPercent is the garbage collector's target while a list is read, paged or streamed,
// and through the view's initial sync (Cluster.Run). A list of 10,000 EndpointSlices
// allocates some 150 MB of decoded API objects, garbage as soon as each is converted; at Go's
// default target (100) the heap grows to twice the live view between collections, and the
// process's peak, which the DaemonSet's memory limit must cover, is set there and stays (free
// pages go back to the system only slowly). A quarter of the target costs more collections
// during lists only, each marking no more than the view: at 10,000 Services x 10 endpoints,
// streamed from kube-apiserver v1.37 on etcd 3.6, the whole process's peak went from 39.9 to
// 33.6 MiB (bench/apiview, median of 3; 133 collections until sync against 39).
const listGCPercent = 25

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

// streamGC lowers the collector's target for a streamed list (a watch with
// sendInitialEvents): from the watch's start until the reflector replaces its store with the
// streamed objects, or the watch fails first. A streamed list allocates as much garbage as a
// paged one, each event's API object decoded, converted and dropped, and without the lower
// target the heap grows to twice the view before a collection.
type streamGC struct {
	mu   sync.Mutex
	done func() // set while a streamed list is being read
}

// started is called as a streamed list's watch is opened.
func (g *streamGC) started() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.done == nil {
		g.done = lowerGCForList()
	}
}

// ended is called when the list has been stored or its watch has failed or stopped.
func (g *streamGC) ended() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.done != nil {
		g.done()
		g.done = nil
	}
}

// streamedListStore is a kind's store that ends the streamed list's lowered target once the
// reflector has stored the list (Replace), for a streamed and a paged list alike.
type streamedListStore struct {
	kindStore
	gc *streamGC
}

func (s streamedListStore) Replace(list []any, rv string) error {
	defer s.gc.ended()
	return s.kindStore.Replace(list, rv)
}

// stopEndsGC is a streamed list's watch: stopping it before the list was stored ends the
// lowered target too.
type stopEndsGC struct {
	watch.Interface
	gc *streamGC
}

func (w stopEndsGC) Stop() {
	w.gc.ended()
	w.Interface.Stop()
}
