package cluster

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"runtime/metrics"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
)

// A list that cannot be streamed is read in pages at the most recent version, each page
// converted before the next is asked for, whatever version and limit the reflector asked for.
func TestPagedListConvertsPageByPage(t *testing.T) {
	var seen []metav1.ListOptions
	pages := [][]discoveryv1.EndpointSlice{
		{*epSlice("a-1", "a", ipv4, httpPort, apiEP("10.0.0.1", "")), *epSlice("b-1", "b", ipv4, httpPort)},
		{*epSlice("c-1", "c", ipv4, httpPort, apiEP("10.0.0.3", ""))},
	}
	var gcDuring []int64
	gcBefore := gcPercent(t)
	rc := resourceClient{
		list: func(_ context.Context, o metav1.ListOptions) (runtime.Object, error) {
			gcDuring = append(gcDuring, gcPercent(t))
			seen = append(seen, o)
			i := len(seen) - 1
			l := &discoveryv1.EndpointSliceList{Items: pages[i]}
			l.ResourceVersion = "7"
			if i < len(pages)-1 {
				l.Continue = "page-" + string(rune('1'+i))
			}
			return l, nil
		},
	}
	lw := newListWatch(rc, kindSlice, "node-a", true, kindStore{newState("node-a"), kindSlice}.Transformer(), nil)
	obj, err := lw.(cache.ListerWatcherWithContext).ListWithContext(context.Background(), metav1.ListOptions{ResourceVersion: "0", Limit: 0})
	if err != nil {
		t.Fatal(err)
	}
	list := obj.(*compactList)
	if len(list.Items) != 3 || list.ResourceVersion != "7" {
		t.Fatalf("list %+v, want three items at version 7", list)
	}
	for i, item := range list.Items {
		if s, ok := item.(*sliceInfo); !ok || s.key.name != []string{"a-1", "b-1", "c-1"}[i] {
			t.Errorf("item %d is %#v, want the compact slice", i, item)
		}
	}
	if len(seen) != 2 {
		t.Fatalf("%d pages asked for, want 2", len(seen))
	}
	for i, o := range seen {
		if o.ResourceVersion != "" || o.Limit != listPageSize || o.LabelSelector != "!service.kubernetes.io/headless" {
			t.Errorf("page %d asked with %+v, want the most recent version, limit %d and the headless selector", i, o, listPageSize)
		}
	}
	if seen[0].Continue != "" || seen[1].Continue != "page-1" {
		t.Errorf("continue tokens %q, %q; want none, then the first page's", seen[0].Continue, seen[1].Continue)
	}
	// The collector's target is lowered while the pages are read, and restored after.
	for i, p := range gcDuring {
		if p != min(gcBefore, listGCPercent) {
			t.Errorf("GC target %d while page %d was read, want %d", p, i, min(gcBefore, listGCPercent))
		}
	}
	if p := gcPercent(t); p != gcBefore {
		t.Errorf("GC target %d after the list, want %d back", p, gcBefore)
	}

	failing := resourceClient{list: func(context.Context, metav1.ListOptions) (runtime.Object, error) {
		return nil, errors.New("refused")
	}}
	if _, err := pagedList(context.Background(), failing, kindStore{newState("node-a"), kindSlice}.Transformer(), metav1.ListOptions{}); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Errorf("a failed page: %v, want its error", err)
	}
}

// gcPercent reads the garbage collector's current target.
func gcPercent(t *testing.T) int64 {
	t.Helper()
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		t.Fatalf("/gc/gogc:percent is not supported")
	}
	return int64(s[0].Value.Uint64())
}

// Lists of several kinds at once: the target is restored when the last one ends, and a lower
// one is left alone.
func TestLowerGCForListNests(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	first := lowerGCForList()
	second := lowerGCForList()
	first()
	if p := gcPercent(t); p != listGCPercent {
		t.Errorf("GC target %d with one list still read, want %d", p, listGCPercent)
	}
	second()
	if p := gcPercent(t); p != 100 {
		t.Errorf("GC target %d after both lists, want 100", p)
	}
	defer debug.SetGCPercent(debug.SetGCPercent(20))
	lowerGCForList()()
	if p := gcPercent(t); p != 20 {
		t.Errorf("GC target %d after a list with GOGC=20, want 20 kept", p)
	}
}

// Each kind lists and watches with kube-proxy's selectors.
func TestListWatchSelectors(t *testing.T) {
	for _, tc := range []struct {
		kind         kind
		label, field string
		list         runtime.Object
	}{
		{kindService, "!service.kubernetes.io/service-proxy-name", "spec.clusterIP!=None", &corev1.ServiceList{}},
		{kindSlice, "!service.kubernetes.io/headless", "", &discoveryv1.EndpointSliceList{}},
		{kindNode, "", "metadata.name=node-a", &corev1.NodeList{}},
	} {
		var got []metav1.ListOptions
		rc := resourceClient{
			list: func(_ context.Context, o metav1.ListOptions) (runtime.Object, error) {
				got = append(got, o)
				return tc.list, nil
			},
			watch: func(_ context.Context, o metav1.ListOptions) (watch.Interface, error) {
				got = append(got, o)
				return watch.NewEmptyWatch(), nil
			},
		}
		lw := newListWatch(rc, tc.kind, "node-a", false, kindStore{newState("node-a"), tc.kind}.Transformer(), nil).(cache.ListerWatcherWithContext)
		if _, err := lw.ListWithContext(context.Background(), metav1.ListOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := lw.WatchWithContext(context.Background(), metav1.ListOptions{}); err != nil {
			t.Fatal(err)
		}
		for _, o := range got {
			if o.LabelSelector != tc.label || o.FieldSelector != tc.field {
				t.Errorf("kind %d: options %+v, want label %q, field %q", tc.kind, o, tc.label, tc.field)
			}
		}
	}
}

// A streamed list (a watch with sendInitialEvents) lowers the collector's target from the
// watch's start until the list is stored, or until the watch is refused or stopped first;
// other watches leave it alone.
func TestStreamedListLowersGC(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	refuse := false
	rc := resourceClient{
		watch: func(context.Context, metav1.ListOptions) (watch.Interface, error) {
			if refuse {
				return nil, errors.New("sendInitialEvents is forbidden")
			}
			return watch.NewFake(), nil
		},
	}
	gc := &streamGC{}
	store := streamedListStore{kindStore{newState("node-a"), kindSlice}, gc}
	lw := newListWatch(rc, kindSlice, "node-a", false, store.Transformer(), gc).(cache.ListerWatcherWithContext)
	stream := func() (watch.Interface, error) {
		yes := true
		return lw.WatchWithContext(context.Background(), metav1.ListOptions{SendInitialEvents: &yes, AllowWatchBookmarks: true})
	}
	wantGC := func(when string, want int64) {
		t.Helper()
		if p := gcPercent(t); p != want {
			t.Errorf("GC target %d %s, want %d", p, when, want)
		}
	}

	if _, err := stream(); err != nil {
		t.Fatal(err)
	}
	wantGC("while a list streams", listGCPercent)
	if err := store.Replace(nil, "7"); err != nil {
		t.Fatal(err)
	}
	wantGC("once the streamed list is stored", 100)

	w, err := lw.WatchWithContext(context.Background(), metav1.ListOptions{ResourceVersion: "7"})
	if err != nil {
		t.Fatal(err)
	}
	wantGC("during a watch from a version", 100)
	w.Stop()

	w, err = stream()
	if err != nil {
		t.Fatal(err)
	}
	w.Stop()
	wantGC("after a streamed list's watch stopped before the list was stored", 100)

	refuse = true
	if _, err := stream(); err == nil {
		t.Fatal("a refused watch returned no error")
	}
	wantGC("after a streamed list was refused", 100)
}

// The view keeps the collector's target lowered from its start until its first synced
// snapshot is published, the lists, the store's replacement and the first computation of
// every Service included, and restores it then.
func TestInitialSyncLowersGC(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	cfg := Config{NodeName: "node-a", FreshWithin: time.Minute, ProbeInterval: time.Second, RecomputeInterval: 10 * time.Millisecond}
	if err := cfg.setDefaults(); err != nil {
		t.Fatal(err)
	}
	client := fake.NewClientset(node("node-a", "zone-a"))
	src := fakeSource(client)
	release := make(chan struct{})
	var gcWhileListing atomic.Int64
	list := src.services.list
	src.services.list = func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
		gcWhileListing.Store(gcPercent(t))
		select {
		case <-release:
		case <-ctx.Done():
		}
		return list(ctx, o)
	}
	c := newCluster(cfg, testLogger())
	c.api = src
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { c.Run(ctx) })
	defer func() { cancel(); wg.Wait() }()

	waitFor(t, "the Services' list", func() (bool, string) {
		return gcWhileListing.Load() != 0, "not asked yet"
	})
	if p := gcWhileListing.Load(); p != listGCPercent {
		t.Errorf("GC target %d while the Services were listed, want %d", p, listGCPercent)
	}
	if p := gcPercent(t); p != listGCPercent {
		t.Errorf("GC target %d before the view synced, want %d", p, listGCPercent)
	}
	close(release)
	waitFor(t, "synced", func() (bool, string) {
		s := c.Snapshot()
		return s.Synced, fmt.Sprintf("%+v", s)
	})
	if p := gcPercent(t); p != 100 {
		t.Errorf("GC target %d once the view synced, want 100 back", p)
	}
}

// A view whose lists fail does not keep the collector's target lowered while it waits for the
// API: the failure ends the initial sync's window.
func TestFailedListEndsInitialSyncGC(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	cfg := Config{NodeName: "node-a", FreshWithin: time.Minute, ProbeInterval: time.Second, RecomputeInterval: 10 * time.Millisecond}
	if err := cfg.setDefaults(); err != nil {
		t.Fatal(err)
	}
	src := fakeSource(fake.NewClientset())
	var calls atomic.Int64
	src.services.list = func(context.Context, metav1.ListOptions) (runtime.Object, error) {
		calls.Add(1)
		return nil, errors.New("connection refused")
	}
	c := newCluster(cfg, testLogger())
	c.api = src
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { c.Run(ctx) })
	defer func() { cancel(); wg.Wait() }()
	waitFor(t, "the target restored after the failed list", func() (bool, string) {
		p := gcPercent(t)
		return calls.Load() > 0 && p == 100, fmt.Sprintf("%d lists, GC target %d", calls.Load(), p)
	})
	if c.Snapshot().Synced {
		t.Fatal("synced without Services")
	}
}
