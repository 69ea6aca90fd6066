//go:build linux

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/proxyhealth/proxyhealth/bench/apiview/internal/memrun"
	"github.com/proxyhealth/proxyhealth/bench/internal/benchns"
	"github.com/proxyhealth/proxyhealth/bench/internal/benchrun"
	"github.com/proxyhealth/proxyhealth/bench/internal/controlplane"
	"github.com/proxyhealth/proxyhealth/bench/internal/nsproc"
	"github.com/proxyhealth/proxyhealth/bench/internal/synthcluster"
	"github.com/proxyhealth/proxyhealth/test/kubelab"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// The control plane (bench/internal/controlplane) runs on the loopback of a namespace of its
// own: every port is free by construction, and nothing outlives the namespace.
const (
	nsPrefix = "ph-bench-av-"
)

// kubeResult describes the control plane the views ran against.
type kubeResult struct {
	NS                          string
	Services, Slices, Endpoints int
	LocalEndpoints              int
	ControlPlaneUp, Load        time.Duration
	Reused                      bool // loaded by an earlier run (--etcd-data)
	LoadRetries                 int64
	Etcd, APIServer             nsproc.Memory
}

type kube struct {
	ns, dir    string
	kubeconfig string
	res        *kubeResult
	procs      []*nsproc.Proc
	etcdDir    string
	keepEtcd   bool
	gogc       string
	godebug    string
	client     kubernetes.Interface // the admin's, for the load, the churn and /metrics
}

// startKube starts etcd and kube-apiserver in a new namespace, creates this node and the
// Services and EndpointSlices, and returns once they all exist.
func startKube(ctx context.Context, cfg config, bins kubelab.Binaries, tmp string) (k *kube, err error) {
	k = &kube{dir: filepath.Join(tmp, "kube"), res: &kubeResult{}, gogc: cfg.gogc, godebug: cfg.godebug}
	if err := os.MkdirAll(k.dir, 0o700); err != nil {
		return nil, err
	}
	// etcd's data on tmpfs: the load is then bound by the apiserver, not by fsync. With
	// --etcd-data it is kept, and a later run with the same shape skips the load.
	marker := fmt.Sprintf("%d services x %d endpoints, every %dth local\n", cfg.services, cfg.endpoints, cfg.localEvery)
	loaded := false
	if cfg.etcdData != "" {
		k.etcdDir, k.keepEtcd = cfg.etcdData, true
		b, err := os.ReadFile(filepath.Join(k.etcdDir, "loaded"))
		switch {
		case err == nil && string(b) == marker:
			loaded = true
		case err == nil:
			return nil, fmt.Errorf("--etcd-data %s holds %q, not %q: remove it or pass another", k.etcdDir, strings.TrimSpace(string(b)), strings.TrimSpace(marker))
		case !os.IsNotExist(err):
			return nil, err
		}
		if ents, _ := os.ReadDir(k.etcdDir); !loaded && len(ents) > 0 {
			return nil, fmt.Errorf("--etcd-data %s holds an unfinished load: remove it", k.etcdDir)
		}
		if err := os.MkdirAll(k.etcdDir, 0o700); err != nil {
			return nil, err
		}
	} else if k.etcdDir, err = os.MkdirTemp("/dev/shm", "ph-bench-av-etcd-"); err != nil {
		return nil, err
	}
	k.ns = benchns.NewName(nsPrefix)
	k.res.NS = k.ns
	if err := benchns.Add(ctx, k.ns); err != nil {
		k.removeEtcd()
		return nil, err
	}
	if _, err := run(ctx, "ip", "-n", k.ns, "addr", "add", synthcluster.NodeIP+"/32", "dev", "lo"); err != nil {
		return k, err
	}
	token := controlplane.RandomToken()
	if k.kubeconfig, err = controlplane.WriteCredentials(k.dir, token, controlplane.APIServerAddr); err != nil {
		return k, err
	}
	benchrun.Logf("starting etcd and kube-apiserver %s in %s", bins.Version, k.ns)
	t0 := time.Now()
	cp, err := controlplane.Start(ctx, k.ns, bins, controlplane.Options{
		Dir: k.dir, EtcdDir: k.etcdDir, Token: token,
		Bind: "127.0.0.1", Advertise: synthcluster.NodeIP, ServiceCIDR: synthcluster.ServiceCIDR, Start: k.start,
		APIServerArgs: apiserverArgs(cfg.watchList),
	})
	if err != nil {
		return k, err
	}
	k.client = cp.Client
	client := cp.Client
	if loaded {
		k.res.ControlPlaneUp = time.Since(t0)
		return k, k.count(ctx, client, cfg)
	}
	if err := synthcluster.CreateNode(ctx, client, false); err != nil {
		return k, err
	}
	k.res.ControlPlaneUp = time.Since(t0)

	benchrun.Logf("creating %d Services and their EndpointSlices (%d endpoints each, every %dth on this node) with %d workers", cfg.services, cfg.endpoints, cfg.localEvery, cfg.workers)
	t0 = time.Now()
	st, err := synthcluster.Load(ctx, client, cfg.services, cfg.endpoints, cfg.localEvery, cfg.workers)
	k.res.Services, k.res.Slices, k.res.Endpoints, k.res.LocalEndpoints, k.res.LoadRetries = st.Services, st.Slices, st.Endpoints, st.LocalEndpoints, st.Retries
	if err != nil {
		return k, err
	}
	k.res.Load = time.Since(t0)
	benchrun.Logf("loaded in %s", k.res.Load.Round(time.Millisecond))
	if k.keepEtcd {
		return k, os.WriteFile(filepath.Join(k.etcdDir, "loaded"), []byte(marker), 0o600)
	}
	return k, nil
}

// count fills in the figures of a load done by an earlier run (--etcd-data).
func (k *kube) count(ctx context.Context, client kubernetes.Interface, cfg config) error {
	benchrun.Logf("reusing the Services and EndpointSlices in %s", k.etcdDir)
	sls, err := client.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("counting the EndpointSlices: %w", err)
	}
	svcs, err := client.CoreV1().Services("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("counting the Services: %w", err)
	}
	k.res.Reused = true
	for _, s := range svcs.Items {
		if s.Namespace != "default" {
			k.res.Services++
		}
	}
	for _, s := range sls.Items {
		if s.Labels[discoveryv1.LabelManagedBy] != synthcluster.ManagedBy {
			continue
		}
		k.res.Slices++
		k.res.Endpoints += len(s.Endpoints)
		for _, e := range s.Endpoints {
			if e.NodeName != nil && *e.NodeName == synthcluster.NodeName {
				k.res.LocalEndpoints++
			}
		}
	}
	if k.res.Services != cfg.services || k.res.Slices != cfg.services {
		return fmt.Errorf("--etcd-data %s holds %d Services and %d EndpointSlices, want %d of each", k.etcdDir, k.res.Services, k.res.Slices, cfg.services)
	}
	return nil
}

// apiserverArgs are kube-apiserver's flags beyond the control plane's own: without
// watchList, its WatchList feature is off, so that a request for a streamed list is refused
// and clients list instead (an API server on an etcd too old for consistent reads from its
// watch cache refuses them alike).
func apiserverArgs(watchList bool) []string {
	if watchList {
		return nil
	}
	return []string{"--feature-gates=WatchList=false"}
}

func (k *kube) removeEtcd() {
	if !k.keepEtcd {
		os.RemoveAll(k.etcdDir)
	}
}

func (k *kube) start(name string, args ...string) (*nsproc.Proc, error) {
	p, err := nsproc.Start(k.ns, k.dir, name, args...)
	if err == nil {
		k.procs = append(k.procs, p)
	}
	return p, err
}

// proc returns the control-plane process called name.
func (k *kube) proc(name string) *nsproc.Proc {
	for _, p := range k.procs {
		if p.Name == name {
			return p
		}
	}
	return nil
}

// sample records the control plane's memory, for scale.
func (k *kube) sample() {
	for _, p := range k.procs {
		switch p.Name {
		case "etcd":
			k.res.Etcd = p.Memory()
		case "kube-apiserver":
			k.res.APIServer = p.Memory()
		}
	}
}

func (k *kube) stop() {
	for i := len(k.procs) - 1; i >= 0; i-- {
		k.procs[i].Stop()
	}
	if k.ns != "" {
		if err := benchns.Delete(nsPrefix, k.ns); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}
	k.removeEtcd()
}

// viewResult is a run's figures: viewrun's or informerrun's output (memrun.Result), and what
// the control plane spent meanwhile.
type viewResult struct {
	memrun.Result
	// From the run's start until its process ended (its sync and settle time): the CPU
	// seconds kube-apiserver and etcd used, and the LIST requests kube-apiserver served on
	// Services and EndpointSlices (each page one; a streamed list is a WATCH).
	APIServerCPU, EtcdCPU float64
	Lists                 int
}

// runView runs one viewrun binary in the namespace until its view holds every port and
// endpoint. The peak is viewrun's own VmHWM, read by viewrun itself: exec starts a fresh
// memory map, whereas a child's rusage maxrss would start at the peak of this process, which
// forked it (the kernel carries the old map's high-water mark into maxrss across exec).
func (k *kube) runView(ctx context.Context, bin, cpuProfile string) (viewResult, error) {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Minute)
	defer cancel()
	var r viewResult
	args := []string{"netns", "exec", k.ns, bin,
		"--kubeconfig", k.kubeconfig, "--node-name", synthcluster.NodeName,
		"--ports", strconv.Itoa(k.res.Services), "--endpoints", strconv.Itoa(k.res.Endpoints)}
	if cpuProfile != "" {
		args = append(args, "--cpuprofile", cpuProfile)
	}
	cmd := exec.CommandContext(ctx, "ip", args...)
	cmd.Env = os.Environ()
	if k.gogc != "" {
		cmd.Env = append(cmd.Env, "GOGC="+k.gogc)
	}
	if k.godebug != "" {
		cmd.Env = append(cmd.Env, "GODEBUG="+k.godebug)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	lists0, err := k.lists(ctx)
	if err != nil {
		return r, err
	}
	apiserver, etcd := k.proc("kube-apiserver").Pid(), k.proc("etcd").Pid()
	api0, etcd0 := cpuSeconds(apiserver), cpuSeconds(etcd)
	if err := cmd.Run(); err != nil {
		return r, fmt.Errorf("%s: %w: %s", filepath.Base(bin), err, benchrun.Truncate(errb.String(), 3000))
	}
	r.APIServerCPU, r.EtcdCPU = cpuSeconds(apiserver)-api0, cpuSeconds(etcd)-etcd0
	lists1, err := k.lists(ctx)
	if err != nil {
		return r, err
	}
	r.Lists = lists1 - lists0
	if err := json.Unmarshal(out.Bytes(), &r.Result); err != nil {
		return r, fmt.Errorf("%s's output %q: %w", filepath.Base(bin), benchrun.Truncate(out.String(), 500), err)
	}
	return r, nil
}

// run runs a command with a deadline; its combined output is in the error.
func run(ctx context.Context, name string, args ...string) (string, error) {
	return nsproc.Output(ctx, 2*time.Minute, nil, name, args...)
}
