package kubeproxy

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// uniqueSeriesBody writes a kube-proxy metrics body of total bytes: real kube-proxy metrics
// (captured) after a family of unique series, each line about 150 bytes, generated as it is
// written so that the test's own heap does not hold the body.
func uniqueSeriesBody(w http.ResponseWriter, captured []byte, total int) (lines int) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	chunk := make([]byte, 0, 64<<10)
	written := 0
	flush := func() {
		if _, err := w.Write(chunk); err != nil {
			return
		}
		written += len(chunk)
		chunk = chunk[:0]
	}
	chunk = append(chunk, "# HELP rest_client_unique_requests_total Requests, one series each.\n# TYPE rest_client_unique_requests_total counter\n"...)
	lines = 2
	for i := 0; ; i++ {
		start := len(chunk)
		chunk = append(chunk, `rest_client_unique_requests_total{code="200",host="10.`...)
		chunk = strconv.AppendInt(chunk, int64(i>>16&255), 10)
		chunk = append(chunk, '.')
		chunk = strconv.AppendInt(chunk, int64(i>>8&255), 10)
		chunk = append(chunk, '.')
		chunk = strconv.AppendInt(chunk, int64(i&255), 10)
		chunk = append(chunk, `:6443",method="GET",path="/apis/discovery.k8s.io/v1/endpointslices",series="`...)
		chunk = strconv.AppendInt(chunk, int64(i), 10)
		chunk = append(chunk, `"} `...)
		chunk = strconv.AppendInt(chunk, int64(i%1000), 10)
		chunk = append(chunk, '\n')
		if written+len(chunk)+len(captured) > total {
			chunk = chunk[:start]
			break
		}
		lines++
		if len(chunk) > cap(chunk)-512 {
			flush()
		}
	}
	flush()
	_, _ = w.Write(captured)
	return lines + strings.Count(string(captured), "\n")
}

// TestProbeMemoryFlat polls a kube-proxy whose metrics body is 32 MiB (the cap) of unique
// series followed by its real metrics, and checks that the heap in use does not grow with the
// body and that the families read come out as from the real metrics alone.
func TestProbeMemoryFlat(t *testing.T) {
	const size = maxMetricsBodyBytes
	captured, err := os.ReadFile(filepath.Join("testdata", "kube-proxy-v1.36.3-metrics.txt"))
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan int, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			return
		}
		served <- uniqueSeriesBody(w, captured, size)
	}))
	defer srv.Close()
	smallSrv := fakeKubeProxyBody(t, string(captured), 200, 200)

	ctx := context.Background()
	want := newProber(smallSrv.URL+"/metrics", "", 30*time.Second).probe(ctx, testNow)
	p := newProber(srv.URL+"/metrics", "", 30*time.Second)

	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	stop := sampleHeapPeak(10 * time.Millisecond)
	start := time.Now()
	got := p.probe(ctx, testNow)
	elapsed := time.Since(start)
	peak := max(before.HeapInuse, stop())
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	peak = max(peak, after.HeapInuse)
	lines := <-served

	if !got.up {
		t.Fatalf("not up: %s", got.upReason)
	}
	if !sameReading(got, want) {
		t.Errorf("from the big body got %+v, want %+v", got, want)
	}
	if got.scan.longLines != 0 || got.scan.truncated {
		t.Errorf("scan %+v", got.scan)
	}
	growth := int64(peak) - int64(before.HeapInuse)
	t.Logf("read a %d MiB body (%d lines) in %v: HeapInuse before %.1f MiB, peak %.1f MiB (+%.1f MiB); %.0f KiB allocated, %d allocations; %s",
		size>>20, lines, elapsed.Round(time.Millisecond), float64(before.HeapInuse)/(1<<20), float64(peak)/(1<<20),
		float64(growth)/(1<<20), float64(after.TotalAlloc-before.TotalAlloc)/(1<<10), after.Mallocs-before.Mallocs, rssNote())
	if growth > 4<<20 {
		t.Errorf("heap in use grew by %.1f MiB while reading a %d MiB metrics body", float64(growth)/(1<<20), size>>20)
	}
}

// rssNote reports the process's resident set and its peak, where /proc tells them.
func rssNote() string {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return "RSS unknown"
	}
	var out []string
	for _, l := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(l, "VmRSS:") || strings.HasPrefix(l, "VmHWM:") {
			out = append(out, strings.Join(strings.Fields(l), " "))
		}
	}
	return strings.Join(out, ", ")
}

// The prober asks for the text format 0.0.4, and reads OpenMetrics text should kube-proxy
// answer with it anyway.
func TestProbeAcceptAndOpenMetrics(t *testing.T) {
	var accept string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		accept = r.Header.Get("Accept")
		w.Header().Set("Content-Type", "application/openmetrics-text; version=1.0.0; charset=utf-8")
		_, _ = w.Write([]byte(`# TYPE kubeproxy_sync_proxy_rules_last_timestamp_seconds gauge
kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"} 1000 1700000000.5
# TYPE kubeproxy_sync_proxy_rules_iptables_restore_failures counter
kubeproxy_sync_proxy_rules_iptables_restore_failures_total{ip_family="IPv4"} 4 # {trace_id="abc"} 1
# EOF
`))
	}))
	defer srv.Close()
	res := newProber(srv.URL+"/metrics", "", time.Second).probe(context.Background(), testNow)
	if !strings.HasPrefix(accept, "text/plain; version=0.0.4") {
		t.Errorf("Accept: %q", accept)
	}
	if !res.up || !res.lastSync.Equal(time.Unix(1000, 0)) || res.restoreFailures != 4 {
		t.Errorf("read %+v", res)
	}
}

// What a poll could not read of kube-proxy's metrics (a line of a family read longer than the
// line buffer) is logged once, and again when it changes; kube-proxy still counts as up.
func TestProbeLogsWhatItSkipped(t *testing.T) {
	body := "kubeproxy_sync_proxy_rules_endpoint_changes_pending{x=\"" + strings.Repeat("x", metricsLineBytes) + "\"} 1\n" +
		"kubeproxy_sync_proxy_rules_service_changes_pending 3\n"
	srv := fakeKubeProxyBody(t, body, 200, 200)
	c := newTestCollector(t, srv.URL, testNow)
	var logs bytes.Buffer
	c.logger = slog.New(slog.NewTextHandler(&logs, nil))
	c.pollOnce(context.Background())
	c.pollOnce(context.Background())
	if n := strings.Count(logs.String(), "longer than 64 KiB and were skipped"); n != 1 {
		t.Errorf("logged %d times:\n%s", n, logs.String())
	}
	if !c.probe.up || c.probe.hasEndpointsPending || c.probe.servicesPending != 3 {
		t.Errorf("read %+v", c.probe)
	}
}
