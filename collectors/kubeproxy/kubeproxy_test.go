package kubeproxy

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/prometheus/common/promslog"
	"github.com/proxyhealth/proxyhealth/collectors/collectortest"
)

// fakeKubeProxy serves a metrics file and health answers.
func fakeKubeProxy(t *testing.T, metricsFile string, livez, healthz int) *httptest.Server {
	t.Helper()
	body, err := os.ReadFile(filepath.Join("testdata", metricsFile))
	if err != nil {
		t.Fatal(err)
	}
	return fakeKubeProxyBody(t, string(body), livez, healthz)
}

func fakeKubeProxyBody(t *testing.T, body string, livez, healthz int) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		fmt.Fprint(w, body)
	})
	mux.HandleFunc("/livez", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(livez) })
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(healthz) })
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

// newTestCollector builds the collector with default flags, pointed at base (a URL without
// path) and a log directory of its own, its clock at now.
func newTestCollector(t *testing.T, base string, now time.Time) *Collector {
	t.Helper()
	var cfg Config
	app := kingpin.New("test", "")
	cfg.AddFlags(app)
	if _, err := app.Parse([]string{
		"--kubeproxy.metrics-url=" + base + "/metrics",
		"--kubeproxy.health-url=" + base + "/livez",
		"--kubeproxy.log-path=" + filepath.Join(t.TempDir(), "*.log"),
	}); err != nil {
		t.Fatal(err)
	}
	cfg.Now = func() time.Time { return now }
	c, err := New(cfg, promslog.NewNopLogger())
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// lastSyncOf is kube-proxy's last sync in a captured metrics file.
func lastSyncOf(t *testing.T, file string) time.Time {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", file))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(l, kpLastSync+"{") {
			var v float64
			if _, err := fmt.Sscan(l[strings.LastIndexByte(l, ' ')+1:], &v); err != nil {
				t.Fatal(err)
			}
			return secondsTime(v)
		}
	}
	t.Fatalf("%s: no %s", file, kpLastSync)
	return time.Time{}
}

var probeMetricNames = []string{
	"proxyhealth_kubeproxy_up", "proxyhealth_kubeproxy_healthy", "proxyhealth_kubeproxy_last_sync_age_seconds",
	"proxyhealth_kubeproxy_sync_pending_seconds", "proxyhealth_kubeproxy_endpoint_changes_pending",
	"proxyhealth_kubeproxy_service_changes_pending", "proxyhealth_kubeproxy_sync_failures_total",
	"proxyhealth_kubeproxy_invalid_dropped_packets_total",
}

func TestProbeCapturedMetrics(t *testing.T) {
	for _, tc := range []struct {
		name, file string
		livez      int
		healthz    int
		want       string
	}{
		{
			name: "after healing", file: "kube-proxy-v1.36.3-metrics.txt", livez: 200, healthz: 200,
			want: `proxyhealth_kubeproxy_endpoint_changes_pending 0
proxyhealth_kubeproxy_healthy 1
proxyhealth_kubeproxy_invalid_dropped_packets_total 0
proxyhealth_kubeproxy_last_sync_age_seconds 30
proxyhealth_kubeproxy_service_changes_pending 0
proxyhealth_kubeproxy_sync_failures_total 0
proxyhealth_kubeproxy_sync_pending_seconds 0
proxyhealth_kubeproxy_up 1
`,
		},
		{
			// Black-holed: the rules are stale, yet kube-proxy cannot see the change, so
			// nothing is pending and it reports itself healthy (incident 3); only the log tells.
			name: "black-holed", file: "kube-proxy-v1.36.3-metrics-stale.txt", livez: 200, healthz: 200,
			want: `proxyhealth_kubeproxy_endpoint_changes_pending 0
proxyhealth_kubeproxy_healthy 1
proxyhealth_kubeproxy_invalid_dropped_packets_total 0
proxyhealth_kubeproxy_last_sync_age_seconds 30
proxyhealth_kubeproxy_service_changes_pending 0
proxyhealth_kubeproxy_sync_failures_total 0
proxyhealth_kubeproxy_sync_pending_seconds 0
proxyhealth_kubeproxy_up 1
`,
		},
		{
			// Older versions have no /livez: /healthz decides, and it fails (here: 503).
			name: "no livez, healthz failing", file: "kube-proxy-v1.36.3-metrics.txt", livez: 404, healthz: 503,
			want: `proxyhealth_kubeproxy_endpoint_changes_pending 0
proxyhealth_kubeproxy_healthy 0
proxyhealth_kubeproxy_invalid_dropped_packets_total 0
proxyhealth_kubeproxy_last_sync_age_seconds 30
proxyhealth_kubeproxy_service_changes_pending 0
proxyhealth_kubeproxy_sync_failures_total 0
proxyhealth_kubeproxy_sync_pending_seconds 0
proxyhealth_kubeproxy_up 1
`,
		},
		{
			name: "no livez, healthz fine", file: "kube-proxy-v1.36.3-metrics.txt", livez: 404, healthz: 200,
			want: `proxyhealth_kubeproxy_endpoint_changes_pending 0
proxyhealth_kubeproxy_healthy 1
proxyhealth_kubeproxy_invalid_dropped_packets_total 0
proxyhealth_kubeproxy_last_sync_age_seconds 30
proxyhealth_kubeproxy_service_changes_pending 0
proxyhealth_kubeproxy_sync_failures_total 0
proxyhealth_kubeproxy_sync_pending_seconds 0
proxyhealth_kubeproxy_up 1
`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := fakeKubeProxy(t, tc.file, tc.livez, tc.healthz)
			c := newTestCollector(t, srv.URL, lastSyncOf(t, tc.file).Add(30*time.Second))
			c.pollOnce(context.Background())
			if err := collectortest.CollectOK(t, c).Compare(tc.want, probeMetricNames...); err != nil {
				t.Error(err)
			}
		})
	}
}

// A stuck kube-proxy: a sync queued after the last applied one, and failures to apply.
func TestProbeStuckKubeProxy(t *testing.T) {
	body := `# TYPE kubeproxy_sync_proxy_rules_last_timestamp_seconds gauge
kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"} 1000
kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv6"} 1100
# TYPE kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds gauge
kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family="IPv4"} 1050
kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family="IPv6"} 1090
# TYPE kubeproxy_sync_proxy_rules_endpoint_changes_pending gauge
kubeproxy_sync_proxy_rules_endpoint_changes_pending 12
# TYPE kubeproxy_sync_proxy_rules_service_changes_pending gauge
kubeproxy_sync_proxy_rules_service_changes_pending 3
# TYPE kubeproxy_sync_proxy_rules_iptables_restore_failures_total counter
kubeproxy_sync_proxy_rules_iptables_restore_failures_total{ip_family="IPv4"} 4
kubeproxy_sync_proxy_rules_iptables_restore_failures_total{ip_family="IPv6"} 1
# TYPE kubeproxy_sync_proxy_rules_nftables_sync_failures_total counter
kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family="IPv4"} 2
`
	srv := fakeKubeProxyBody(t, body, 200, 200)
	c := newTestCollector(t, srv.URL, time.Unix(1200, 0))
	c.pollOnce(context.Background())
	want := `proxyhealth_kubeproxy_endpoint_changes_pending 12
proxyhealth_kubeproxy_healthy 1
proxyhealth_kubeproxy_last_sync_age_seconds 200
proxyhealth_kubeproxy_service_changes_pending 3
proxyhealth_kubeproxy_sync_failures_total 7
proxyhealth_kubeproxy_sync_pending_seconds 150
proxyhealth_kubeproxy_up 1
`
	if err := collectortest.CollectOK(t, c).Compare(want, probeMetricNames...); err != nil {
		t.Error(err)
	}
}

// kube-proxy absent (a closed port) or answering something else: up 0, and the collector
// itself succeeds.
func TestProbeKubeProxyAbsent(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + l.Addr().String()
	l.Close()
	notKubeProxy := httptest.NewServer(http.NotFoundHandler())
	defer notKubeProxy.Close()
	for name, base := range map[string]string{"closed port": closed, "404": notKubeProxy.URL} {
		t.Run(name, func(t *testing.T) {
			c := newTestCollector(t, base, testNow)
			c.pollOnce(context.Background())
			want := "proxyhealth_kubeproxy_healthy 0\nproxyhealth_kubeproxy_up 0\n"
			if err := collectortest.CollectOK(t, c).Compare(want, probeMetricNames...); err != nil {
				t.Error(err)
			}
		})
	}
}

// A kube-proxy that hangs costs a poll its timeout, and a scrape nothing.
func TestProbeHungKubeProxy(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { <-release }))
	defer srv.Close()
	defer close(release)
	c := newTestCollector(t, srv.URL, testNow)
	c.cfg.RequestTimeout = 200 * time.Millisecond
	c.prober = newProber(c.cfg.MetricsURL, c.cfg.HealthURL, c.cfg.RequestTimeout)
	start := time.Now()
	c.pollOnce(context.Background())
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("a poll of a hung kube-proxy took %v", took)
	}
	start = time.Now()
	if n := collectortest.CollectOK(t, c).Count("proxyhealth_kubeproxy_up"); n != 1 {
		t.Errorf("%d up series", n)
	}
	if took := time.Since(start); took > 100*time.Millisecond {
		t.Errorf("a scrape took %v", took)
	}
}

// The whole collector: Run follows a log and polls a kube-proxy; the exposition has every
// reflector failure series, the files followed, and kube-proxy's state.
func TestCollectorRun(t *testing.T) {
	srv := fakeKubeProxy(t, "kube-proxy-v1.36.3-metrics.txt", 200, 200)
	c := newTestCollector(t, srv.URL, testNow)
	c.cfg.LogPollInterval = 10 * time.Millisecond
	dir := filepath.Dir(c.cfg.LogPaths[0])
	log := filepath.Join(dir, "0.log")
	appendFile(t, log, errLine) // before start: not counted
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		c.Run(ctx)
		close(done)
	}()
	defer func() {
		cancel()
		<-done
	}()
	waitFor(t, func() bool { c.mu.Lock(); defer c.mu.Unlock(); return c.logsRead && c.probe != nil })
	data, err := os.ReadFile(filepath.Join("testdata", "kube-proxy-v1.36.3-watch-errors.log"))
	if err != nil {
		t.Fatal(err)
	}
	appendFile(t, log, string(data))
	waitFor(t, func() bool { c.mu.Lock(); defer c.mu.Unlock(); return c.logs.lines == 4 })

	want := `# TYPE proxyhealth_kubeproxy_list_errors_total counter
proxyhealth_kubeproxy_list_errors_total{resource="endpoints",verb="list"} 0
proxyhealth_kubeproxy_list_errors_total{resource="endpoints",verb="watch"} 0
proxyhealth_kubeproxy_list_errors_total{resource="endpointslices",verb="list"} 0
proxyhealth_kubeproxy_list_errors_total{resource="endpointslices",verb="watch"} 1
proxyhealth_kubeproxy_list_errors_total{resource="nodes",verb="list"} 0
proxyhealth_kubeproxy_list_errors_total{resource="nodes",verb="watch"} 1
proxyhealth_kubeproxy_list_errors_total{resource="other",verb="list"} 0
proxyhealth_kubeproxy_list_errors_total{resource="other",verb="watch"} 0
proxyhealth_kubeproxy_list_errors_total{resource="servicecidrs",verb="list"} 0
proxyhealth_kubeproxy_list_errors_total{resource="servicecidrs",verb="watch"} 1
proxyhealth_kubeproxy_list_errors_total{resource="services",verb="list"} 0
proxyhealth_kubeproxy_list_errors_total{resource="services",verb="watch"} 1
# TYPE proxyhealth_kubeproxy_last_list_error_timestamp_seconds gauge
proxyhealth_kubeproxy_last_list_error_timestamp_seconds 1.795294847996995e+09
# TYPE proxyhealth_kubeproxy_log_files_followed gauge
proxyhealth_kubeproxy_log_files_followed 1
# TYPE proxyhealth_kubeproxy_log_lines_skipped_total counter
proxyhealth_kubeproxy_log_lines_skipped_total 0
# TYPE proxyhealth_kubeproxy_log_lines_total counter
proxyhealth_kubeproxy_log_lines_total 4
`
	if err := collectortest.CollectOK(t, c).Compare(want,
		"proxyhealth_kubeproxy_list_errors_total", "proxyhealth_kubeproxy_last_list_error_timestamp_seconds",
		"proxyhealth_kubeproxy_log_files_followed", "proxyhealth_kubeproxy_log_lines_skipped_total",
		"proxyhealth_kubeproxy_log_lines_total"); err != nil {
		t.Error(err)
	}
	if n := collectortest.CollectOK(t, c).Count("proxyhealth_kubeproxy_up"); n != 1 {
		t.Errorf("%d up series", n)
	}
}

func TestConfigDefaultsAndValidation(t *testing.T) {
	var cfg Config
	app := kingpin.New("test", "")
	cfg.AddFlags(app)
	if _, err := app.Parse(nil); err != nil {
		t.Fatal(err)
	}
	c, err := New(cfg, promslog.NewNopLogger())
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(c.cfg.LogPaths, ",") != strings.Join(DefaultLogPaths, ",") {
		t.Errorf("log paths %v, want the defaults", c.cfg.LogPaths)
	}
	for _, args := range [][]string{
		{"--kubeproxy.log-path=/var/log/[x"},
		{"--kubeproxy.log-poll-interval=0s"},
		{"--kubeproxy.log-max-line-bytes=10"},
		{"--kubeproxy.timeout=0s"},
	} {
		var cfg Config
		app := kingpin.New("test", "")
		cfg.AddFlags(app)
		if _, err := app.Parse(args); err != nil {
			t.Fatal(err)
		}
		if _, err := New(cfg, promslog.NewNopLogger()); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A sync kube-proxy applied since the last poll is told to OnSync, once; a poll that finds
// the same last sync is not.
func TestOnSyncFollowsKubeProxysSyncs(t *testing.T) {
	var mu sync.Mutex
	last := 1700000000.0
	c, syncs := kubeProxyServer(t, &mu, func(w io.Writer) {
		fmt.Fprintf(w, "# TYPE kubeproxy_sync_proxy_rules_last_timestamp_seconds gauge\nkubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv4\"} %v\n", last)
	})
	c.pollOnce(context.Background())
	c.pollOnce(context.Background())
	if *syncs != 0 {
		t.Errorf("OnSync called %d times without a new sync", *syncs)
	}
	mu.Lock()
	last++
	mu.Unlock()
	c.pollOnce(context.Background())
	c.pollOnce(context.Background())
	if *syncs != 1 {
		t.Errorf("OnSync called %d times for one new sync, want 1", *syncs)
	}
}
