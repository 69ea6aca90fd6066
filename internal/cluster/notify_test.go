package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// received waits up to d for a notification.
func received(ch <-chan struct{}, d time.Duration) bool {
	select {
	case <-ch:
		return true
	default:
	}
	select {
	case <-ch:
		return true
	case <-time.After(d):
		return false
	}
}

func drain(ch <-chan struct{}) {
	for {
		select {
		case <-ch:
		default:
			return
		}
	}
}

func TestChangedFollowsGenerations(t *testing.T) {
	c, client := startFake(t, node("node-a", ""), service("web"), epSlice("web-1", "web", ipv4, httpPort, apiEP("10.0.1.1", "")))
	var view View = c
	n, ok := view.(Notifier)
	if !ok {
		t.Fatal("Cluster is not a Notifier")
	}
	changed := n.Subscribe()
	portsAre(t, c, "ns/web:http/TCP=10.0.1.1:8080|")
	drain(changed)
	gen := c.Snapshot().Generation

	// Quiet: no notification.
	if received(changed, 100*time.Millisecond) {
		t.Error("notified without a change")
	}

	// A change: notified, and the snapshot read after the notification shows it.
	ctx := context.Background()
	s := epSlice("web-2", "web", ipv4, httpPort, apiEP("10.0.1.2", ""))
	if _, err := client.DiscoveryV1().EndpointSlices("ns").Create(ctx, s, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if !received(changed, 5*time.Second) {
		t.Fatal("no notification after a change")
	}
	if snap := c.Snapshot(); snap.Generation <= gen || len(render(snap.Ports)) != 1 {
		t.Errorf("after the notification: %+v, want a later generation than %d", snap, gen)
	}
	waitFor(t, "both endpoints", func() (bool, string) {
		got := render(c.Snapshot().Ports)
		return len(got) == 1 && got[0] == "ns/web:http/TCP=10.0.1.1:8080,10.0.1.2:8080|", fmt.Sprint(got)
	})

	// Changes while nobody reads never block the view: later changes still publish, and
	// they wait as one notification.
	drain(changed)
	for i := range 5 {
		svc := service(fmt.Sprintf("s%d", i), func(s *corev1.Service) {
			ip := fmt.Sprintf("10.96.1.%d", i+1)
			s.Spec.ClusterIP, s.Spec.ClusterIPs = ip, []string{ip}
		})
		if _, err := client.CoreV1().Services("ns").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(30 * time.Millisecond) // longer than RecomputeInterval: separate generations
	}
	waitFor(t, "six services", func() (bool, string) {
		got := render(c.Snapshot().Ports)
		return len(got) == 6, fmt.Sprint(got)
	})
	if l := len(changed); l != 1 {
		t.Errorf("%d notifications pending, want them merged into 1", l)
	}
}

func TestChangedOnWatchFailure(t *testing.T) {
	klog.SetOutput(io.Discard)
	c := newCluster(Config{FreshWithin: time.Minute}, testLogger())
	changed := c.Subscribe()
	r := cache.NewReflector(&cache.ListWatch{}, &corev1.Service{}, cache.NewStore(cache.MetaNamespaceKeyFunc), 0)
	c.watchFailed(context.Background(), r, io.EOF)
	if received(changed, 0) {
		t.Error("notified of a normal watch end")
	}
	c.watchFailed(context.Background(), r, apierrors.NewForbidden(schema.GroupResource{Resource: "services"}, "", errors.New("no")))
	if !received(changed, 0) {
		t.Error("not notified of a failed watch")
	}
}

// The probe's verdict flipping, and Fresh going false with time, are notified.
func TestChangedOnProbeFlip(t *testing.T) {
	srv := newFakeAPIServer(t)
	const freshWithin = 600 * time.Millisecond
	c, err := New(Config{
		Kubeconfig:        srv.kubeconfig(t),
		NodeName:          "node-a",
		FreshWithin:       freshWithin,
		ProbeInterval:     100 * time.Millisecond,
		ProbeTimeout:      100 * time.Millisecond,
		RecomputeInterval: 10 * time.Millisecond,
	}, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	changed := c.Subscribe()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { c.Run(ctx) })
	defer func() { cancel(); wg.Wait() }()
	waitFor(t, "synced and fresh", func() (bool, string) {
		s := c.Snapshot()
		return s.Synced && s.Fresh, fmt.Sprintf("%+v, last error %v", s, c.LastError())
	})
	// Quiet once the probe has seen the view fresh: nothing more to notify.
	waitFor(t, "no notification for three probe intervals", func() (bool, string) {
		drain(changed)
		return !received(changed, 300*time.Millisecond), "notifications keep coming"
	})

	srv.hung.Store(true)
	waitFor(t, "the probe failing", func() (bool, string) { return c.LastError() != nil, "no error" })
	if !received(changed, time.Second) {
		t.Fatalf("no notification when the probe started failing (last error %v)", c.LastError())
	}
	// Then, once nothing has been heard for FreshWithin, Fresh goes false: notified too.
	deadline := time.Now().Add(3 * freshWithin)
	for c.Snapshot().Fresh || !received(changed, 0) {
		if time.Now().After(deadline) {
			t.Fatalf("no notification when the view went stale: %+v", c.Snapshot())
		}
		time.Sleep(20 * time.Millisecond)
	}
	srv.hung.Store(false)
	if !received(changed, 2*time.Second) {
		t.Error("no notification when the probe answered again")
	}
}

// Confirm probes at once, not at the next probe interval, and tells the result through Subscribe.
func TestConfirmProbesNow(t *testing.T) {
	srv := newFakeAPIServer(t)
	c, err := New(Config{
		Kubeconfig:        srv.kubeconfig(t),
		NodeName:          "node-a",
		FreshWithin:       time.Hour,
		ProbeInterval:     time.Hour, // only the first probe, then only confirmations
		RecomputeInterval: 10 * time.Millisecond,
	}, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	changed := c.Subscribe()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { c.Run(ctx) })
	defer func() { cancel(); wg.Wait() }()
	waitFor(t, "synced, fresh and probed", func() (bool, string) {
		s := c.Snapshot()
		return s.Synced && s.Fresh && srv.versions.Load() >= 1, fmt.Sprintf("%+v", s)
	})
	waitFor(t, "quiet", func() (bool, string) {
		drain(changed)
		return !received(changed, 200*time.Millisecond), "notifications keep coming"
	})
	before := srv.versions.Load()
	c.Confirm()
	if !received(changed, 2*time.Second) {
		t.Fatal("no notification after a confirmation")
	}
	if got := srv.versions.Load(); got != before+1 {
		t.Errorf("/version asked %d times for one confirmation, want 1", got-before)
	}
}
