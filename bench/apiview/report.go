//go:build linux

package main

import (
	"fmt"
	"strings"

	"github.com/proxyhealth/proxyhealth/bench/internal/benchrun"
	"github.com/proxyhealth/proxyhealth/bench/internal/spread"
)

// report is everything one run measured.
type report struct {
	cfg config
	benchrun.Machine
	Version string
	Builds  []*build
	Kube    *kubeResult
}

func (b *build) field(f func(viewResult) float64) []float64 {
	var out []float64
	for _, r := range b.Runs {
		out = append(out, f(r))
	}
	return out
}

func mibBytes(b uint64) float64 { return float64(b) / (1 << 20) }

func (r *report) render() string {
	if r == nil {
		return "" // the run failed before it measured anything
	}
	var b strings.Builder
	fmt.Fprintf(&b, "## API view alone at %d services x %d endpoints\n\n", r.cfg.services, r.cfg.endpoints)
	fmt.Fprintf(&b, "%s, Linux %s, %s (%d cores), commit %s. `%s`\n\n", r.Date, r.Kernel, r.CPU, r.Cores, r.Commit, r.Cmdline)
	k := r.Kube
	if k == nil || (k.Load == 0 && !k.Reused) {
		b.WriteString("The control plane failed before the load ended.\n")
		return b.String()
	}
	fmt.Fprintf(&b, "etcd and kube-apiserver %s in namespace %s (loopback, token auth), up in %.1f s. ", r.Version, k.NS, k.ControlPlaneUp.Seconds())
	if k.Reused {
		fmt.Fprintf(&b, "%d Services and %d EndpointSlices (%d ready endpoints, %d of them on this node), loaded by an earlier run into etcd's data in %s.\n\n",
			k.Services, k.Slices, k.Endpoints, k.LocalEndpoints, r.cfg.etcdData)
	} else {
		fmt.Fprintf(&b, "Loaded %d Services and %d EndpointSlices (%d ready endpoints, %d of them on this node) with %d parallel clients in %.1f s (%d retried calls).\n\n",
			k.Services, k.Slices, k.Endpoints, k.LocalEndpoints, r.cfg.workers, k.Load.Seconds(), k.LoadRetries)
	}
	b.WriteString("Each figure is the median of the runs, with the range when there are several. The peak is the process's VmHWM, read by itself once the view held every service port and endpoint and 5 s more had passed; ")
	b.WriteString("the floor is its VmRSS before the view started (binary, runtime, client-go's package state); the live heap is HeapAlloc after a forced collection. ")
	b.WriteString("The informer pair (informerrun) is client-go's shared informers on Services and EndpointSlices from a clientset, holding every object whole. ")
	b.WriteString("kube-apiserver's and etcd's CPU seconds and the LIST requests (each page one; a streamed list is a watch) are counted from each run's start to its end (sync, then 5 s of quiet watches).\n\n")
	if r.cfg.watchList {
		b.WriteString("kube-apiserver offers streamed lists (its WatchList feature, on by default).\n\n")
	} else {
		b.WriteString("kube-apiserver runs with `--feature-gates=WatchList=false`: it refuses streamed lists, and clients list.\n\n")
	}
	b.WriteString("| build | runs | peak RSS (VmHWM) MiB | RSS at sync MiB | floor RSS MiB | heap in use at sync MiB | live heap after sync MiB | allocated until sync MiB | sync s | GCs | apiserver CPU s | etcd CPU s | LIST requests |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, bd := range r.Builds {
		fmt.Fprintf(&b, "| %s (%s) | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", bd.Name, bd.Rev, len(bd.Runs),
			spread.Format(bd.field(func(v viewResult) float64 { return mib(v.HWMKiB) }), "%.1f"),
			spread.Format(bd.field(func(v viewResult) float64 { return mib(v.SyncRSSKiB) }), "%.1f"),
			spread.Format(bd.field(func(v viewResult) float64 { return mib(v.BaselineRSSKiB) }), "%.1f"),
			spread.Format(bd.field(func(v viewResult) float64 { return mibBytes(v.SyncHeapInuse) }), "%.1f"),
			spread.Format(bd.field(func(v viewResult) float64 { return mibBytes(v.LiveHeap) }), "%.1f"),
			spread.Format(bd.field(func(v viewResult) float64 { return mibBytes(v.SyncTotalAlloc) }), "%.0f"),
			spread.Format(bd.field(func(v viewResult) float64 { return v.SyncSeconds }), "%.2f"),
			spread.Format(bd.field(func(v viewResult) float64 { return float64(v.NumGC) }), "%.0f"),
			spread.Format(bd.field(func(v viewResult) float64 { return v.APIServerCPU }), "%.2f"),
			spread.Format(bd.field(func(v viewResult) float64 { return v.EtcdCPU }), "%.2f"),
			spread.Format(bd.field(func(v viewResult) float64 { return float64(v.Lists) }), "%.0f"),
		)
	}
	b.WriteString("\nEach run's highest VmRSS sample (every 5 ms), and how the Go runtime accounted its memory at that moment (MiB): heap objects (live and not yet swept), free space in the spans in use, free spans not yet returned to the OS, stacks, runtime metadata, the memory profiler's buckets (Go's default sampling). The rest of VmRSS is the binary's pages and what the runtime does not account.\n\n")
	b.WriteString("| build | run | at s | VmRSS | heap objects | span free space | free spans | stacks | runtime | profiler |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, bd := range r.Builds {
		for i, v := range bd.Runs {
			p := v.Peak
			fmt.Fprintf(&b, "| %s | %d | %.2f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f |\n", bd.Name, i+1, p.AtSeconds, mib(p.RSSKiB),
				mibBytes(p.HeapObjects), mibBytes(p.HeapUnused), mibBytes(p.HeapFree), mibBytes(p.Stacks), mibBytes(p.RuntimeOther), mibBytes(p.Profiling))
		}
	}
	fmt.Fprintf(&b, "\nkube-apiserver at the end: VmRSS %.1f MiB (VmHWM %.1f); etcd: VmRSS %.1f MiB (VmHWM %.1f).\n", mib(k.APIServer.RSSKiB), mib(k.APIServer.HWMKiB), mib(k.Etcd.RSSKiB), mib(k.Etcd.HWMKiB))
	gogc := "unset (100)"
	if r.cfg.gogc != "" {
		gogc = r.cfg.gogc
	}
	godebug := "unset"
	switch r.cfg.godebug {
	case "":
	case imageGODEBUG:
		godebug = r.cfg.godebug + " (as the image sets)"
	default:
		godebug = r.cfg.godebug
	}
	fmt.Fprintf(&b, "viewrun: --fresh-within 60s --probe-interval 15s, GOGC %s, GODEBUG %s.\n", gogc, godebug)
	return b.String()
}

func (r *fanoutReport) render() string {
	if r == nil {
		return "" // the run failed before it measured anything
	}
	var b strings.Builder
	fmt.Fprintf(&b, "## API fan-out: %d watchers of each kind at %d services x %d endpoints\n\n", r.cfg.watchers, r.cfg.services, r.cfg.endpoints)
	fmt.Fprintf(&b, "%s, Linux %s, %s (%d cores), commit %s. `%s`\n\n", r.Date, r.Kernel, r.CPU, r.Cores, r.Commit, r.Cmdline)
	k := r.Kube
	if k == nil || (k.Load == 0 && !k.Reused) {
		b.WriteString("The control plane failed before the load ended.\n")
		return b.String()
	}
	fmt.Fprintf(&b, "etcd and kube-apiserver %s in namespace %s (loopback, token auth): %d Services and %d EndpointSlices (%d endpoints). ", r.Version, k.NS, k.Services, k.Slices, k.Endpoints)
	fmt.Fprintf(&b, "Each phase starts its watchers in one process, each on a connection of its own, waits until all have synced, then patches one endpoint's readiness %.0f times a second for %s. ", r.cfg.churnRate, r.cfg.churn)
	b.WriteString("CPU is the process's user and system time over the phase (percent of one core); RSS the mean of 1 s samples; peaks are VmHWM, reset at each phase's start.\n\n")
	b.WriteString("| watchers | sync s | list requests until synced | apiserver CPU s until synced | etcd CPU s until synced | apiserver peak RSS until synced MiB | watches open | changes made | apiserver CPU % (churn) | etcd CPU % (churn) | apiserver RSS MiB (churn, mean) | apiserver peak RSS MiB (churn) | apiserver Go heap MiB (churn's end) | load avg |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, p := range r.Phases {
		name := "none"
		if p.Watchers > 0 {
			name = fmt.Sprintf("%d × %s", p.Watchers, p.Kind)
		}
		fmt.Fprintf(&b, "| %s | %.1f | %d | %.1f | %.1f | %.0f | %d | %d | %.1f | %.1f | %.0f | %.0f | %.0f | %.1f–%.1f |\n", name,
			p.SyncSeconds, p.Lists, p.SyncAPIServerCPU, p.SyncEtcdCPU, mib(p.SyncAPIServerPeak), p.Watches, p.Changes,
			p.ChurnAPIServerCPU, p.ChurnEtcdCPU, mib(p.ChurnAPIServerRSS), mib(p.ChurnAPIServerPeak), mib(p.APIServerHeap), p.ChurnLoad1Start, p.Load1E)
	}
	if len(r.Phases) == 3 {
		none := r.Phases[0]
		b.WriteString("\nPer watcher, above no watchers, and linearly at 5,000 nodes (one watcher a node, one API server):\n\n")
		b.WriteString("| kind | apiserver CPU s per sync | apiserver CPU % per watcher (churn) | apiserver RSS MiB per watcher (churn) | apiserver Go heap MiB per watcher | 5,000: apiserver cores (churn) | 5,000: apiserver RSS GiB | 5,000: apiserver Go heap GiB | 5,000: apiserver CPU s for every node to sync |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, p := range r.Phases[1:] {
			n := float64(p.Watchers)
			cpu := (p.ChurnAPIServerCPU - none.ChurnAPIServerCPU) / n
			mem := (mib(p.ChurnAPIServerRSS) - mib(none.ChurnAPIServerRSS)) / n
			heap := (mib(p.APIServerHeap) - mib(none.APIServerHeap)) / n
			sync := p.SyncAPIServerCPU / n
			fmt.Fprintf(&b, "| %s | %.2f | %.3f | %.2f | %.2f | %.1f | %.1f | %.1f | %.0f |\n", p.Kind, sync, cpu, mem, heap, cpu*5000/100, mem*5000/1024, heap*5000/1024, sync*5000)
		}
		if none.HeapMetric != "" {
			fmt.Fprintf(&b, "\nThe Go heap is kube-apiserver's %s.\n", none.HeapMetric)
		}
	}
	fmt.Fprintf(&b, "\nkube-apiserver at the end: VmRSS %.1f MiB; etcd: VmRSS %.1f MiB.\n", mib(k.APIServer.RSSKiB), mib(k.Etcd.RSSKiB))
	return b.String()
}
