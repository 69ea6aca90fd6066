package cluster

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// A view whose watches fail is refreshed only by re-lists, tens of seconds apart, even while
// every list and probe succeeds: it is not fresh until no watch has failed for FreshWithin.
// Normal watch ends (EOF, an expired resource version) do not count.
func TestFailedWatchMakesTheViewStale(t *testing.T) {
	klog.SetOutput(io.Discard)
	now := time.Unix(1000, 0)
	c := newCluster(Config{FreshWithin: time.Minute}, nil)
	c.now = func() time.Time { return now }
	c.state.Store(&published{synced: true})
	c.heard()
	r := cache.NewReflector(&cache.ListWatch{}, &corev1.Service{}, cache.NewStore(cache.MetaNamespaceKeyFunc), 0)

	for _, normal := range []error{io.EOF, io.ErrUnexpectedEOF, apierrors.NewResourceExpired("too old"), apierrors.NewGone("gone")} {
		c.watchFailed(context.Background(), r, normal)
		if !c.Snapshot().Fresh {
			t.Fatalf("a normal watch end (%v) made the view stale", normal)
		}
	}
	forbidden := apierrors.NewForbidden(schema.GroupResource{Group: "discovery.k8s.io", Resource: "endpointslices"}, "", errors.New("no watch"))
	c.watchFailed(context.Background(), r, forbidden)
	now = now.Add(time.Second)
	c.heard() // lists and probes keep succeeding
	if c.Snapshot().Fresh {
		t.Error("fresh right after a refused watch")
	}
	if err := c.LastError(); err == nil || !strings.Contains(err.Error(), "a watch failed") {
		t.Errorf("LastError() = %v, want the watch failure", err)
	}
	// Between the reflector's retries (up to 30 s apart) the view stays stale.
	now = now.Add(45 * time.Second)
	c.heard()
	if c.Snapshot().Fresh {
		t.Error("fresh 45 s after a failed watch: the next retry may not have come yet")
	}
	now = now.Add(20 * time.Second)
	c.heard()
	if !c.Snapshot().Fresh || c.LastError() != nil {
		t.Errorf("over a minute without a failed watch: fresh %v, LastError %v; want fresh and no error", c.Snapshot().Fresh, c.LastError())
	}
}
