package conntrack

import (
	"context"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/promslog"

	"github.com/proxyhealth/proxyhealth/internal/cluster"
	"github.com/proxyhealth/proxyhealth/internal/notify"
)

// notifyingView is an API view that tells of its changes, as cluster.Cluster does.
type notifyingView struct {
	mu      sync.Mutex
	snap    *cluster.Snapshot
	changes notify.Changes
}

func (v *notifyingView) Snapshot() *cluster.Snapshot {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.snap
}

func (v *notifyingView) Subscribe() <-chan struct{} { return v.changes.Subscribe() }

func (v *notifyingView) publish(s *cluster.Snapshot) {
	v.mu.Lock()
	v.snap = s
	v.mu.Unlock()
	v.changes.Notify()
}

func webSnapshot(gen uint64, names ...string) *cluster.Snapshot {
	s := &cluster.Snapshot{Synced: true, Fresh: true, Generation: gen}
	for i, name := range names {
		s.Ports = append(s.Ports, &cluster.ServicePort{
			Name:       cluster.ServicePortName{Namespace: "lab", Name: name, Port: "http", Protocol: "TCP"},
			ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, 0, byte(10 + i)})}, Port: 80,
		})
	}
	return s
}

// A new generation of the API view reaches the Service map when the view tells of it: the
// collector has no timer of its own that would read it (the slow one is an hour here).
func TestServiceMapFollowsViewNotifications(t *testing.T) {
	view := &notifyingView{snap: webSnapshot(1, "web")}
	cfg := Config{ProcPath: "testdata/proc-full", UnrepliedAfter: time.Second, MaxTrackedFlows: 10, MaxServiceSeries: 10, SocketBufferBytes: 1,
		ServiceRefreshInterval: time.Hour, ResyncMinInterval: time.Hour, View: view, Kernel: &fakeKernel{}}
	c, err := New(cfg, promslog.NewNopLogger())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.refreshViewLoop(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	api := netip.AddrFrom4([4]byte{10, 96, 0, 11})
	waitLookup := func(what string, want bool) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
			if _, ok := c.view.Load().services.Lookup(api, 80, 6); ok == want && c.view.Load().services.Len() > 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatal(what)
			}
		}
	}
	waitLookup("the first Service map was never loaded", false)
	view.publish(webSnapshot(2, "web", "api"))
	waitLookup("the view's new generation never reached the Service map", true)
}
