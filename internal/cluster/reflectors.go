package cluster

import (
	"context"
	"math"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
)

// The view's three reflectors, each writing its kind into the state: no informer, no
// DeltaFIFO, no event handlers; the store itself tells the view what changed.

// Client-go's reflector backoff (tools/cache/reflector.go: defaultBackoffInit and the rest):
// after a failed list or watch it waits 0.8 s, doubling (with up to as much again of jitter)
// to at most 30 s, and starts over after two minutes without failure.
const (
	reflectorBackoffInit   = 800 * time.Millisecond
	reflectorMaxBackoff    = 30 * time.Second
	reflectorBackoffReset  = 2 * time.Minute
	reflectorBackoffFactor = 2.0
	reflectorBackoffJitter = 1.0
)

// runReflectors lists and watches Services, EndpointSlices and this node into c.st until ctx
// ends.
func (c *Cluster) runReflectors(ctx context.Context) {
	var wg sync.WaitGroup
	for _, r := range []struct {
		kind    kind
		rc      resourceClient
		name    string
		example runtime.Object
	}{
		{kindService, c.api.services, "services", &corev1.Service{}},
		{kindSlice, c.api.endpointSlices, "endpointslices", &discoveryv1.EndpointSlice{}},
		{kindNode, c.api.nodes, "nodes", &corev1.Node{}},
	} {
		gc := &streamGC{}
		store := streamedListStore{kindStore{c.st, r.kind}, gc}
		lw := newListWatch(r.rc, r.kind, c.cfg.NodeName, c.api.noWatchList, store.Transformer(), gc)
		reflector := cache.NewReflectorWithOptions(lw, r.example, store, cache.ReflectorOptions{Name: r.name})
		wg.Go(func() { c.runReflector(ctx, reflector) })
	}
	wg.Wait()
}

// runReflector is the reflector's RunWithContext with the view's error handler: a bare
// reflector (unlike an informer's) offers no way to set one, and watchFailed must see every
// failed list and watch.
func (c *Cluster) runReflector(ctx context.Context, r *cache.Reflector) {
	backoff := wait.Backoff{
		Duration: reflectorBackoffInit,
		Cap:      reflectorMaxBackoff,
		Steps:    int(math.Ceil(float64(reflectorMaxBackoff) / float64(reflectorBackoffInit))),
		Factor:   reflectorBackoffFactor,
		Jitter:   reflectorBackoffJitter,
	}
	// Until runs the loop at once and restarts the backoff after each successful round, as
	// the reflector's own loop does.
	_ = backoff.DelayWithReset(clock.RealClock{}, reflectorBackoffReset).Until(ctx, true, true, func(ctx context.Context) (bool, error) {
		if err := r.ListAndWatchWithContext(ctx); err != nil {
			c.watchFailed(ctx, r, err)
		}
		return false, nil
	})
}
