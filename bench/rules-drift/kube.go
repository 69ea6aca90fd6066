//go:build linux

package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/proxyhealth/proxyhealth/bench/internal/benchns"
	"github.com/proxyhealth/proxyhealth/bench/internal/benchrun"
	"github.com/proxyhealth/proxyhealth/bench/internal/controlplane"
	"github.com/proxyhealth/proxyhealth/bench/internal/kubeproxyrun"
	"github.com/proxyhealth/proxyhealth/bench/internal/nsproc"
	"github.com/proxyhealth/proxyhealth/bench/internal/promtext"
	"github.com/proxyhealth/proxyhealth/bench/internal/synthcluster"
	"github.com/proxyhealth/proxyhealth/test/kubelab"
)

// exporterAddr is the exporter's address in the API part, on the loopback of a namespace of its
// own (beside bench/internal/controlplane's and kube-proxy's): free by construction.
const exporterAddr = "127.0.0.1:9869"

// kubeResult is the API part.
type kubeResult struct {
	Version                    string
	NS                         string
	Services, Slices           int
	Endpoints                  int
	Workers                    int
	ControlPlaneUp             time.Duration
	Load                       time.Duration
	LoadRetries                int64
	ExporterFresh              time.Duration // exporter start to proxyhealth_api_view_fresh 1
	ExporterInformersOnly      nsproc.Memory // at that moment, before kube-proxy wrote rules
	KubeProxyFirstSync         time.Duration // kube-proxy start to its first full sync
	KubeProxySyncSeconds       float64       // its own sync duration metric for that sync
	KubeProxySVCChains         int
	KubeProxy                  nsproc.Memory
	ExporterChecked            float64 // proxyhealth_rules_services_checked
	ExporterDrifted, Stale     float64
	Missing                    float64
	ExporterCheckSeconds       []float64     // proxyhealth_rules_check_duration_seconds of full checks
	Exporter                   nsproc.Memory // after full checks
	Etcd, APIServer            nsproc.Memory
	ExporterGoHeap             float64 // go_memstats_heap_inuse_bytes after full checks
	ExporterArgs, KubeProxyArg string
	KubeProxyIPTables          string
}

// runKube starts etcd and kube-apiserver in a namespace of its own, loads the services, and
// measures the exporter's and kube-proxy's resident memory against them.
func runKube(ctx context.Context, cfg config, bins kubelab.Binaries, tmp string) (res *kubeResult, err error) {
	res = &kubeResult{Version: bins.Version, Workers: cfg.workers}
	dir := filepath.Join(tmp, "kube")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return res, err
	}
	// etcd's data on tmpfs: the load is then bound by the apiserver, not by fsync.
	etcdDir, err := os.MkdirTemp("/dev/shm", "ph-bench-rd-etcd-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(etcdDir)

	benchrun.Logf("building proxyhealth")
	exporterBin := filepath.Join(tmp, "proxyhealth")
	build := exec.CommandContext(ctx, "go", "build", "-o", exporterBin, ".")
	build.Dir = cfg.Repo
	if out, err := build.CombinedOutput(); err != nil {
		return res, fmt.Errorf("go build: %w: %s", err, out)
	}

	res.NS = newNSName("api")
	ns := res.NS
	if err := benchns.Add(ctx, ns); err != nil {
		return res, err
	}
	var procs []*nsproc.Proc
	defer func() {
		for i := len(procs) - 1; i >= 0; i-- {
			procs[i].Stop()
		}
		if derr := benchns.Delete(nsPrefix, ns); derr != nil && err == nil {
			err = derr
		}
	}()
	if _, err := run(ctx, nil, "ip", "-n", ns, "addr", "add", synthcluster.NodeIP+"/32", "dev", "lo"); err != nil {
		return res, err
	}
	token := controlplane.RandomToken()
	kubeconfig, err := controlplane.WriteCredentials(dir, token, controlplane.APIServerAddr)
	if err != nil {
		return res, err
	}
	start := func(name string, args ...string) (*nsproc.Proc, error) {
		p, err := nsproc.Start(ns, dir, name, args...)
		if err == nil {
			procs = append(procs, p)
		}
		return p, err
	}

	benchrun.Logf("starting etcd and kube-apiserver %s in %s", bins.Version, ns)
	t0 := time.Now()
	cp, err := controlplane.Start(ctx, ns, bins, controlplane.Options{
		Dir: dir, EtcdDir: etcdDir, Token: token,
		Bind: "127.0.0.1", Advertise: synthcluster.NodeIP, ServiceCIDR: synthcluster.ServiceCIDR, Start: start,
	})
	if err != nil {
		return res, err
	}
	etcd, apiserver, client := cp.Etcd, cp.APIServer, cp.Client
	if err := synthcluster.CreateNode(ctx, client, true); err != nil {
		return res, err
	}
	res.ControlPlaneUp = time.Since(t0)

	benchrun.Logf("creating %d Services and their EndpointSlices (%d endpoints each) with %d workers", cfg.services, cfg.endpoints, cfg.workers)
	t0 = time.Now()
	ls, err := synthcluster.Load(ctx, client, cfg.services, cfg.endpoints, 0, cfg.workers)
	res.Services, res.Slices, res.Endpoints, res.LoadRetries = ls.Services, ls.Slices, ls.Endpoints, ls.Retries
	if err != nil {
		return res, err
	}
	res.Load = time.Since(t0)
	benchrun.Logf("loaded in %s", res.Load.Round(time.Millisecond))

	// The exporter first, alone: its informers hold the whole API view, and no rules exist.
	scrape := func() (string, error) { return nsGet(ns, "http://"+exporterAddr+"/metrics") }
	res.ExporterArgs = fmt.Sprintf("--kubeconfig=admin.kubeconfig --node-name=%s --web.listen-address=%s", synthcluster.NodeName, exporterAddr)
	t0 = time.Now()
	exporter, err := start("proxyhealth", exporterBin, "--kubeconfig="+kubeconfig, "--node-name="+synthcluster.NodeName, "--web.listen-address="+exporterAddr)
	if err != nil {
		return res, err
	}
	err = benchrun.WaitFor(ctx, 5*time.Minute, "proxyhealth_api_view_fresh 1", func() (bool, string, error) {
		if exporter.Exited() {
			return false, "", fmt.Errorf("proxyhealth exited:\n%s", exporter.Tail())
		}
		body, err := scrape()
		if err != nil {
			return false, err.Error(), nil
		}
		v, _ := promtext.Value(body, "proxyhealth_api_view_fresh")
		return v == 1, fmt.Sprintf("proxyhealth_api_view_fresh %v", v), nil
	})
	if err != nil {
		return res, err
	}
	res.ExporterFresh = time.Since(t0)
	time.Sleep(2 * time.Second)
	res.ExporterInformersOnly = exporter.Memory()
	benchrun.Logf("exporter's API view fresh after %s: VmRSS %.1f MiB", res.ExporterFresh.Round(time.Millisecond), mib(res.ExporterInformersOnly.RSSKiB))

	// kube-proxy writes the rules.
	kpArgs := kubeproxyrun.Args(kubeconfig, "iptables")
	res.KubeProxyArg = strings.Join(kpArgs[2:], " ")
	res.KubeProxyIPTables = cfg.kubeProxyIPTables
	shim, err := kubelab.IPTablesShim(dir, cfg.kubeProxyIPTables)
	if err != nil {
		return res, err
	}
	benchrun.Logf("starting kube-proxy (iptables %s backend)", cfg.kubeProxyIPTables)
	t0 = time.Now()
	kp, err := start("kube-proxy", append([]string{"env", "PATH=" + shim + ":" + os.Getenv("PATH"), bins.Proxy}, kpArgs...)...)
	if err != nil {
		return res, err
	}
	err = benchrun.WaitFor(ctx, 15*time.Minute, "kube-proxy's first full sync", func() (bool, string, error) {
		if kp.Exited() {
			return false, "", fmt.Errorf("kube-proxy exited:\n%s", kp.Tail())
		}
		body, err := nsGet(ns, "http://"+kubeproxyrun.MetricsAddr+"/metrics")
		if err != nil {
			return false, err.Error(), nil
		}
		last, _ := promtext.Value(body, "kubeproxy_sync_proxy_rules_last_timestamp_seconds")
		if last <= 0 {
			return false, "no sync yet", nil
		}
		out, err := run(ctx, nil, "ip", "netns", "exec", ns, "iptables-"+cfg.kubeProxyIPTables+"-save", "-t", "nat")
		if err != nil {
			return false, err.Error(), nil
		}
		n := strings.Count(out, "\n:KUBE-SVC-")
		res.KubeProxySVCChains = n
		if sum, ok := promtext.Value(body, "kubeproxy_sync_proxy_rules_duration_seconds_sum"); ok {
			res.KubeProxySyncSeconds = sum
		}
		return n >= cfg.services, fmt.Sprintf("%d KUBE-SVC chains", n), nil
	})
	if err != nil {
		return res, err
	}
	res.KubeProxyFirstSync = time.Since(t0)
	benchrun.Logf("kube-proxy synced %d KUBE-SVC chains after %s", res.KubeProxySVCChains, res.KubeProxyFirstSync.Round(time.Millisecond))
	time.Sleep(2 * time.Second)
	res.KubeProxy = kp.Memory()

	// The exporter's full checks: two after the one that first saw every service.
	var seen []float64
	err = benchrun.WaitFor(ctx, 10*time.Minute, "three drift checks after every service was seen", func() (bool, string, error) {
		if exporter.Exited() {
			return false, "", fmt.Errorf("proxyhealth exited:\n%s", exporter.Tail())
		}
		body, err := scrape()
		if err != nil {
			return false, err.Error(), nil
		}
		checked, _ := promtext.Value(body, "proxyhealth_rules_services_checked")
		at, _ := promtext.Value(body, "proxyhealth_rules_last_check_timestamp_seconds")
		if checked < float64(cfg.services) {
			return false, fmt.Sprintf("checked %v", checked), nil
		}
		if len(seen) == 0 || seen[len(seen)-1] != at {
			seen = append(seen, at)
			d, _ := promtext.Value(body, "proxyhealth_rules_check_duration_seconds")
			res.ExporterCheckSeconds = append(res.ExporterCheckSeconds, d)
		}
		res.ExporterChecked = checked
		res.ExporterDrifted, _ = promtext.Value(body, "proxyhealth_rules_services_drifted")
		res.Stale, _ = promtext.Value(body, "proxyhealth_rules_endpoints_stale")
		res.Missing, _ = promtext.Value(body, "proxyhealth_rules_endpoints_missing")
		res.ExporterGoHeap, _ = promtext.Value(body, "go_memstats_heap_inuse_bytes")
		return len(seen) >= 3, fmt.Sprintf("%d full checks", len(seen)), nil
	})
	if err != nil {
		return res, err
	}
	res.Exporter = exporter.Memory()
	res.KubeProxy = res.KubeProxy.Max(kp.Memory())
	res.Etcd, res.APIServer = etcd.Memory(), apiserver.Memory()
	benchrun.Logf("exporter after %d checks: VmRSS %.1f MiB, VmHWM %.1f MiB; kube-proxy VmRSS %.1f MiB, VmHWM %.1f MiB",
		len(seen), mib(res.Exporter.RSSKiB), mib(res.Exporter.HWMKiB), mib(res.KubeProxy.RSSKiB), mib(res.KubeProxy.HWMKiB))
	return res, nil
}

func (k *kubeResult) render(b *strings.Builder) {
	if k.Load == 0 {
		fmt.Fprintf(b, "API part (etcd, kube-apiserver %s in namespace %s) failed before the load ended.\n", k.Version, k.NS)
		return
	}
	fmt.Fprintf(b, "API part: etcd and kube-apiserver %s in namespace %s (loopback, token auth), up in %.1f s. ", k.Version, k.NS, k.ControlPlaneUp.Seconds())
	fmt.Fprintf(b, "Loaded %d Services and %d EndpointSlices (%d endpoints) with %d parallel clients in %.1f s (%.0f objects/s, %d retried calls).\n\n",
		k.Services, k.Slices, k.Endpoints, k.Workers, k.Load.Seconds(), float64(k.Services+k.Slices)/k.Load.Seconds(), k.LoadRetries)
	b.WriteString("| process | moment | VmRSS MiB | VmHWM MiB | notes |\n|---|---|---:|---:|---|\n")
	fmt.Fprintf(b, "| proxyhealth | API view fresh, no rules yet (informers only) | %.1f | %.1f | fresh %.1f s after start |\n",
		mib(k.ExporterInformersOnly.RSSKiB), mib(k.ExporterInformersOnly.HWMKiB), k.ExporterFresh.Seconds())
	var checks []string
	for _, c := range k.ExporterCheckSeconds {
		checks = append(checks, fmt.Sprintf("%.2f", c))
	}
	fmt.Fprintf(b, "| proxyhealth | after %d drift checks of kube-proxy's rules | %.1f | %.1f | checked %.0f service ports, drifted %.0f (stale %.0f, missing %.0f); check durations %s s; Go heap in use %.1f MiB |\n",
		len(k.ExporterCheckSeconds), mib(k.Exporter.RSSKiB), mib(k.Exporter.HWMKiB), k.ExporterChecked, k.ExporterDrifted, k.Stale, k.Missing,
		strings.Join(checks, ", "), k.ExporterGoHeap/(1<<20))
	fmt.Fprintf(b, "| kube-proxy %s (iptables %s) | after its first full sync | %.1f | %.1f | synced %d KUBE-SVC chains %.1f s after start (its own sync duration %.1f s) |\n",
		k.Version, k.KubeProxyIPTables, mib(k.KubeProxy.RSSKiB), mib(k.KubeProxy.HWMKiB), k.KubeProxySVCChains, k.KubeProxyFirstSync.Seconds(), k.KubeProxySyncSeconds)
	fmt.Fprintf(b, "| kube-apiserver | end | %.1f | %.1f | |\n", mib(k.APIServer.RSSKiB), mib(k.APIServer.HWMKiB))
	fmt.Fprintf(b, "| etcd | end | %.1f | %.1f | |\n\n", mib(k.Etcd.RSSKiB), mib(k.Etcd.HWMKiB))
	fmt.Fprintf(b, "proxyhealth `%s` (defaults otherwise: every collector on, --rules.check-interval=10s); kube-proxy `%s`.\n", k.ExporterArgs, k.KubeProxyArg)
}
