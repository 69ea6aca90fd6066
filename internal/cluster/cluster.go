package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/proxyhealth/proxyhealth/internal/notify"
	"github.com/proxyhealth/proxyhealth/internal/proxyversion"
)

// Cluster is the API view: it watches Services, EndpointSlices and this node, and publishes
// what kube-proxy on this node should have programmed. It implements View and Notifier.
type Cluster struct {
	cfg    Config
	logger *slog.Logger
	now    func() time.Time

	// api is nil while no API is configured; configErr says why.
	api       *apiSource
	configErr error
	host      string // the API server, for log lines

	lastHeard atomic.Int64 // unix nanoseconds; 0 until first heard
	// lastWatchFailure is when a watch last failed (not a normal close or expiry). A view
	// whose watches fail is refreshed only by re-lists, tens of seconds apart, however well
	// the probe and the lists go: it is not fresh until no watch has failed for
	// watchFailureHold.
	lastWatchFailure atomic.Int64
	lastWatchErr     atomic.Pointer[errBox]
	lastErr          atomic.Pointer[errBox]
	state            atomic.Pointer[published]
	wake             chan struct{}
	changes          notify.Changes // see Subscribe
	confirm          chan struct{}  // see Confirm

	st *state // the API objects, in compact form

	mu       sync.Mutex
	dirty    map[objKey]struct{} // Services to recompute
	allDirty bool
	// kubeProxy is kube-proxy's version as last told (SetKubeProxyVersion).
	kubeProxy proxyversion.Version

	// endInitialSyncGC restores the collector's target lowered for the initial sync (Run);
	// nil outside Run.
	endInitialSyncGC func()

	// Owned by the recompute goroutine.
	zone     string
	nodeSeen bool
	proxy    proxyversion.Version // the version the ports are computed for
}

type errBox struct{ err error }

// published is the part of a Snapshot computed from the state.
type published struct {
	ports      []*ServicePort
	synced     bool
	generation uint64
}

var (
	_ View     = (*Cluster)(nil)
	_ Notifier = (*Cluster)(nil)
)

// New builds the API view. It reads the kubeconfig or in-cluster configuration but does not
// contact the API server: a cluster without a reachable, or any, API degrades to an unsynced
// view instead of failing the exporter's start.
func New(cfg Config, logger *slog.Logger) (*Cluster, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	c := newCluster(cfg, logger)
	restCfg, err := cfg.RESTConfig()
	if err != nil {
		c.configErr = err
		c.setErr(err)
		return c, nil
	}
	if err := c.useConfig(restCfg); err != nil {
		return nil, err
	}
	return c, nil
}

func newCluster(cfg Config, logger *slog.Logger) *Cluster {
	c := &Cluster{
		cfg:     cfg,
		logger:  logger,
		now:     time.Now,
		wake:    make(chan struct{}, 1),
		confirm: make(chan struct{}, 1),
		dirty:   map[objKey]struct{}{},
	}
	c.state.Store(&published{})
	c.st = newState(cfg.NodeName)
	c.st.heard = c.heard
	c.st.changed = func(key objKey, all bool) {
		if all {
			c.markAllDirty()
		} else {
			c.markDirty(key)
		}
	}
	c.st.synced = func() {
		c.logger.Info("API view synced", "node", c.cfg.NodeName)
		c.markAllDirty()
	}
	return c
}

func (c *Cluster) useConfig(restCfg *rest.Config) error {
	api, err := newRESTSource(restCfg)
	if err != nil {
		return err
	}
	c.api = api
	c.host = restCfg.Host
	c.configErr = nil
	return nil
}

// Snapshot returns the current view without blocking. Fresh is evaluated now.
func (c *Cluster) Snapshot() *Snapshot {
	st := c.state.Load()
	s := &Snapshot{Ports: st.ports, Synced: st.synced, Generation: st.generation}
	if ns := c.lastHeard.Load(); ns != 0 {
		now := c.now()
		s.LastHeard = time.Unix(0, ns)
		watchesWork := true
		if failed := c.lastWatchFailure.Load(); failed != 0 {
			watchesWork = now.Sub(time.Unix(0, failed)) > c.watchFailureHold()
		}
		s.Fresh = st.synced && now.Sub(s.LastHeard) <= c.cfg.FreshWithin && watchesWork
	}
	return s
}

// LastError is why the view is not fresh, or nil: no API configured, the probe's failure
// (timeout, refused, unauthorized, ...), or a watch that failed within FreshWithin.
func (c *Cluster) LastError() error {
	if b := c.lastErr.Load(); b != nil && b.err != nil {
		return b.err
	}
	if failed := c.lastWatchFailure.Load(); failed != 0 && c.now().Sub(time.Unix(0, failed)) <= c.watchFailureHold() {
		if b := c.lastWatchErr.Load(); b != nil {
			return b.err
		}
	}
	return nil
}

func (c *Cluster) setErr(err error) { c.lastErr.Store(&errBox{err}) }

func (c *Cluster) heard() { c.lastHeard.Store(c.now().UnixNano()) }

// Run starts the reflectors, the recompute loop and the probe, and returns when ctx is done.
// Without an API configuration it retries finding one every probe interval.
func (c *Cluster) Run(ctx context.Context) {
	// client-go's reflectors report list and watch failures through klog; send them to
	// the exporter's log in its format.
	routeKlog(c.logger.With("component", "client-go"))
	if c.api == nil && !c.waitForConfig(ctx) {
		return
	}
	// The initial sync is the view's peak: every object decoded and dropped while the lists
	// are read, then the store replaced and every Service's ports computed, each allocating
	// garbage on top of the view. The collector's target stays lowered (listGCPercent) from
	// the first list until the first synced snapshot is out (or a list or watch fails), not
	// only while each list is read: restored to the default between the lists' end and the
	// first recompute, the heap grew to twice the view there (bench/apiview).
	c.endInitialSyncGC = sync.OnceFunc(lowerGCForList())
	defer c.endInitialSyncGC()
	var wg sync.WaitGroup
	wg.Go(func() { c.runReflectors(ctx) })
	wg.Go(func() { c.recomputeLoop(ctx) })
	wg.Go(func() { c.probeLoop(ctx) })
	wg.Wait()
}

// waitForConfig retries finding the API configuration (a kubeconfig may be mounted late),
// logging the reason once. It reports whether one was found before ctx ended.
func (c *Cluster) waitForConfig(ctx context.Context) bool {
	c.logger.Warn("API view disabled until the Kubernetes API is configured: drift is not checked and proxyhealth_api_view_fresh stays 0", "err", c.configErr)
	t := time.NewTicker(c.cfg.ProbeInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
		restCfg, err := c.cfg.RESTConfig()
		if err != nil {
			c.configErr = err
			c.setErr(err)
			continue
		}
		if err := c.useConfig(restCfg); err != nil {
			c.setErr(err)
			continue
		}
		c.logger.Info("Kubernetes API configured", "host", restCfg.Host)
		return true
	}
}

// watchFailureHold is how long the view stays stale after a failed watch: FreshWithin, and at
// least two of the reflector's longest retry intervals, since a watch that has not failed for
// that long has been retried and works; a shorter hold lets the view look fresh between the
// retries of a watch that keeps failing.
func (c *Cluster) watchFailureHold() time.Duration {
	return max(c.cfg.FreshWithin, 2*reflectorMaxBackoff)
}

// watchFailed records a failed watch (a refused or broken one; not a normal close or an
// expired resource version, after which the reflector re-lists as designed) and logs it as
// client-go would.
func (c *Cluster) watchFailed(ctx context.Context, r *cache.Reflector, err error) {
	cache.DefaultWatchErrorHandler(ctx, r, err)
	// A view that cannot list must not hold the whole process's collector lowered until the
	// API answers: its later lists lower it each for themselves.
	if c.endInitialSyncGC != nil {
		c.endInitialSyncGC()
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
		return
	}
	c.lastWatchErr.Store(&errBox{fmt.Errorf("a watch failed (the view is refreshed only by re-lists): %w", err)})
	c.lastWatchFailure.Store(c.now().UnixNano())
	c.changes.Notify()
}

func (c *Cluster) markDirty(key objKey) {
	c.mu.Lock()
	c.dirty[key] = struct{}{}
	c.mu.Unlock()
	c.signal()
}

// SetKubeProxyVersion tells the view kube-proxy's version (the unknown one when kube-proxy does
// not say): every Service is computed again the way that version programs it, when that
// differs from the last version's way.
func (c *Cluster) SetKubeProxyVersion(v proxyversion.Version) {
	c.mu.Lock()
	changed := !sameRules(c.kubeProxy, v)
	c.kubeProxy = v
	c.mu.Unlock()
	if changed {
		c.markAllDirty()
	}
}

// KubeProxyVersion is kube-proxy's version as last told (the unknown one until then).
func (c *Cluster) KubeProxyVersion() proxyversion.Version {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.kubeProxy
}

func (c *Cluster) markAllDirty() {
	c.mu.Lock()
	c.allDirty = true
	c.mu.Unlock()
	c.signal()
}

func (c *Cluster) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// recomputeLoop recomputes the Services that changed, at most once per RecomputeInterval: a
// rollout touching thousands of slices costs a few recomputes, not thousands.
func (c *Cluster) recomputeLoop(ctx context.Context) {
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.wake:
		}
		if wait := c.cfg.RecomputeInterval - time.Since(last); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
		last = time.Now()
		c.recompute()
	}
}

// recompute recomputes the Services that changed and publishes a new snapshot: the previous
// one's ports of the other Services, and the changed ones' new ports.
//
// Nothing is computed until every kind has been listed: a partial view is of no use
// (consumers wait for Synced, and Fresh needs it), and computing one on the way costs
// memory at the initial list's peak. The view's sync marks every Service, so the changes
// dropped until then are all recomputed.
func (c *Cluster) recompute() {
	c.mu.Lock()
	dirty, all, proxy := c.dirty, c.allDirty, c.kubeProxy
	c.dirty, c.allDirty = map[objKey]struct{}{}, false
	c.mu.Unlock()
	if !sameRules(proxy, c.proxy) {
		c.logger.Info("computing what kube-proxy programs as its version does", "version", proxy.String())
		all = true
	}
	c.proxy = proxy
	// Read after taking the changes: the sync's own marks then come with it or after it.
	synced := c.st.hasSynced()

	zone, found := c.st.thisNode()
	if zone != c.zone {
		c.logger.Info("node topology zone changed", "node", c.cfg.NodeName, "zone", zone, "previous", c.zone)
		c.zone, all = zone, true
	}
	if synced && !found && !c.nodeSeen {
		c.logger.Warn("this node's Node object is not in the API: topology hints are ignored, and endpoints count as local by --node-name only", "node", c.cfg.NodeName)
		c.nodeSeen = true // warn once
	}
	c.nodeSeen = c.nodeSeen || found
	if !synced {
		return
	}

	prev := c.state.Load()
	var keys []objKey
	if all {
		keys = c.st.serviceKeys()
		if len(keys) == 0 && len(prev.ports) == 0 && prev.synced == synced {
			return
		}
	} else {
		if len(dirty) == 0 && prev.synced == synced {
			return
		}
		keys = slices.Collect(maps.Keys(dirty))
	}
	node := thisNode{name: c.cfg.NodeName, zone: c.zone, proxy: c.proxy}
	fresh := make([]*ServicePort, 0, len(keys)) // most Services have one port
	for _, key := range keys {
		if svc, endpointSlices := c.st.service(key); svc != nil {
			fresh = appendServicePorts(fresh, svc, endpointSlices, node)
		}
	}
	var ports []*ServicePort
	if all {
		ports = sortPorts(fresh)
	} else {
		ports = mergePorts(prev.ports, dirty, fresh)
	}
	if c.endInitialSyncGC != nil {
		c.endInitialSyncGC() // restored before anyone sees the view synced
	}
	c.state.Store(&published{ports: ports, synced: synced, generation: prev.generation + 1})
	c.changes.Notify()
}

// probeLoop asks the API server for /version every probe interval on the watches' own
// client. Bookmarks count as heard, but the API server sends them only about once a minute
// per watch, so on a quiet cluster a working connection and a dead one look the same for
// longer than that; the probe tells them apart.
func (c *Cluster) probeLoop(ctx context.Context) {
	if c.api.probe == nil {
		return // a fake clientset in tests has no REST client
	}
	t := time.NewTicker(c.cfg.ProbeInterval)
	defer t.Stop()
	failing, fresh := false, false
	confirming := false
	for {
		err := c.probeOnce(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case err == nil:
			c.heard()
			c.setErr(nil)
			if confirming {
				c.changes.Notify() // the consumer that asked re-reads LastHeard
			}
			if failing {
				c.logger.Info("Kubernetes API server answers again", "host", c.host)
				c.changes.Notify()
			}
			failing = false
		default:
			c.setErr(err)
			if !failing {
				c.logger.Warn("Kubernetes API server not answering: the API view goes stale after --api.fresh-within", "host", c.host, "err", err)
				c.changes.Notify()
			}
			failing = true
		}
		// Fresh also changes with time alone (nothing heard for FreshWithin, a failed
		// watch's hold running out): tell the consumer within a probe interval.
		if now := c.Snapshot().Fresh; now != fresh {
			fresh = now
			c.changes.Notify()
		}
		confirming = false
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-c.confirm:
			confirming = true
		}
	}
}

// Confirm asks for a probe now, on the watches' own connection, without waiting for it: a
// success moves LastHeard and is told through Changed. The drift check asks when a difference
// has lasted the grace period but the view was last heard from before that, so that it is
// reported then rather than at the next probe. Requests while one is pending merge.
func (c *Cluster) Confirm() {
	select {
	case c.confirm <- struct{}{}:
	default:
	}
}

var _ Confirmer = (*Cluster)(nil)

func (c *Cluster) probeOnce(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.ProbeTimeout)
	defer cancel()
	err := c.api.probe(ctx)
	if err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return fmt.Errorf("probing the API server: no answer within %s: %w", c.cfg.ProbeTimeout, err)
		}
		return fmt.Errorf("probing the API server: %w", err)
	}
	return nil
}
