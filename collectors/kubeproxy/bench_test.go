package kubeproxy

import (
	"bytes"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/common/promslog"
)

// BenchmarkFollow measures the follower on CRI-format lines as kube-proxy's pod log has them
// (one reflector failure in every hundred): each iteration is one second of a busy
// kube-proxy at 10,000 lines/s, appended and then read by one poll.
func BenchmarkFollow(b *testing.B) {
	const linesPerPoll = 10000
	dir := b.TempDir()
	log := filepath.Join(dir, "0.log")
	writeLog(b, log, 1)
	fl := newFollower([]string{log}, 64<<10, time.Hour, promslog.NewNopLogger())
	defer fl.close()
	fl.poll()
	var before, after runtime.MemStats
	var elapsed time.Duration
	var bytes int64
	var mallocs uint64
	for b.Loop() {
		b.StopTimer()
		bytes += writeLog(b, log, linesPerPoll)
		runtime.ReadMemStats(&before)
		b.StartTimer()
		start := time.Now()
		fl.poll()
		elapsed += time.Since(start)
		b.StopTimer()
		runtime.ReadMemStats(&after)
		mallocs += after.Mallocs - before.Mallocs
		b.StartTimer()
	}
	lines := float64(b.N * linesPerPoll)
	if got := fl.stats.lines; got != uint64(lines) {
		b.Fatalf("read %d lines, want %.0f", got, lines)
	}
	b.ReportMetric(float64(elapsed.Nanoseconds())/lines, "ns/line")
	b.ReportMetric(float64(mallocs)/lines, "allocs/line")
	b.ReportMetric(float64(elapsed.Nanoseconds())/float64(b.N)/1e9*100, "%cpu@10klines/s")
	b.SetBytes(bytes / int64(b.N))
}

// TestFollowMemoryFlat reads a large log (1 GiB; 32 MiB with -short or the race detector) that
// appears after the follower started, so it is read whole in one poll, and checks that the
// heap in use does not grow with it.
func TestFollowMemoryFlat(t *testing.T) {
	size := int64(1 << 30)
	if testing.Short() || raceEnabled {
		size = 32 << 20
	}
	if v := os.Getenv("PROXYHEALTH_KUBEPROXY_LOG_BYTES"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("PROXYHEALTH_KUBEPROXY_LOG_BYTES: %v", err)
		}
		size = n
	}
	dir := t.TempDir()
	log := filepath.Join(dir, "0.log")
	fl := newFollower([]string{filepath.Join(dir, "*.log")}, 64<<10, time.Nanosecond, promslog.NewNopLogger())
	defer fl.close()
	fl.poll() // nothing yet: the file will be read from its start

	var written int64
	var lines int
	for written < size {
		written += writeLog(t, log, 100000)
		lines += 100000
	}

	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	stop := sampleHeapPeak(20 * time.Millisecond)
	start := time.Now()
	fl.poll()
	elapsed := time.Since(start)
	peak := max(before.HeapInuse, stop())
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)

	if fl.stats.lines != uint64(lines) || fl.stats.errors[resServices][verbWatch] != uint64((lines+99)/100) {
		t.Fatalf("read %d lines with %d failures, want %d and %d", fl.stats.lines, fl.stats.errors[resServices][verbWatch], lines, (lines+99)/100)
	}
	growth := int64(peak) - int64(before.HeapInuse)
	t.Logf("read %d MiB (%d lines) in %v (%.0f ns/line): HeapInuse before %.1f MiB, peak %.1f MiB (+%.1f MiB), after GC %.1f MiB",
		written>>20, lines, elapsed.Round(time.Millisecond), float64(elapsed.Nanoseconds())/float64(lines),
		float64(before.HeapInuse)/(1<<20), float64(peak)/(1<<20), float64(growth)/(1<<20), float64(after.HeapInuse)/(1<<20))
	if growth > 8<<20 {
		t.Errorf("heap in use grew by %d bytes while reading a %d byte log", growth, written)
	}
}

// BenchmarkScanMetrics reads kube-proxy's real metrics (v1.36.3, 1,150 lines, 103 KiB) with the
// line scan, and, for comparison, with the full expfmt parse the collector used before.
func BenchmarkScanMetrics(b *testing.B) {
	body, err := os.ReadFile(filepath.Join("testdata", "kube-proxy-v1.36.3-metrics.txt"))
	if err != nil {
		b.Fatal(err)
	}
	lines := float64(bytes.Count(body, []byte{'\n'}))
	b.Run("scan", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			var m kpMetrics
			if _, err := scanMetrics(bytes.NewReader(body), maxMetricsBodyBytes, metricsLineBytes, false, &m); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/lines, "ns/line")
	})
	b.Run("expfmt", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			parser := expfmt.NewTextParser(model.UTF8Validation)
			if _, err := parser.TextToMetricFamilies(bytes.NewReader(body)); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/lines, "ns/line")
	})
}

// sampleHeapPeak samples HeapInuse every interval until the returned function is called, which
// returns the highest sample.
func sampleHeapPeak(interval time.Duration) (stop func() uint64) {
	done := make(chan struct{})
	sampled := make(chan uint64)
	go func() {
		var ms runtime.MemStats
		var most uint64
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-done:
				sampled <- most
				return
			case <-tick.C:
				runtime.ReadMemStats(&ms)
				most = max(most, ms.HeapInuse)
			}
		}
	}()
	return func() uint64 {
		close(done)
		return <-sampled
	}
}
