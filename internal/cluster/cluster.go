package cluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// Cluster is the API view: it watches Services, EndpointSlices and this node, and publishes
// what kube-proxy on this node should have programmed. It implements View.
type Cluster struct {
	cfg    Config
	logger *slog.Logger
	now    func() time.Time

	// client and probe are nil while no API is configured; configErr says why.
	client    kubernetes.Interface
	probe     rest.Interface // the clientset's own REST client (same transport), for GET /version
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

	mu       sync.Mutex
	dirty    map[string]struct{} // Service keys ("namespace/name") to recompute
	allDirty bool

	// Owned by the recompute goroutine.
	inf       *informers
	byService map[string][]ServicePort
	zone      string
	nodeSeen  bool
}

type errBox struct{ err error }

// published is the part of a Snapshot computed from the informers' stores.
type published struct {
	ports      []ServicePort
	synced     bool
	generation uint64
}

var _ View = (*Cluster)(nil)

// New builds the API view. It reads the kubeconfig or in-cluster configuration but does not
// contact the API server: a cluster without a reachable, or any, API degrades to an unsynced
// view instead of failing the exporter's start.
func New(cfg Config, logger *slog.Logger) (*Cluster, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	c := newCluster(cfg, logger)
	restCfg, err := cfg.restConfig()
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
		cfg:       cfg,
		logger:    logger,
		now:       time.Now,
		wake:      make(chan struct{}, 1),
		dirty:     map[string]struct{}{},
		byService: map[string][]ServicePort{},
	}
	c.state.Store(&published{})
	return c
}

func (c *Cluster) useConfig(restCfg *rest.Config) error {
	client, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return fmt.Errorf("building the Kubernetes client for %s: %w", restCfg.Host, err)
	}
	c.client = client
	c.host = restCfg.Host
	// The discovery client shares the clientset's http.Client, so the probe travels on the
	// very HTTP/2 connection the watches use: if that connection is dead (incident 3), the
	// probe fails too, where a fresh connection would succeed and hide it.
	c.probe = client.Discovery().RESTClient()
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

// Run starts the informers, the recompute loop and the probe, and returns when ctx is done.
// Without an API configuration it retries finding one every probe interval.
func (c *Cluster) Run(ctx context.Context) {
	// client-go's reflectors report list and watch failures through klog; send them to
	// the exporter's log in its format.
	klog.SetSlogLogger(c.logger.With("component", "client-go"))
	if c.client == nil && !c.waitForConfig(ctx) {
		return
	}
	inf, err := newInformers(c.client, c.cfg.NodeName)
	if err != nil {
		c.setErr(err)
		c.logger.Error("API view not started", "err", err)
		return
	}
	c.inf = inf
	if err := c.addHandlers(); err != nil {
		c.setErr(err)
		c.logger.Error("API view not started", "err", err)
		return
	}
	var wg sync.WaitGroup
	for _, i := range []cache.SharedIndexInformer{inf.services, inf.endpointSlices, inf.node} {
		wg.Go(func() { i.RunWithContext(ctx) })
	}
	wg.Go(func() { c.recomputeLoop(ctx) })
	wg.Go(func() { c.probeLoop(ctx) })
	wg.Go(func() {
		if cache.WaitForCacheSync(ctx.Done(), inf.hasSynced) {
			c.logger.Info("API view synced", "node", c.cfg.NodeName)
			c.markAllDirty()
		}
	})
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
		restCfg, err := c.cfg.restConfig()
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

func (c *Cluster) addHandlers() error {
	serviceKey := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			c.markDirty(key)
		}
	}
	sliceKey := func(obj any) {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		if keys, _ := sliceServiceIndex(obj); len(keys) == 1 {
			c.markDirty(keys[0])
		}
	}
	// Every event is proof the watch connection works; a relist after a broken watch
	// delivers updates too.
	handlers := []struct {
		informer cache.SharedIndexInformer
		h        cache.ResourceEventHandlerFuncs
	}{{
		c.inf.services, cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { c.heard(); serviceKey(obj) },
			UpdateFunc: func(_, obj any) { c.heard(); serviceKey(obj) },
			DeleteFunc: func(obj any) { c.heard(); serviceKey(obj) },
		},
	}, {
		c.inf.endpointSlices, cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { c.heard(); sliceKey(obj) },
			UpdateFunc: func(old, obj any) { c.heard(); sliceKey(old); sliceKey(obj) },
			DeleteFunc: func(obj any) { c.heard(); sliceKey(obj) },
		},
	}, {
		// The node's zone label selects topology hints for every Service; its status
		// updates (which the transform empties) still arrive as events and count as heard.
		c.inf.node, cache.ResourceEventHandlerFuncs{
			AddFunc: func(any) { c.heard(); c.markAllDirty() },
			UpdateFunc: func(old, obj any) {
				c.heard()
				if nodeZone(old) != nodeZone(obj) {
					c.markAllDirty()
				}
			},
			DeleteFunc: func(any) { c.heard(); c.markAllDirty() },
		},
	}}
	for _, h := range handlers {
		if _, err := h.informer.AddEventHandler(h.h); err != nil {
			return fmt.Errorf("adding informer event handler: %w", err)
		}
		if err := h.informer.SetWatchErrorHandlerWithContext(c.watchFailed); err != nil {
			return fmt.Errorf("adding informer watch error handler: %w", err)
		}
	}
	return nil
}

// reflectorMaxBackoff is the longest client-go's reflector waits before retrying a failed
// watch (tools/cache: NewReflectorWithOptions' backoff manager, capped at 30 s).
const reflectorMaxBackoff = 30 * time.Second

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
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
		return
	}
	c.lastWatchErr.Store(&errBox{fmt.Errorf("a watch failed (the view is refreshed only by re-lists): %w", err)})
	c.lastWatchFailure.Store(c.now().UnixNano())
}

func nodeZone(obj any) string {
	if n, ok := obj.(*corev1.Node); ok {
		return n.Labels[corev1.LabelTopologyZone]
	}
	return ""
}

func (c *Cluster) markDirty(key string) {
	c.mu.Lock()
	c.dirty[key] = struct{}{}
	c.mu.Unlock()
	c.signal()
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

// recompute applies the pending changes to byService and publishes a new snapshot.
func (c *Cluster) recompute() {
	synced := c.inf.hasSynced()
	c.mu.Lock()
	dirty, all := c.dirty, c.allDirty
	c.dirty, c.allDirty = map[string]struct{}{}, false
	c.mu.Unlock()

	zone, found := c.currentNode()
	if zone != c.zone {
		c.logger.Info("node topology zone changed", "node", c.cfg.NodeName, "zone", zone, "previous", c.zone)
		c.zone, all = zone, true
	}
	if synced && !found && !c.nodeSeen {
		c.logger.Warn("this node's Node object is not in the API: topology hints are ignored, and endpoints count as local by --node-name only", "node", c.cfg.NodeName)
		c.nodeSeen = true // warn once
	}
	c.nodeSeen = c.nodeSeen || found

	if all {
		for _, key := range c.inf.services.GetIndexer().ListKeys() {
			dirty[key] = struct{}{}
		}
		for key := range c.byService {
			dirty[key] = struct{}{}
		}
	}
	prev := c.state.Load()
	if len(dirty) == 0 && prev.synced == synced {
		return
	}
	for key := range dirty {
		c.recomputeService(key)
	}
	c.state.Store(&published{ports: c.sortedPorts(), synced: synced, generation: prev.generation + 1})
}

func (c *Cluster) currentNode() (zone string, found bool) {
	obj, exists, err := c.inf.node.GetStore().GetByKey(c.cfg.NodeName)
	if err != nil || !exists {
		return "", false
	}
	return nodeZone(obj), true
}

func (c *Cluster) recomputeService(key string) {
	obj, exists, err := c.inf.services.GetIndexer().GetByKey(key)
	svc, ok := obj.(*corev1.Service)
	if ok {
		_, otherProxy := svc.Labels[labelServiceProxyName]
		ok = !otherProxy
	}
	if err != nil || !exists || !ok {
		// The list selector already leaves out Services of other proxies; the label is
		// checked again so a watch that does not apply the selector cannot add them.
		delete(c.byService, key)
		return
	}
	objs, err := c.inf.endpointSlices.GetIndexer().ByIndex(serviceIndex, key)
	if err != nil {
		c.logger.Error("reading EndpointSlices from the informer's index", "service", key, "err", err)
	}
	endpointSlices := make([]*discoveryv1.EndpointSlice, 0, len(objs))
	for _, o := range objs {
		if s, ok := o.(*discoveryv1.EndpointSlice); ok {
			endpointSlices = append(endpointSlices, s)
		}
	}
	if ports := ServicePorts(svc, endpointSlices, c.cfg.NodeName, c.zone); ports != nil {
		c.byService[key] = ports
	} else {
		delete(c.byService, key)
	}
}

// sortedPorts lists every service port sorted as Snapshot documents: by Name.String(), then
// Protocol. The string is built once per port, not per comparison.
func (c *Cluster) sortedPorts() []ServicePort {
	type keyed struct {
		name string
		port *ServicePort
	}
	var ks []keyed
	for _, ports := range c.byService {
		for i := range ports {
			ks = append(ks, keyed{ports[i].Name.String(), &ports[i]})
		}
	}
	slices.SortFunc(ks, func(a, b keyed) int {
		return cmp.Or(cmp.Compare(a.name, b.name), cmp.Compare(a.port.Name.Protocol, b.port.Name.Protocol))
	})
	out := make([]ServicePort, len(ks))
	for i, k := range ks {
		out[i] = *k.port
	}
	return out
}

// probeLoop asks the API server for /version every probe interval on the watches' own
// client. Informer handlers never see watch bookmarks, so on a quiet cluster a working
// connection and a dead one look the same to them; the probe tells them apart. /version is
// the cheapest request the API server answers for any authenticated client (no etcd read,
// allowed by the default system:public-info-viewer role).
func (c *Cluster) probeLoop(ctx context.Context) {
	if c.probe == nil {
		return // a fake clientset in tests has no REST client
	}
	t := time.NewTicker(c.cfg.ProbeInterval)
	defer t.Stop()
	failing := false
	for {
		err := c.probeOnce(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case err == nil:
			c.heard()
			c.setErr(nil)
			if failing {
				c.logger.Info("Kubernetes API server answers again", "host", c.host)
			}
			failing = false
		default:
			c.setErr(err)
			if !failing {
				c.logger.Warn("Kubernetes API server not answering: the API view goes stale after --api.fresh-within", "host", c.host, "err", err)
			}
			failing = true
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (c *Cluster) probeOnce(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.ProbeTimeout)
	defer cancel()
	err := c.probe.Get().AbsPath("/version").Do(ctx).Error()
	if err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return fmt.Errorf("probing the API server: no answer within %s: %w", c.cfg.ProbeTimeout, err)
		}
		return fmt.Errorf("probing the API server: %w", err)
	}
	return nil
}
