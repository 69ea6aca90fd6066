//go:build linux

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/proxyhealth/proxyhealth/bench/internal/benchns"
	"github.com/proxyhealth/proxyhealth/bench/internal/benchrun"
	"github.com/proxyhealth/proxyhealth/bench/internal/nsproc"
	"github.com/proxyhealth/proxyhealth/bench/internal/synthcluster"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// The fanout subcommand: what --watchers watchers of every Service and EndpointSlice cost
// kube-apiserver (and etcd) while endpoints change, proxyhealth's API views next to plain
// client-go informers, in one run against one control plane. Each watcher has a connection of
// its own, as each node's would. See README.md.

type fanoutConfig struct {
	config
	watchers  int
	churnRate float64
	churn     time.Duration
}

// fanoutPhase is one set of watchers (or none) and what the control plane spent on it.
type fanoutPhase struct {
	Kind     string // "none", "view" or "informer"
	Watchers int
	// Until every watcher had synced, from its start.
	SyncSeconds       float64
	SyncAPIServerCPU  float64 // CPU seconds
	SyncEtcdCPU       float64 // CPU seconds
	SyncAPIServerPeak int64   // VmHWM KiB, reset at the phase's start
	Lists             int     // LIST requests (pages) on Services and EndpointSlices until synced
	Watches           int     // WATCH requests in flight on Services and EndpointSlices (apiserver_longrunning_requests)
	// During the churn.
	Changes                 int64
	ChurnAPIServerCPU       float64 // percent of a core
	ChurnEtcdCPU            float64 // percent of a core
	ChurnAPIServerRSS       int64   // KiB, mean of 1 s samples
	ChurnAPIServerPeak      int64   // VmHWM KiB, reset at the churn's start
	ChurnLoad1Start, Load1E float64
	APIServerHeap           int64  // KiB at the churn's end: HeapMetric
	HeapMetric              string // go_gc_heap_live_bytes, else go_memstats_heap_inuse_bytes
}

type fanoutReport struct {
	cfg fanoutConfig
	benchrun.Machine
	Version string
	Kube    *kubeResult
	Phases  []fanoutPhase
}

func runFanout(args []string) int {
	fs := flag.NewFlagSet("apiview fanout", flag.ContinueOnError)
	var cfg fanoutConfig
	fs.IntVar(&cfg.services, "services", 2000, "ClusterIP Services, one TCP port and one EndpointSlice each")
	fs.IntVar(&cfg.endpoints, "endpoints", 10, "ready endpoints per EndpointSlice")
	fs.IntVar(&cfg.localEvery, "local-every", 10, "every Nth endpoint is on the views' node")
	fs.IntVar(&cfg.workers, "workers", 16, "parallel API clients creating the objects")
	fs.IntVar(&cfg.watchers, "watchers", 50, "watchers of each kind, each on its own connection")
	fs.Float64Var(&cfg.churnRate, "churn-rate", 10, "EndpointSlice changes a second during the churn")
	fs.DurationVar(&cfg.churn, "churn", 60*time.Second, "how long the churn of each phase lasts")
	fs.BoolVar(&cfg.smoke, "smoke", false, "200 services x 3 endpoints, 5 watchers, 10 s of churn")
	cfg.Register(fs, "process logs, builds")
	cfg.LockWaitFlag(fs)
	fs.StringVar(&cfg.etcdData, "etcd-data", "", "keep etcd's data in this directory, and reuse it when a run of the same shape loaded it")
	fs.BoolVar(&cfg.watchList, "watch-list", true, "kube-apiserver streams lists (sendInitialEvents); false starts it with --feature-gates=WatchList=false, so that lists are paged")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if cfg.smoke {
		cfg.services, cfg.endpoints, cfg.watchers, cfg.churn = 200, 3, 5, 10*time.Second
	}
	switch {
	case cfg.services < 1 || cfg.services > 60000:
		fmt.Fprintln(os.Stderr, "--services must be in [1, 60000]")
		return 2
	case cfg.endpoints < 1 || cfg.endpoints > 1000:
		fmt.Fprintln(os.Stderr, "--endpoints must be in [1, 1000]")
		return 2
	case cfg.watchers < 1 || cfg.watchers > 500 || cfg.churnRate <= 0 || cfg.churnRate > 1000 || cfg.churn < time.Second:
		fmt.Fprintln(os.Stderr, "--watchers must be in [1, 500], --churn-rate in (0, 1000], --churn at least 1s")
		return 2
	case cfg.localEvery < 1 || cfg.workers < 1:
		fmt.Fprintln(os.Stderr, "--local-every and --workers must be at least 1")
		return 2
	}
	return benchrun.Main(benchrun.Program{Name: "apiview fanout", WhyRoot: "it creates a network namespace", Stopping: "stopping"}, cfg.Out, func(ctx context.Context) (string, error) {
		rep, err := fanout(ctx, cfg, append([]string{"go run ./bench/apiview fanout"}, args...))
		return rep.render(), err
	})
}

func fanout(ctx context.Context, cfg fanoutConfig, argv []string) (*fanoutReport, error) {
	ws, bins, err := setUp(ctx, &cfg.config)
	if err != nil {
		return nil, err
	}
	defer ws.Close()
	tmp := ws.Tmp
	rep := &fanoutReport{
		cfg:     cfg,
		Machine: benchrun.Describe(cfg.Repo, argv),
		Version: bins.Version,
	}
	benchrun.Logf("building fanrun")
	fanrun := filepath.Join(tmp, "fanrun")
	build := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", fanrun, "./bench/apiview/fanrun")
	build.Dir = cfg.Repo
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return rep, fmt.Errorf("go build fanrun: %w: %s", err, out)
	}
	k, err := startKube(ctx, cfg.config, bins, tmp)
	if k != nil {
		defer k.stop()
		rep.Kube = k.res
	}
	if err != nil {
		return rep, err
	}
	for _, kind := range []string{"none", "view", "informer"} {
		benchrun.Logf("phase %s", kind)
		ph, err := k.fanoutPhase(ctx, cfg, fanrun, kind)
		rep.Phases = append(rep.Phases, ph)
		if err != nil {
			return rep, fmt.Errorf("phase %s: %w", kind, err)
		}
		benchrun.Logf("  synced in %.1f s (apiserver %.1f CPU s), churn: apiserver %.1f%% of a core, RSS %.0f MiB", ph.SyncSeconds, ph.SyncAPIServerCPU, ph.ChurnAPIServerCPU, mib(ph.ChurnAPIServerRSS))
	}
	k.sample()
	return rep, nil
}

// fanoutPhase starts cfg.watchers watchers of kind (none: no watchers), waits until they have
// synced, then changes endpoints for cfg.churn, measuring the control plane throughout.
func (k *kube) fanoutPhase(ctx context.Context, cfg fanoutConfig, fanrun, kind string) (fanoutPhase, error) {
	ph := fanoutPhase{Kind: kind}
	apiserver, etcd := k.proc("kube-apiserver"), k.proc("etcd")
	if apiserver == nil || etcd == nil {
		return ph, errors.New("the control plane is not running")
	}
	if kind != "none" {
		ph.Watchers = cfg.watchers
		lists0, err := k.lists(ctx)
		if err != nil {
			return ph, err
		}
		resetHWM(apiserver.Pid())
		api0, etcd0 := cpuSeconds(apiserver.Pid()), cpuSeconds(etcd.Pid())
		cmd := exec.CommandContext(ctx, "ip", "netns", "exec", k.ns, fanrun,
			"--kubeconfig", k.kubeconfig, "--node-name", synthcluster.NodeName, "--kind", kind,
			"--count", strconv.Itoa(cfg.watchers), "--ports", strconv.Itoa(k.res.Services))
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		stderr, err := os.Create(filepath.Join(k.dir, "fanrun-"+kind+".log"))
		if err != nil {
			return ph, err
		}
		defer stderr.Close()
		cmd.Stderr = stderr
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			return ph, err
		}
		if err := cmd.Start(); err != nil {
			return ph, fmt.Errorf("starting fanrun: %w", err)
		}
		exited := make(chan struct{})
		go func() { _ = cmd.Wait(); close(exited) }()
		defer func() {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
			select {
			case <-exited:
			case <-time.After(10 * time.Second):
				_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
				<-exited
			}
			time.Sleep(5 * time.Second) // let the API server end the watches
		}()
		line, err := bufio.NewReader(stdout).ReadBytes('\n')
		if err != nil {
			return ph, fmt.Errorf("fanrun ended before its watchers synced: %w (log in %s)", err, stderr.Name())
		}
		var synced struct {
			SyncSeconds float64 `json:"sync_seconds"`
		}
		if err := json.Unmarshal(line, &synced); err != nil {
			return ph, fmt.Errorf("fanrun's output %q: %w", line, err)
		}
		ph.SyncSeconds = synced.SyncSeconds
		ph.SyncAPIServerCPU = cpuSeconds(apiserver.Pid()) - api0
		ph.SyncEtcdCPU = cpuSeconds(etcd.Pid()) - etcd0
		ph.SyncAPIServerPeak = apiserver.Memory().HWMKiB
		lists1, err := k.lists(ctx)
		if err != nil {
			return ph, err
		}
		ph.Lists = lists1 - lists0
		time.Sleep(5 * time.Second) // the list's garbage is the sync's, not the churn's
	}
	if kind == "none" {
		time.Sleep(10 * time.Second) // the load's, or the previous phase's, aftermath
	}
	var err error
	if ph.Watches, err = k.watches(ctx); err != nil {
		return ph, err
	}
	resetHWM(apiserver.Pid())
	ph.ChurnLoad1Start = benchns.Load1()
	api0, etcd0, t0 := cpuSeconds(apiserver.Pid()), cpuSeconds(etcd.Pid()), time.Now()
	var (
		rssSum, rssN int64
		wg           sync.WaitGroup
	)
	churnCtx, stopChurn := context.WithTimeout(ctx, cfg.churn)
	defer stopChurn()
	wg.Go(func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-churnCtx.Done():
				return
			case <-t.C:
			}
			if m, err := nsproc.Status(apiserver.Pid()); err == nil {
				rssSum, rssN = rssSum+m.RSSKiB, rssN+1
			}
		}
	})
	ph.Changes, err = k.churn(churnCtx, cfg)
	wg.Wait()
	elapsed := time.Since(t0).Seconds()
	ph.ChurnAPIServerCPU = 100 * (cpuSeconds(apiserver.Pid()) - api0) / elapsed
	ph.ChurnEtcdCPU = 100 * (cpuSeconds(etcd.Pid()) - etcd0) / elapsed
	ph.Load1E = benchns.Load1()
	if rssN > 0 {
		ph.ChurnAPIServerRSS = rssSum / rssN
	}
	ph.ChurnAPIServerPeak = apiserver.Memory().HWMKiB
	if heap, metric, herr := k.apiserverHeap(ctx); herr == nil {
		ph.APIServerHeap, ph.HeapMetric = int64(heap/1024), metric
	} else if err == nil {
		err = herr
	}
	if ctx.Err() != nil {
		return ph, ctx.Err()
	}
	return ph, err
}

// churn changes EndpointSlices at cfg.churnRate a second until ctx ends, each change flipping
// the readiness of one endpoint of the next Service's slice, and returns how many it made.
func (k *kube) churn(ctx context.Context, cfg fanoutConfig) (int64, error) {
	t := time.NewTicker(time.Duration(float64(time.Second) / cfg.churnRate))
	defer t.Stop()
	var (
		done     atomic.Int64
		inFlight atomic.Int32
		firstErr atomic.Pointer[error]
		wg       sync.WaitGroup
	)
	defer wg.Wait()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			wg.Wait()
			if e := firstErr.Load(); e != nil {
				return done.Load(), *e
			}
			return done.Load(), nil
		case <-t.C:
		}
		if inFlight.Load() >= 8 {
			continue // the API server is behind: skip a tick rather than pile up
		}
		s := i % cfg.services
		ready := (i/cfg.services)%2 == 1 // the first pass makes endpoints not ready, the next ready again
		patch := fmt.Sprintf(`[{"op":"replace","path":"/endpoints/0/conditions/ready","value":%t}]`, ready)
		inFlight.Add(1)
		wg.Go(func() {
			defer inFlight.Add(-1)
			_, err := k.client.DiscoveryV1().EndpointSlices(synthcluster.Namespace(s)).Patch(context.WithoutCancel(ctx), synthcluster.Name(s)+"-bench", types.JSONPatchType, []byte(patch), metav1.PatchOptions{})
			if err != nil {
				firstErr.CompareAndSwap(nil, &err)
				return
			}
			done.Add(1)
		})
	}
}

// watches counts the WATCH requests kube-apiserver is serving on Services and EndpointSlices.
func (k *kube) watches(ctx context.Context) (int, error) {
	n, err := k.apiserverMetric(ctx, "apiserver_longrunning_requests", `verb="WATCH"`)
	return int(n), err
}

// lists counts the LIST requests kube-apiserver has served on Services and EndpointSlices
// (each page of a paged list is one; a streamed list is a WATCH).
func (k *kube) lists(ctx context.Context) (int, error) {
	n, err := k.apiserverMetric(ctx, "apiserver_request_total", `verb="LIST"`)
	return int(n), err
}

// apiserverHeap is kube-apiserver's live Go heap as of its last collection
// (go_gc_heap_live_bytes), else its heap in use (go_memstats_heap_inuse_bytes), in bytes, and
// which of the two it is.
func (k *kube) apiserverHeap(ctx context.Context) (float64, string, error) {
	body, err := k.client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return 0, "", fmt.Errorf("reading kube-apiserver's /metrics: %w", err)
	}
	found := map[string]float64{}
	for _, line := range strings.Split(string(body), "\n") {
		for _, name := range []string{"go_gc_heap_live_bytes", "go_memstats_heap_inuse_bytes"} {
			if v, ok := strings.CutPrefix(line, name+" "); ok {
				if f, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil {
					found[name] = f
				}
			}
		}
	}
	for _, name := range []string{"go_gc_heap_live_bytes", "go_memstats_heap_inuse_bytes"} {
		if v, ok := found[name]; ok {
			return v, name, nil
		}
	}
	return 0, "", errors.New("kube-apiserver's /metrics has neither go_gc_heap_live_bytes nor go_memstats_heap_inuse_bytes")
}

// apiserverMetric sums the samples of kube-apiserver's metric name that carry label and are
// about Services or EndpointSlices.
func (k *kube) apiserverMetric(ctx context.Context, name, label string) (float64, error) {
	body, err := k.client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return 0, fmt.Errorf("reading kube-apiserver's /metrics: %w", err)
	}
	var n float64
	for _, line := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(line, name+"{") || !strings.Contains(line, label) ||
			!(strings.Contains(line, `resource="services"`) || strings.Contains(line, `resource="endpointslices"`)) {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			return 0, fmt.Errorf("kube-apiserver metric line %q: %w", line, err)
		}
		n += v
	}
	return n, nil
}

// cpuSeconds is the user and system CPU time a process has used (/proc/<pid>/stat).
func cpuSeconds(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The fields after the command's closing parenthesis: state is the first, utime the 12th.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0
	}
	utime, _ := strconv.ParseFloat(f[11], 64)
	stime, _ := strconv.ParseFloat(f[12], 64)
	return (utime + stime) / 100 // USER_HZ is 100 on Linux
}

// resetHWM resets a process's VmHWM to its current VmRSS (clear_refs 5).
func resetHWM(pid int) {
	_ = os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0)
}
