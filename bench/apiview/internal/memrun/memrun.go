// Package memrun measures, from inside the process, what a watcher of the API server costs
// until it holds every object and a few seconds after: resident memory (VmRSS before it
// starts, at sync, its high-water mark), the Go heap, and the runtime's memory classes at the
// highest VmRSS sample. viewrun (proxyhealth's API view) and informerrun (a client-go
// informer pair) both print its Result, so bench/apiview reads them alike.
package memrun

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/metrics"
	"runtime/pprof"
	"time"
)

// Result is what a run prints as JSON; bench/apiview decodes the same field names.
type Result struct {
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
	LiveHeap       uint64 `json:"live_heap_bytes"` // HeapAlloc after runtime.GC: what the watcher keeps
	LiveHeapInuse  uint64 `json:"live_heap_inuse_bytes"`
	GoSys          uint64 `json:"go_sys_bytes"`
	NumGC          uint32 `json:"num_gc"`
	BaselineRSSKiB int64  `json:"baseline_rss_kib"` // before the watcher was started
	BaselineHeap   uint64 `json:"baseline_heap_alloc_bytes"`
	// The sample with the highest VmRSS (taken every few milliseconds until the settled
	// figures), broken down as the Go runtime accounts its memory.
	Peak PeakSample `json:"peak"`
}

// PeakSample is the runtime's accounting at the highest VmRSS sample.
type PeakSample struct {
	AtSeconds    float64 `json:"at_seconds"`
	RSSKiB       int64   `json:"rss_kib"`
	HeapObjects  uint64  `json:"heap_objects_bytes"`  // live and not yet swept objects
	HeapUnused   uint64  `json:"heap_unused_bytes"`   // free space in spans in use
	HeapFree     uint64  `json:"heap_free_bytes"`     // free spans not returned to the OS
	Stacks       uint64  `json:"stacks_bytes"`        // goroutine stacks
	RuntimeOther uint64  `json:"runtime_other_bytes"` // GC metadata and other runtime structures
	Profiling    uint64  `json:"profiling_bytes"`     // the memory profiler's buckets (runtime.MemProfileRate)
}

// Watcher is what is measured.
type Watcher struct {
	// Start builds the watcher and starts it; it must not block. The watcher stops when ctx
	// ends. What it builds counts above the floor (the baseline figures).
	Start func(ctx context.Context) error
	// Synced reports whether the watcher holds everything, and how many service ports and
	// endpoints it holds. It is polled every 20 ms, as a consumer without notifications would.
	Synced func() (done bool, ports, endpoints int)
	// Settled, when set, is called once the settle time after sync has passed and returns
	// when the watcher is ready for the settled figures (until the deadline).
	Settled func(deadline time.Time)
	// Why says why the watcher has not synced, for the timeout's error.
	Why func() string
}

// Options are the run's settings.
type Options struct {
	Settle, Timeout time.Duration
	CPUProfile      string // a CPU profile of the start until sync; empty for none
}

// Measure starts w, waits until it has synced and opts.Settle more has passed, and returns the
// figures.
func Measure(opts Options, w Watcher) (Result, error) {
	var res Result
	res.BaselineRSSKiB, _ = procStatus("VmRSS:")
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	res.BaselineHeap = ms.HeapAlloc

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stopProfile := func() {}
	if opts.CPUProfile != "" {
		f, err := os.Create(opts.CPUProfile)
		if err != nil {
			return res, err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return res, fmt.Errorf("starting the CPU profile: %w", err)
		}
		stopProfile = pprof.StopCPUProfile
		defer stopProfile()
	}
	start := time.Now()
	sampled := make(chan PeakSample, 1)
	sampleCtx, stopSampling := context.WithCancel(ctx)
	defer stopSampling()
	go func() { sampled <- samplePeak(sampleCtx, start) }()
	if err := w.Start(ctx); err != nil {
		return res, err
	}

	deadline := time.Now().Add(opts.Timeout)
	for {
		done, ports, endpoints := w.Synced()
		if done {
			res.SyncSeconds = time.Since(start).Seconds()
			res.Ports, res.Endpoints = ports, endpoints
			break
		}
		if time.Now().After(deadline) {
			return res, fmt.Errorf("not synced after %s: %d ports, %d endpoints; %s", opts.Timeout, ports, endpoints, w.Why())
		}
		time.Sleep(20 * time.Millisecond)
	}
	stopProfile()
	res.SyncRSSKiB, _ = procStatus("VmRSS:")
	runtime.ReadMemStats(&ms)
	res.SyncHeapInuse, res.SyncHeapAlloc, res.SyncHeapSys, res.SyncTotalAlloc = ms.HeapInuse, ms.HeapAlloc, ms.HeapSys, ms.TotalAlloc

	time.Sleep(opts.Settle)
	if w.Settled != nil {
		w.Settled(deadline)
	}
	res.SettledRSSKiB, _ = procStatus("VmRSS:")
	res.HWMKiB, _ = procStatus("VmHWM:")
	stopSampling()
	res.Peak = <-sampled
	runtime.GC()
	runtime.ReadMemStats(&ms)
	res.LiveHeap, res.LiveHeapInuse, res.GoSys, res.NumGC = ms.HeapAlloc, ms.HeapInuse, ms.Sys, ms.NumGC
	return res, nil
}

// samplePeak samples VmRSS and the runtime's memory classes every 5 ms until ctx ends, and
// returns the sample with the highest VmRSS.
func samplePeak(ctx context.Context, start time.Time) PeakSample {
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
	var peak PeakSample
	status, err := newStatusReader()
	if err != nil {
		return peak
	}
	defer status.close()
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return peak
		case <-t.C:
		}
		rss, err := status.read("VmRSS:")
		if err != nil || rss <= peak.RSSKiB {
			continue
		}
		metrics.Read(samples)
		v := func(i int) uint64 { return samples[i].Value.Uint64() }
		peak = PeakSample{
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
	r, err := newStatusReader()
	if err != nil {
		return 0, err
	}
	defer r.close()
	return r.read(field)
}

// statusReader reads fields of /proc/self/status into one buffer, so that sampling every few
// milliseconds allocates nothing: garbage of the measurement's own would grow the heap it
// measures (at 200 reads a second, megabytes between two collections).
type statusReader struct {
	f   *os.File
	buf []byte
}

func newStatusReader() (*statusReader, error) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return nil, err
	}
	return &statusReader{f: f, buf: make([]byte, 8192)}, nil
}

func (r *statusReader) close() { r.f.Close() }

// read returns field (such as "VmRSS:") in KiB.
func (r *statusReader) read(field string) (int64, error) {
	n, err := r.f.ReadAt(r.buf, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return 0, fmt.Errorf("reading /proc/self/status: %w", err)
	}
	b := r.buf[:n]
	i := bytes.Index(b, []byte(field))
	if i < 0 {
		return 0, fmt.Errorf("no %s in /proc/self/status", field)
	}
	var v int64
	digits := false
	for _, c := range b[i+len(field):] {
		switch {
		case c >= '0' && c <= '9':
			v, digits = v*10+int64(c-'0'), true
		case c == ' ' || c == '\t':
			if digits {
				return v, nil
			}
		default:
			if !digits {
				return 0, fmt.Errorf("%s in /proc/self/status is not a number", field)
			}
			return v, nil
		}
	}
	return v, nil
}
