package kubeproxy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"
)

// poll is one poll of kube-proxy in a syncWatch scenario: its counters, and whether it found a
// new sync.
type poll struct {
	sync                bool
	received, fullSyncs float64
	pending             float64
	failures            float64
	unknown             bool // kube-proxy exported no change counters
	want                bool // the sync may have changed the rules
}

func TestSyncWatch(t *testing.T) {
	for _, tc := range []struct {
		name  string
		polls []poll
	}{
		{"periodic syncs with nothing received", []poll{
			{received: 5},
			{sync: true, received: 5},
			{received: 5},
			{sync: true, received: 5},
		}},
		{"a change received and applied between two polls", []poll{
			{received: 5},
			{sync: true, received: 6, want: true},
			{sync: true, received: 6},
		}},
		{"a change received before a poll, applied after it", []poll{
			{received: 5},
			{received: 6, pending: 1},
			{sync: true, received: 6, want: true},
			{sync: true, received: 6},
		}},
		// kube-proxy takes the pending changes in when a sync starts: a change received
		// after the last sync-seen poll and taken in by a sync still running at the next
		// poll shows as no change pending there, but the counter has moved since the last
		// sync was seen.
		{"a change taken in by a sync that ends after the next poll", []poll{
			{received: 5},
			{sync: true, received: 5},
			{received: 6},
			{sync: true, received: 6, want: true},
		}},
		{"a change pending at the poll that saw the last sync", []poll{
			{received: 5},
			{sync: true, received: 6, pending: 1, want: true},
			{sync: true, received: 6, want: true},
			{sync: true, received: 6},
		}},
		{"a full sync", []poll{
			{received: 5, fullSyncs: 1},
			{sync: true, received: 5, fullSyncs: 2, want: true},
		}},
		{"a failed sync", []poll{
			{received: 5},
			{received: 5, failures: 1},
			{sync: true, received: 5, failures: 1, want: true},
		}},
		{"kube-proxy restarted", []poll{
			{received: 500},
			{sync: true, received: 3, want: true},
		}},
		{"counters not exported", []poll{
			{unknown: true},
			{sync: true, unknown: true, want: true},
			{sync: true, unknown: true, want: true},
		}},
		{"no sync, whatever moved", []poll{
			{received: 5},
			{received: 9, pending: 4, fullSyncs: 1},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var w syncWatch
			for i, p := range tc.polls {
				res := &probeResult{
					endpointsPending: p.pending,
					restoreFailures:  p.failures,
					changes:          changeCounts{received: p.received, fullSyncs: p.fullSyncs, known: !p.unknown},
				}
				if got := w.observe(res, p.sync); got != p.want {
					t.Errorf("poll %d (%+v): may have changed the rules = %v, want %v", i, p, got, p.want)
				}
			}
		})
	}
}

// Through a real poll of a kube-proxy metrics endpoint: a periodic sync that received nothing
// is not told to OnSync, one that applied an EndpointSlice change is.
func TestOnSyncOnlyForSyncsThatChangedRules(t *testing.T) {
	var mu sync.Mutex
	last, endpointChanges := 1700000000.0, 7.0
	c, syncs := kubeProxyServer(t, &mu, func(w io.Writer) {
		fmt.Fprintf(w, "kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv4\"} %v\n", last)
		fmt.Fprintf(w, "kubeproxy_sync_proxy_rules_endpoint_changes_total %v\n", endpointChanges)
		fmt.Fprint(w, changeCountersRest)
	})
	step := func(changes float64) {
		mu.Lock()
		last++
		endpointChanges += changes
		mu.Unlock()
		c.pollOnce(context.Background())
	}
	c.pollOnce(context.Background())
	step(0)
	step(0)
	if *syncs != 0 {
		t.Errorf("OnSync called %d times for periodic syncs that received nothing", *syncs)
	}
	step(1)
	if *syncs != 1 {
		t.Errorf("OnSync called %d times after a sync that applied a change, want 1", *syncs)
	}
	step(0)
	if *syncs != 1 {
		t.Errorf("OnSync called %d times after a further periodic sync, want still 1", *syncs)
	}
}

// A dual-stack kube-proxy applies an IPv4 EndpointSlice change in its IPv4 proxier alone: the
// IPv6 family's last sync stays where it was, and the change is still told to OnSync.
func TestOnSyncForOneFamilysSync(t *testing.T) {
	var mu sync.Mutex
	lastV4, endpointChanges := 1700000000.0, 7.0
	c, syncs := kubeProxyServer(t, &mu, func(w io.Writer) {
		fmt.Fprintf(w, "kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv4\"} %v\n", lastV4)
		fmt.Fprint(w, "kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv6\"} 1699999000\n")
		fmt.Fprintf(w, "kubeproxy_sync_proxy_rules_endpoint_changes_total %v\n", endpointChanges)
		fmt.Fprint(w, changeCountersRest)
	})
	c.pollOnce(context.Background())
	mu.Lock()
	lastV4++
	endpointChanges++
	mu.Unlock()
	c.pollOnce(context.Background())
	if *syncs != 1 {
		t.Errorf("OnSync called %d times after an IPv4 sync that applied a change, want 1", *syncs)
	}
	// The age of the last sync is still the oldest family's.
	c.mu.Lock()
	res := c.probe
	c.mu.Unlock()
	if res == nil || !res.lastSync.Equal(time.Unix(1699999000, 0)) {
		t.Errorf("last sync %+v, want the IPv6 family's (1699999000)", res)
	}
}

// kubeProxyServer serves kube-proxy's /livez, and /metrics as write writes it (under a lock
// the test shares through mu), to a collector polled by hand that counts its OnSync calls.
func kubeProxyServer(t *testing.T, mu *sync.Mutex, write func(w io.Writer)) (c *Collector, syncs *int) {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		write(w)
	})
	mux.HandleFunc("/livez", func(http.ResponseWriter, *http.Request) {})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	c = newTestCollector(t, srv.URL, time.Unix(1700000100, 0))
	syncs = new(int)
	c.cfg.OnSync = func() { *syncs++ }
	return c, syncs
}

// changeCountersRest is kube-proxy's change counters other than its endpoint changes, none
// moving.
const changeCountersRest = `kubeproxy_sync_proxy_rules_service_changes_total 3
kubeproxy_sync_proxy_rules_endpoint_changes_pending 0
kubeproxy_sync_proxy_rules_service_changes_pending 0
kubeproxy_sync_full_proxy_rules_duration_seconds_bucket{le="+Inf"} 1
kubeproxy_sync_full_proxy_rules_duration_seconds_count 1
`
