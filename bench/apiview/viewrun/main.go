// Command viewrun runs proxyhealth's API view (internal/cluster) alone against an API server
// and reports what it cost: peak resident memory (VmHWM), the Go heap, and the time until the
// view held every expected service port. bench/apiview starts it once per build being
// compared; it uses only the package's long-standing exported API (New, Run, Snapshot,
// LastError) so that the same file builds against older trees of the repository too.
//
// It prints one JSON object on stdout and logs to stderr.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"runtime/metrics"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/proxyhealth/proxyhealth/internal/cluster"
)

// result is what viewrun prints; bench/apiview decodes the same field names.
type result struct {
	Ports        int     `json:"ports"`
	Endpoints    int     `json:"endpoints"`
	SyncSeconds  float64 `json:"sync_seconds"`
	FreshSeconds float64 `json:"fresh_seconds"`
	// At sync, before any forced collection: what the process held as it finished.
	SyncRSSKiB     int64  `json:"sync_rss_kib"`
	SyncHeapInuse  uint64 `json:"sync_heap_inuse_bytes"`
	SyncHeapAlloc  uint64 `json:"sync_heap_alloc_bytes"`
	SyncHeapSys    uint64 `json:"sync_heap_sys_bytes"`
	SyncTotalAlloc uint64 `json:"sync_total_alloc_bytes"`
	SettledRSSKiB  int64  `json:"settled_rss_kib"`
	HWMKiB         int64  `json:"hwm_kib"`
	LiveHeap       uint64 `json:"live_heap_bytes"` // HeapAlloc after runtime.GC: what the view keeps
	LiveHeapInuse  uint64 `json:"live_heap_inuse_bytes"`
	GoSys          uint64 `json:"go_sys_bytes"`
	NumGC          uint32 `json:"num_gc"`
	BaselineRSSKiB int64  `json:"baseline_rss_kib"` // before the view was started
	BaselineHeap   uint64 `json:"baseline_heap_alloc_bytes"`
	// The sample with the highest VmRSS (taken every few milliseconds until the settled
	// figures), broken down as the Go runtime accounts its memory.
	Peak peakSample `json:"peak"`
}

type peakSample struct {
	AtSeconds    float64 `json:"at_seconds"`
	RSSKiB       int64   `json:"rss_kib"`
	HeapObjects  uint64  `json:"heap_objects_bytes"`  // live and not yet swept objects
	HeapUnused   uint64  `json:"heap_unused_bytes"`   // free space in spans in use
	HeapFree     uint64  `json:"heap_free_bytes"`     // free spans not returned to the OS
	Stacks       uint64  `json:"stacks_bytes"`        // goroutine stacks
	RuntimeOther uint64  `json:"runtime_other_bytes"` // GC metadata and other runtime structures
	Profiling    uint64  `json:"profiling_bytes"`     // the memory profiler's buckets (runtime.MemProfileRate)
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "viewrun: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		kubeconfig, nodeName string
		ports, endpoints     int
		settle, timeout      time.Duration
		verbose              bool
		cpuProfile           string
	)
	flag.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig of the API server")
	flag.StringVar(&nodeName, "node-name", "", "this node's name")
	flag.IntVar(&ports, "ports", 0, "service ports the view must hold before it counts as synced")
	flag.IntVar(&endpoints, "endpoints", 0, "cluster endpoints the view must hold (all ports together) before it counts as synced")
	flag.DurationVar(&settle, "settle", 5*time.Second, "time after sync before the settled figures are read")
	flag.DurationVar(&timeout, "timeout", 10*time.Minute, "give up after this long")
	flag.BoolVar(&verbose, "v", false, "log the view's own log lines to stderr")
	flag.StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile of the start until sync to this file")
	flag.Parse()
	if kubeconfig == "" || nodeName == "" || ports < 1 {
		return fmt.Errorf("--kubeconfig, --node-name and --ports are required")
	}
	var res result
	res.BaselineRSSKiB, _ = procStatus("VmRSS:")
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	res.BaselineHeap = ms.HeapAlloc

	out := io.Discard
	if verbose {
		out = os.Stderr
	}
	view, err := cluster.New(cluster.Config{
		Kubeconfig:    kubeconfig,
		NodeName:      nodeName,
		FreshWithin:   60 * time.Second,
		ProbeInterval: 15 * time.Second,
	}, slog.New(slog.NewTextHandler(out, nil)))
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	stopProfile := func() {}
	if cpuProfile != "" {
		f, err := os.Create(cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		stopProfile = pprof.StopCPUProfile
		defer stopProfile()
	}
	start := time.Now()
	sampled := make(chan peakSample, 1)
	sampleCtx, stopSampling := context.WithCancel(ctx)
	defer stopSampling()
	go func() { sampled <- samplePeak(sampleCtx, start) }()
	wg.Go(func() { view.Run(ctx) })

	// Poll, as a consumer without change notifications would: a Snapshot is cheap.
	deadline := time.Now().Add(timeout)
	freshAt := time.Duration(0)
	for {
		s := view.Snapshot()
		if freshAt == 0 && s.Fresh {
			freshAt = time.Since(start)
		}
		n := 0
		for _, p := range s.Ports {
			n += len(p.ClusterEndpoints)
		}
		if s.Synced && len(s.Ports) >= ports && n >= endpoints {
			res.SyncSeconds = time.Since(start).Seconds()
			res.Ports, res.Endpoints = len(s.Ports), n
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not synced after %s: synced %v, %d ports, %d endpoints, last error %v", timeout, s.Synced, len(s.Ports), n, view.LastError())
		}
		time.Sleep(20 * time.Millisecond)
	}
	stopProfile()
	res.SyncRSSKiB, _ = procStatus("VmRSS:")
	runtime.ReadMemStats(&ms)
	res.SyncHeapInuse, res.SyncHeapAlloc, res.SyncHeapSys, res.SyncTotalAlloc = ms.HeapInuse, ms.HeapAlloc, ms.HeapSys, ms.TotalAlloc

	time.Sleep(settle)
	for freshAt == 0 && time.Now().Before(deadline) {
		if view.Snapshot().Fresh {
			freshAt = time.Since(start)
		}
		time.Sleep(20 * time.Millisecond)
	}
	res.FreshSeconds = freshAt.Seconds()
	res.SettledRSSKiB, _ = procStatus("VmRSS:")
	res.HWMKiB, _ = procStatus("VmHWM:")
	stopSampling()
	res.Peak = <-sampled
	runtime.GC()
	runtime.ReadMemStats(&ms)
	res.LiveHeap, res.LiveHeapInuse, res.GoSys, res.NumGC = ms.HeapAlloc, ms.HeapInuse, ms.Sys, ms.NumGC
	return json.NewEncoder(os.Stdout).Encode(res)
}

// samplePeak samples VmRSS and the runtime's memory classes every 5 ms until ctx ends, and
// returns the sample with the highest VmRSS.
func samplePeak(ctx context.Context, start time.Time) peakSample {
	names := []string{
		"/memory/classes/heap/objects:bytes",
		"/memory/classes/heap/unused:bytes",
		"/memory/classes/heap/free:bytes",
		"/memory/classes/heap/stacks:bytes",
		"/memory/classes/os-stacks:bytes",
		"/memory/classes/metadata/other:bytes",
		"/memory/classes/metadata/mspan/inuse:bytes",
		"/memory/classes/metadata/mcache/inuse:bytes",
		"/memory/classes/other:bytes",
		"/memory/classes/profiling/buckets:bytes",
	}
	samples := make([]metrics.Sample, len(names))
	for i, n := range names {
		samples[i].Name = n
	}
	var peak peakSample
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return peak
		case <-t.C:
		}
		rss, err := procStatus("VmRSS:")
		if err != nil || rss <= peak.RSSKiB {
			continue
		}
		metrics.Read(samples)
		v := func(i int) uint64 { return samples[i].Value.Uint64() }
		peak = peakSample{
			AtSeconds:    time.Since(start).Seconds(),
			RSSKiB:       rss,
			HeapObjects:  v(0),
			HeapUnused:   v(1),
			HeapFree:     v(2),
			Stacks:       v(3) + v(4),
			RuntimeOther: v(5) + v(6) + v(7) + v(8),
			Profiling:    v(9),
		}
	}
}

// procStatus reads one KiB field of /proc/self/status.
func procStatus(field string) (int64, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, field); ok {
			return strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		}
	}
	return 0, fmt.Errorf("no %s in /proc/self/status", field)
}
