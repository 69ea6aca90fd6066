//go:build linux

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/proxyhealth/proxyhealth/bench/internal/benchns"
	"github.com/proxyhealth/proxyhealth/bench/internal/benchrun"
	"github.com/proxyhealth/proxyhealth/bench/internal/cgroupmeter"
	"github.com/proxyhealth/proxyhealth/bench/internal/controlplane"
	"github.com/proxyhealth/proxyhealth/bench/internal/forkwatch"
	"github.com/proxyhealth/proxyhealth/bench/internal/kubeproxyrun"
	"github.com/proxyhealth/proxyhealth/bench/internal/nsproc"
	"github.com/proxyhealth/proxyhealth/bench/internal/promtext"
	"github.com/proxyhealth/proxyhealth/bench/internal/synthcluster"
	"github.com/proxyhealth/proxyhealth/internal/testsupport/netnsdial"
	"github.com/proxyhealth/proxyhealth/test/kubelab"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// The benchmark (README.md): the exporter's cost as a whole process
// tree next to a real kube-proxy on one "node" (a network namespace), both in cgroups of their
// own, against a control plane in another namespace joined by a veth pair:
//
//	control plane ns: etcd 127.0.0.1:2379, kube-apiserver 0.0.0.0:6443, veth 172.18.0.1/24
//	node ns:          veth 172.18.0.2/24 (the Node's InternalIP), kube-proxy (metrics
//	                  127.0.0.1:10249, healthz :10256), the exporter (127.0.0.1:9869), and the
//	                  fault proxy's listener 127.0.0.1:6444 -> 172.18.0.1:6443, served by this
//	                  program, which only kube-proxy's API connection goes through
const (
	ncCPAddr       = "172.18.0.1"
	ncAPIServer    = ncCPAddr + ":6443"
	ncFaultProxy   = "127.0.0.1:6444"
	ncVethCP       = "ph-nc-cp"
	ncVethNode     = "ph-nc-node"
	ncIdleScrape   = 15 * time.Second // a Prometheus-like scrape while idle
	ncLatencyPoll  = 250 * time.Millisecond
	ncMaxFreshAddr = 1<<23 - 1 // fresh endpoint addresses come from 10.128.0.0/9
)

// exporterGODEBUG is what the exporter's image (Dockerfile) sets: no allocation sampling from
// the process's start.
const exporterGODEBUG = "GODEBUG=memprofilerate=0"

// cgPrefix names the cgroup pairs of the two measured process trees (bench/internal/cgroupmeter):
// ph-bench-nc-<role>-<hex>.
const cgPrefix = "ph-bench-nc-"

// ncReport is one node-cost run.
type ncReport struct {
	cfg ncConfig
	benchrun.Machine
	KubeVersion                  string
	IPTablesVersion, NFTVersion  string
	Grace                        time.Duration
	GraceFromDefault             bool
	ExporterArgs                 []string
	ForkWatch                    string // "" when the proc connector works, else why not
	Modes                        []*ncMode
	ExporterBuild, ExporterFlags string
}

// ncMode is one mode's run.
type ncMode struct {
	Mode                string
	Services, Endpoints int
	Load                time.Duration
	LoadStats           synthcluster.Stats
	ControlPlaneUp      time.Duration
	KubeProxySynced     time.Duration // from the start of both
	KubeProxyChains     int
	ExporterChecked     time.Duration
	LastStartupRead     time.Duration // the exporter's last read of start-up, from the start of both
	Phases              []*ncPhase
	Latency             *ncLatency
	KubeProxyArgs       string
	Took                time.Duration
	Err                 string
	Notes               []string
}

// ncPhase is what one phase cost each process tree.
type ncPhase struct {
	Name                  string
	Wall                  time.Duration
	ExpCPU, KPCPU         float64 // % of one core
	ExpPeak, KPPeak       uint64  // bytes, memory.max_usage_in_bytes over the phase
	ExpChildren           int     // processes the exporter tree created (proc connector)
	ExpChildCmds          string
	ExpPolled             int // distinct child pids seen in the exporter's cgroup.procs
	KPChildren            int
	KPChildCmds           string
	KPSyncs               int     // kube-proxy's syncs in the phase (its sync duration histogram's count)
	KPSyncSeconds         float64 // and their total duration
	MaxDrifted            float64 // proxyhealth_rules_services_drifted, max over the phase's scrapes
	Scrapes, ScrapeErrors int
	Rate                  int // endpoint changes a second asked for; 0 for other phases
	Changes, ChangeErrors int // applied and failed changes
	ChangesMissed         int // ticks skipped because the writers were behind
	Load1                 [2]float64
	AllPhases             bool // the "start-up through churn" summary row
}

// ncLatency is the drift scenario.
type ncLatency struct {
	Service           string // namespace/name
	Grace             time.Duration
	KubeProxyCaughtUp bool
	ProxyBefore       string // fault proxy state when black-holed
	Seen              bool
	Latency           time.Duration // API change to the drift series in a scrape
	Waited            time.Duration
	Cleared           bool
	ClearedAfter      time.Duration // heal to proxyhealth_rules_services_drifted 0
	ChangedEndpoint   string        // the new address
}

func nodeCost(ctx context.Context, cfg ncConfig, argv []string) (*ncReport, error) {
	ws, err := benchrun.Prepare(ctx, nsPrefix, "ph-bench-nc-", &cfg.Flags)
	if err != nil {
		return nil, err
	}
	defer ws.Close()
	tmp := ws.Tmp
	if err := cgroupmeter.RemoveLeftovers(cgPrefix); err != nil {
		return nil, err
	}
	bins, err := kubelab.FindBinaries(cfg.Repo)
	if err != nil {
		return nil, err
	}
	rep := &ncReport{
		cfg:         cfg,
		Machine:     benchrun.Describe(cfg.Repo, argv),
		KubeVersion: bins.Version,
	}
	if out, err := run(ctx, nil, "iptables-legacy", "--version"); err == nil {
		rep.IPTablesVersion = strings.TrimSpace(out)
	}
	if out, err := run(ctx, nil, "nft", "--version"); err == nil {
		rep.NFTVersion = strings.TrimSpace(out)
	}

	benchrun.Logf("building proxyhealth from %s", cfg.Repo)
	exporterBin := filepath.Join(tmp, "proxyhealth")
	build := exec.CommandContext(ctx, "go", "build", "-o", exporterBin, ".")
	build.Dir = cfg.Repo
	if out, err := build.CombinedOutput(); err != nil {
		return rep, fmt.Errorf("go build: %w: %s", err, out)
	}
	rep.ExporterBuild = "go build -o proxyhealth . (at " + rep.Commit + ")"
	help, _ := exec.CommandContext(ctx, exporterBin, "--help").CombinedOutput()
	rep.ExporterFlags = string(help)
	rep.Grace = cfg.grace
	if rep.Grace == 0 {
		m := regexp.MustCompile(`--rules\.grace-period=(\S+)`).FindSubmatch(help)
		if m == nil {
			return rep, errors.New("the exporter's --help shows no --rules.grace-period default; pass --grace-period")
		}
		if rep.Grace, err = time.ParseDuration(string(m[1])); err != nil {
			return rep, fmt.Errorf("the exporter's --rules.grace-period default %q: %w", m[1], err)
		}
		rep.GraceFromDefault = true
	} else {
		if !strings.Contains(string(help), "--rules.grace-period=") {
			return rep, errors.New("the exporter has no --rules.grace-period flag")
		}
		rep.ExporterArgs = append(rep.ExporterArgs, "--rules.grace-period="+rep.Grace.String())
	}
	if cfg.smoke && strings.Contains(string(help), "--rules.check-interval=") {
		// At smoke size only: a drift check every 2 s keeps the latency scenario short.
		rep.ExporterArgs = append(rep.ExporterArgs, "--rules.check-interval=2s")
	}
	rep.ExporterArgs = append(rep.ExporterArgs, cfg.exporterArgs...)

	fw, err := forkwatch.New()
	if err != nil {
		rep.ForkWatch = err.Error()
		benchrun.Logf("no process events (%v): counting children by polling the cgroups only", err)
	} else {
		defer fw.Close()
	}

	var errs []error
	for _, mode := range cfg.modes {
		if ctx.Err() != nil {
			break
		}
		m := &ncMode{Mode: mode, Services: cfg.services, Endpoints: cfg.endpoints}
		if m.Services == 0 {
			m.Services = ncDefaultServices[mode]
		}
		rep.Modes = append(rep.Modes, m)
		t0 := time.Now()
		benchrun.Logf("== node-cost %s: %d services x %d endpoints", mode, m.Services, m.Endpoints)
		err := runNodeCostMode(ctx, cfg, rep, m, bins, exporterBin, tmp, fw)
		m.Took = time.Since(t0)
		if err != nil {
			m.Err = err.Error()
			benchrun.Logf("%s failed after %s: %v", mode, m.Took.Round(time.Second), err)
			errs = append(errs, fmt.Errorf("%s: %w", mode, err))
			continue
		}
		benchrun.Logf("%s done in %s", mode, m.Took.Round(time.Second))
	}
	if err := ctx.Err(); err != nil {
		errs = append(errs, err)
	}
	return rep, errors.Join(errs...)
}

// ncRun is one mode's running parts.
type ncRun struct {
	cfg            ncConfig
	m              *ncMode
	nodeNS, cpNS   string
	client         kubernetes.Interface
	expCG, kpCG    *cgroupmeter.Group
	exporter, kp   *nsproc.Proc
	fw             *forkwatch.Watcher
	fp             *kubelab.FaultProxy
	expHTTP        *http.Client // keeps its connection: a scrape is not a new flow each time
	kpHTTP         *http.Client
	nextChange     atomic.Int64
	polled         cgroupmeter.ChildPoll
	countRulesArgs []string
	countRulesSub  string
}

func runNodeCostMode(ctx context.Context, cfg ncConfig, rep *ncReport, m *ncMode, bins kubelab.Binaries, exporterBin, tmp string, fw *forkwatch.Watcher) (err error) {
	dir := filepath.Join(tmp, m.Mode)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	etcdDir, err := os.MkdirTemp("/dev/shm", "ph-bench-nc-etcd-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(etcdDir)

	r := &ncRun{cfg: cfg, m: m, fw: fw, cpNS: newNSName("nc-cp"), nodeNS: newNSName("nc-node")}
	var procs []*nsproc.Proc
	var cgroups []*cgroupmeter.Group
	// Cleanup, whatever happened: processes (kube-proxy and the exporter first), the fault
	// proxy, cgroups, namespaces. Each step is bounded.
	defer func() {
		for i := len(procs) - 1; i >= 0; i-- {
			procs[i].Stop()
		}
		if r.fp != nil {
			r.fp.Reset()
		}
		for _, cg := range cgroups {
			if cerr := cg.Remove(); cerr != nil && err == nil {
				err = cerr
			}
		}
		for _, ns := range []string{r.nodeNS, r.cpNS} {
			if derr := benchns.Delete(nsPrefix, ns); derr != nil && err == nil {
				err = derr
			}
		}
	}()
	for _, ns := range []string{r.cpNS, r.nodeNS} {
		if err := benchns.Add(ctx, ns); err != nil {
			return err
		}
	}
	// The veth pair is made inside the control plane's namespace and its peer moved straight
	// into the node's: the root namespace never holds either end.
	for _, c := range [][]string{
		{"ip", "-n", r.cpNS, "link", "add", ncVethCP, "type", "veth", "peer", "name", ncVethNode, "netns", r.nodeNS},
		{"ip", "-n", r.cpNS, "addr", "add", ncCPAddr + "/24", "dev", ncVethCP},
		{"ip", "-n", r.nodeNS, "addr", "add", synthcluster.NodeIP + "/24", "dev", ncVethNode},
		{"ip", "-n", r.cpNS, "link", "set", ncVethCP, "up"},
		{"ip", "-n", r.nodeNS, "link", "set", ncVethNode, "up"},
	} {
		if _, err := run(ctx, nil, c[0], c[1:]...); err != nil {
			return err
		}
	}
	token := controlplane.RandomToken()
	// The token file and service-account keys the apiserver reads (its admin kubeconfig is
	// not used: the exporter and kube-proxy get their own below).
	if _, err := controlplane.WriteCredentials(dir, token, controlplane.APIServerAddr); err != nil {
		return err
	}
	exporterKubeconfig := filepath.Join(dir, "exporter.kubeconfig")
	kpKubeconfig := filepath.Join(dir, "kube-proxy.kubeconfig")
	if err := os.WriteFile(exporterKubeconfig, []byte(kubelab.KubeconfigYAML(ncAPIServer, "admin", token)), 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(kpKubeconfig, []byte(kubelab.KubeconfigYAML(ncFaultProxy, "admin", token)), 0o600); err != nil {
		return err
	}

	benchrun.Logf("starting etcd and kube-apiserver %s in %s", bins.Version, r.cpNS)
	t0 := time.Now()
	cp, err := controlplane.Start(ctx, r.cpNS, bins, controlplane.Options{
		Dir: dir, EtcdDir: etcdDir, Token: token,
		Bind: "0.0.0.0", Advertise: ncCPAddr, ServiceCIDR: synthcluster.ServiceCIDR,
		Start: func(name string, args ...string) (*nsproc.Proc, error) {
			p, err := nsproc.Start(r.cpNS, dir, name, args...)
			if err == nil {
				procs = append(procs, p)
			}
			return p, err
		},
	})
	if err != nil {
		return err
	}
	r.client = cp.Client
	if err := synthcluster.CreateNode(ctx, r.client, true); err != nil {
		return err
	}
	m.ControlPlaneUp = time.Since(t0)

	benchrun.Logf("creating %d Services and their EndpointSlices (%d endpoints each) with %d workers", m.Services, m.Endpoints, cfg.workers)
	t0 = time.Now()
	m.LoadStats, err = synthcluster.Load(ctx, r.client, m.Services, m.Endpoints, 0, cfg.workers)
	if err != nil {
		return err
	}
	m.Load = time.Since(t0)
	benchrun.Logf("loaded in %s", m.Load.Round(time.Millisecond))

	// The fault proxy: only kube-proxy's API connection goes through it.
	ln, err := netnsdial.Listen(r.nodeNS, "tcp4", ncFaultProxy)
	if err != nil {
		return err
	}
	defer ln.Close()
	r.fp = kubelab.NewFaultProxy(ncAPIServer, netnsdial.Dialer(r.nodeNS))
	r.fp.Logf = func(format string, args ...any) { benchrun.Logf("fault proxy: "+format, args...) }
	go func() { _ = r.fp.Serve(ln) }()

	r.expHTTP = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: netnsdial.Dialer(r.nodeNS), MaxIdleConnsPerHost: 1}}
	r.kpHTTP = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: netnsdial.Dialer(r.nodeNS), MaxIdleConnsPerHost: 1}}
	defer r.expHTTP.CloseIdleConnections()
	defer r.kpHTTP.CloseIdleConnections()

	if r.expCG, err = cgroupmeter.New(cgPrefix, "exporter"); err != nil {
		return err
	}
	cgroups = append(cgroups, r.expCG)
	if r.kpCG, err = cgroupmeter.New(cgPrefix, "kube-proxy"); err != nil {
		return err
	}
	cgroups = append(cgroups, r.kpCG)

	// The node's own xtables lock: /run/xtables.lock is one file for the whole machine, every
	// network namespace included, and other work on it (another lab restoring a large legacy
	// table) would hold kube-proxy's iptables calls past their 5 s wait. On a real node the
	// lock is shared only by that node's processes; here the same: kube-proxy and the exporter.
	lockEnv := "XTABLES_LOCKFILE=" + filepath.Join(dir, "xtables.lock")
	// kube-proxy's command line, per mode.
	kpMode, env := "iptables", []string{lockEnv}
	switch m.Mode {
	case "iptables-legacy", "iptables-nft":
		backend := strings.TrimPrefix(m.Mode, "iptables-")
		shim, err := kubelab.IPTablesShim(dir, backend)
		if err != nil {
			return err
		}
		env = append(env, "PATH="+shim+":"+os.Getenv("PATH"))
		r.countRulesArgs, r.countRulesSub = []string{"iptables-" + backend + "-save", "-t", "nat"}, "\n:KUBE-SVC-"
	case "nftables":
		kpMode = "nftables"
		r.countRulesArgs, r.countRulesSub = []string{"nft", "list", "table", "ip", "kube-proxy"}, "chain service-"
	}
	kpArgs := kubeproxyrun.Args(kpKubeconfig, kpMode)
	m.KubeProxyArgs = "XTABLES_LOCKFILE=<the node's> " + strings.Join(kpArgs[2:], " ")
	if kpMode == "iptables" {
		m.KubeProxyArgs = "PATH=<links to iptables-" + strings.TrimPrefix(m.Mode, "iptables-") + "-*>:$PATH " + m.KubeProxyArgs
	}
	kpLog := filepath.Join(dir, "kube-proxy.log")
	expArgs := append([]string{
		"--kubeconfig=" + exporterKubeconfig,
		"--node-name=" + synthcluster.NodeName,
		"--web.listen-address=" + exporterAddr,
		"--kubeproxy.log-path=" + kpLog,
	}, rep.ExporterArgs...)

	startIn := func(cg *cgroupmeter.Group, name string, argv ...string) (*nsproc.Proc, error) {
		p, err := nsproc.Start("", dir, name, cg.Wrap(r.nodeNS, argv...)...)
		if err == nil {
			procs = append(procs, p)
			if r.fw != nil {
				r.fw.Watch(name, p.Pid())
			}
		}
		return p, err
	}

	// Phase 1: start-up, both at once, until kube-proxy's first full sync is in the rules and
	// the exporter has checked every service against them.
	stopPoll := r.polled.Start(map[string]*cgroupmeter.Group{"proxyhealth": r.expCG, "kube-proxy": r.kpCG})
	defer stopPoll()
	meter := r.newMeter()
	meter.begin()
	benchrun.Logf("starting proxyhealth and kube-proxy (%s) in %s", m.Mode, r.nodeNS)
	tStart := time.Now()
	if r.exporter, err = startIn(r.expCG, "proxyhealth", append([]string{"env", lockEnv, exporterGODEBUG, exporterBin}, expArgs...)...); err != nil {
		return err
	}
	r.polled.SetRoot("proxyhealth", r.exporter.Pid())
	if r.kp, err = startIn(r.kpCG, "kube-proxy", append(append([]string{"env"}, env...), append([]string{bins.Proxy}, kpArgs...)...)...); err != nil {
		return err
	}
	r.polled.SetRoot("kube-proxy", r.kp.Pid())
	startup := &ncPhase{Name: "start-up"}
	if err := r.startup(ctx, tStart, kpLog, startup); err != nil {
		meter.end(startup)
		m.Phases = append(m.Phases, startup)
		return err
	}
	meter.end(startup)
	m.Phases = append(m.Phases, startup)
	benchrun.Logf("start-up: kube-proxy synced %d service chains after %s, exporter checked after %s, its last read of start-up after %s",
		m.KubeProxyChains, m.KubeProxySynced.Round(time.Millisecond), m.ExporterChecked.Round(time.Millisecond), m.LastStartupRead.Round(time.Millisecond))

	// Phase 2: idle.
	idle := &ncPhase{Name: "idle"}
	benchrun.Logf("idle for %s", cfg.idle)
	meter.begin()
	err = r.watchDrift(ctx, ncIdleScrape, idle, func(ctx context.Context) error {
		return benchns.Sleep(ctx, cfg.idle)
	})
	meter.end(idle)
	m.Phases = append(m.Phases, idle)
	if err != nil {
		return err
	}
	r.logPhase(idle)

	// Phase 3: churn at each rate.
	for _, rate := range cfg.rates {
		ph := &ncPhase{Name: fmt.Sprintf("churn %d/s", rate), Rate: rate}
		benchrun.Logf("churn at %d endpoint changes a second for %s", rate, cfg.churn)
		meter.begin()
		err = r.watchDrift(ctx, r.cfg.churnScrape, ph, func(ctx context.Context) error {
			return r.churn(ctx, rate, cfg.churn, ph)
		})
		meter.end(ph)
		m.Phases = append(m.Phases, ph)
		if err != nil {
			return err
		}
		r.logPhase(ph)
	}
	all := &ncPhase{Name: "start-up through churn", AllPhases: true}
	for _, ph := range m.Phases {
		all.Wall += ph.Wall
		all.ExpPeak, all.KPPeak = max(all.ExpPeak, ph.ExpPeak), max(all.KPPeak, ph.KPPeak)
		all.ExpChildren += ph.ExpChildren
		all.ExpPolled += ph.ExpPolled
		all.KPChildren += ph.KPChildren
		all.MaxDrifted = max(all.MaxDrifted, ph.MaxDrifted)
		all.Scrapes += ph.Scrapes
		all.ScrapeErrors += ph.ScrapeErrors
	}
	m.Phases = append(m.Phases, all)

	// Phase 4: the drift scenario.
	lat := &ncPhase{Name: "drift scenario"}
	meter.begin()
	m.Latency, err = r.latency(ctx, rep.Grace, lat)
	meter.end(lat)
	m.Phases = append(m.Phases, lat)
	return err
}

func (r *ncRun) logPhase(ph *ncPhase) {
	benchrun.Logf("%s: proxyhealth %.1f%% of a core, peak %.0f MiB, %d children; kube-proxy %.1f%%, peak %.0f MiB; max drifted %.0f; %d changes",
		ph.Name, ph.ExpCPU, bytesMiB(ph.ExpPeak), ph.ExpChildren, ph.KPCPU, bytesMiB(ph.KPPeak), ph.MaxDrifted, ph.Changes)
}

func bytesMiB(b uint64) float64 { return float64(b) / (1 << 20) }

func (r *ncRun) get(c *http.Client, url string) (string, error) {
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return string(b), fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return string(b), err
}

func (r *ncRun) scrapeExporter() (string, error) {
	return r.get(r.expHTTP, "http://"+exporterAddr+"/metrics")
}

func (r *ncRun) kubeProxyMetrics() (string, error) {
	return r.get(r.kpHTTP, "http://"+kubeproxyrun.MetricsAddr+"/metrics")
}

func (r *ncRun) checkAlive() error {
	if r.exporter.Exited() {
		return fmt.Errorf("proxyhealth exited:\n%s", r.exporter.Tail())
	}
	if r.kp.Exited() {
		return fmt.Errorf("kube-proxy exited:\n%s", r.kp.Tail())
	}
	return nil
}

// startup waits for kube-proxy's first full sync (its sync timestamp set and a service chain
// for every Service in the rules), then for an exporter check after it that covered every
// Service.
func (r *ncRun) startup(ctx context.Context, t0 time.Time, kpLog string, ph *ncPhase) error {
	m := r.m
	var countedAt float64 // kube-proxy sync timestamp whose rules were counted last
	var syncedAt float64
	err := benchrun.WaitFor(ctx, r.cfg.kubeProxySyncTO, "kube-proxy's first full sync", func() (bool, string, error) {
		if err := r.checkAlive(); err != nil {
			return false, "", err
		}
		body, err := r.kubeProxyMetrics()
		if err != nil {
			return false, err.Error(), nil
		}
		last, _ := promtext.Value(body, "kubeproxy_sync_proxy_rules_last_timestamp_seconds")
		if last <= 0 {
			return false, "no sync yet", nil
		}
		if last == countedAt {
			return false, fmt.Sprintf("%d service chains at the last sync", m.KubeProxyChains), nil
		}
		out, err := run(ctx, nil, "ip", append([]string{"netns", "exec", r.nodeNS}, r.countRulesArgs...)...)
		if err != nil {
			return false, err.Error(), nil
		}
		countedAt = last
		m.KubeProxyChains = strings.Count(out, r.countRulesSub)
		if m.KubeProxyChains >= m.Services {
			syncedAt = last
			return true, "", nil
		}
		return false, fmt.Sprintf("%d service chains", m.KubeProxyChains), nil
	})
	if err != nil {
		return err
	}
	m.KubeProxySynced = time.Unix(0, int64(syncedAt*1e9)).Sub(t0)
	err = benchrun.WaitFor(ctx, 10*time.Minute, "an exporter check of every Service after kube-proxy's sync", func() (bool, string, error) {
		body, failed, err := r.scrapeAlive(ph)
		if body == "" {
			return false, failed, err
		}
		d, _ := promtext.Value(body, "proxyhealth_rules_services_drifted")
		ph.MaxDrifted = max(ph.MaxDrifted, d)
		checked, _ := promtext.Value(body, "proxyhealth_rules_services_checked")
		at, _ := promtext.Value(body, "proxyhealth_rules_last_check_timestamp_seconds")
		if checked >= float64(m.Services) && at >= syncedAt {
			return true, "", nil
		}
		return false, fmt.Sprintf("checked %v at %v, kube-proxy synced at %v", checked, at, syncedAt), nil
	})
	if err != nil {
		return err
	}
	m.ExporterChecked = time.Since(t0)

	// Start-up's aftermath: kube-proxy writes more after its first sync (its IPv6 rules,
	// a second sync), and the exporter reads them, a legacy read held back for
	// --netfilter.legacy-min-read-interval. Start-up lasts until its reads have been still
	// for longer than that, so that idle is the cost of nothing changing.
	var reads float64
	var still time.Time
	err = benchrun.WaitFor(ctx, 5*time.Minute, "the exporter's netfilter reads to be still", func() (bool, string, error) {
		body, failed, err := r.scrapeAlive(ph)
		if body == "" {
			return false, failed, err
		}
		n := promtext.Sum(body, "proxyhealth_netfilter_reads_total")
		if n != reads || still.IsZero() {
			reads, still = n, time.Now()
		}
		quiet := time.Since(still)
		return quiet >= r.cfg.settle, fmt.Sprintf("%v reads, still for %s", n, quiet.Round(time.Second)), nil
	})
	if err != nil {
		r.m.Notes = append(r.m.Notes, fmt.Sprintf("start-up ended with the exporter's reads not still for %s: %v", r.cfg.settle, err))
	}
	m.LastStartupRead = still.Sub(t0)
	return ctx.Err()
}

// scrapeAlive scrapes the exporter for a wait, counting the scrape in ph. It returns the
// exposition, or "" with why: a failed scrape is waited past, a dead process is an error.
func (r *ncRun) scrapeAlive(ph *ncPhase) (body, failed string, err error) {
	if err := r.checkAlive(); err != nil {
		return "", "", err
	}
	body, err = r.scrapeExporter()
	if err != nil {
		return "", err.Error(), nil
	}
	ph.Scrapes++
	return body, "", nil
}

// watchDrift runs f while scraping the exporter every interval for
// proxyhealth_rules_services_drifted, keeping the largest value in ph.
func (r *ncRun) watchDrift(ctx context.Context, interval time.Duration, ph *ncPhase, f func(context.Context) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var mu sync.Mutex
	done := make(chan struct{})
	scrape := func() {
		body, err := r.scrapeExporter()
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			ph.ScrapeErrors++
			return
		}
		ph.Scrapes++
		d, _ := promtext.Value(body, "proxyhealth_rules_services_drifted")
		ph.MaxDrifted = max(ph.MaxDrifted, d)
	}
	go func() {
		defer close(done)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			scrape()
		}
	}()
	err := f(ctx)
	cancel()
	<-done
	if err == nil {
		scrape() // one at the end, so that a phase shorter than interval has one too
		err = r.checkAlive()
	}
	return err
}

// freshEndpointIP is the k-th replacement endpoint address: after every address load gave out.
func (r *ncRun) freshEndpointIP(k int) string {
	n := 1 + r.m.Services*r.m.Endpoints + k
	n = 1 + (n-1)%ncMaxFreshAddr
	return fmt.Sprintf("10.%d.%d.%d", 128+n>>16, byte(n>>8), byte(n))
}

// change makes the next endpoint change: one endpoint address of one EndpointSlice replaced
// by a new one, rotating over the services (and, each round, over the endpoints).
func (r *ncRun) change(ctx context.Context) (svc int, newIP string, err error) {
	k := int(r.nextChange.Add(1) - 1)
	s := k % r.m.Services
	e := (k / r.m.Services) % r.m.Endpoints
	newIP = r.freshEndpointIP(k)
	patch := fmt.Sprintf(`[{"op":"replace","path":"/endpoints/%d/addresses/0","value":%q}]`, e, newIP)
	c, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err = r.client.DiscoveryV1().EndpointSlices(synthcluster.Namespace(s)).Patch(c, synthcluster.Name(s)+"-bench", types.JSONPatchType, []byte(patch), metav1.PatchOptions{})
	return s, newIP, err
}

// churn makes rate endpoint changes a second for d, from writers fed on a schedule: each wake
// hands out every change due by then (so a starved benchmark process catches up rather than
// losing ticks), and a change due while every writer is busy is counted as missed, not queued.
func (r *ncRun) churn(ctx context.Context, rate int, d time.Duration, ph *ncPhase) error {
	jobs := make(chan struct{})
	var wg sync.WaitGroup
	var applied, failed atomic.Int64
	writers := min(max(4, 2*rate), 32)
	for range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range jobs {
				if _, _, err := r.change(ctx); err != nil {
					if ctx.Err() == nil {
						failed.Add(1)
					}
				} else {
					applied.Add(1)
				}
			}
		}()
	}
	total := int(int64(rate) * int64(d) / int64(time.Second))
	start := time.Now()
	tick := time.NewTicker(time.Second / time.Duration(rate))
	issued := 0
	var err error
	for issued < total {
		select {
		case <-ctx.Done():
			err = ctx.Err()
		case <-tick.C:
		}
		if err != nil {
			break
		}
		due := min(total, int(int64(time.Since(start))*int64(rate)/int64(time.Second)))
		for ; issued < due; issued++ {
			select {
			case jobs <- struct{}{}:
			default:
				ph.ChangesMissed++
			}
		}
	}
	tick.Stop()
	close(jobs)
	wg.Wait()
	ph.Changes, ph.ChangeErrors = int(applied.Load()), int(failed.Load())
	if err == nil && ph.ChangeErrors > 0 && ph.Changes == 0 {
		err = fmt.Errorf("every endpoint change failed (%d)", ph.ChangeErrors)
	}
	return err
}

// latency is the drift scenario: kube-proxy's API connection black-holed, then one endpoint
// change in the API; the time until the exporter's per-service drift series for that service
// appears. Then the connection is healed and the drift must clear.
func (r *ncRun) latency(ctx context.Context, grace time.Duration, ph *ncPhase) (*ncLatency, error) {
	lat := &ncLatency{Grace: grace}
	// kube-proxy first applies everything queued, so that only the change below is drift.
	lat.KubeProxyCaughtUp = benchrun.WaitFor(ctx, 2*time.Minute, "kube-proxy to apply every queued change", func() (bool, string, error) {
		if err := r.checkAlive(); err != nil {
			return false, "", err
		}
		body, err := r.kubeProxyMetrics()
		if err != nil {
			return false, err.Error(), nil
		}
		last, _ := promtext.Value(body, "kubeproxy_sync_proxy_rules_last_timestamp_seconds")
		queued, _ := promtext.Value(body, "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds")
		return queued <= last, fmt.Sprintf("last sync %v, last queued %v", last, queued), nil
	}) == nil
	if err := ctx.Err(); err != nil {
		return lat, err
	}
	if !lat.KubeProxyCaughtUp {
		r.m.Notes = append(r.m.Notes, "kube-proxy still had queued changes when its connection was black-holed")
	}
	lat.ProxyBefore = r.fp.State()
	r.fp.Blackhole()
	benchrun.Logf("kube-proxy's API connection black-holed (%s)", lat.ProxyBefore)
	s, newIP, err := r.change(ctx)
	if err != nil {
		r.fp.Heal()
		return lat, fmt.Errorf("the drift scenario's endpoint change: %w", err)
	}
	changed := time.Now()
	ph.Changes = 1
	lat.Service = synthcluster.Namespace(s) + "/" + synthcluster.Name(s)
	lat.ChangedEndpoint = newIP
	benchrun.Logf("changed an endpoint of %s to %s; waiting for proxyhealth_service_drift_endpoints (grace %s)", lat.Service, newIP, grace)
	want := []string{`service_namespace="` + synthcluster.Namespace(s) + `"`, `service_name="` + synthcluster.Name(s) + `"`}
	limit := grace + r.cfg.latencyTimeout
	for time.Since(changed) < limit {
		if err := benchns.Sleep(ctx, ncLatencyPoll); err != nil {
			r.fp.Heal()
			return lat, err
		}
		if err := r.checkAlive(); err != nil {
			r.fp.Heal()
			return lat, err
		}
		body, err := r.scrapeExporter()
		if err != nil {
			ph.ScrapeErrors++
			continue
		}
		ph.Scrapes++
		d, _ := promtext.Value(body, "proxyhealth_rules_services_drifted")
		ph.MaxDrifted = max(ph.MaxDrifted, d)
		if promtext.HasSeries(body, "proxyhealth_service_drift_endpoints", want) {
			lat.Seen, lat.Latency = true, time.Since(changed)
			break
		}
	}
	lat.Waited = time.Since(changed)
	if lat.Seen {
		benchrun.Logf("drift series after %s (grace %s: %+.1f s)", lat.Latency.Round(time.Millisecond), grace, (lat.Latency - grace).Seconds())
	} else {
		benchrun.Logf("no drift series for %s within %s", lat.Service, limit)
	}

	r.fp.Heal()
	healed := time.Now()
	benchrun.Logf("healed (%s); waiting for the drift to clear", r.fp.State())
	for time.Since(healed) < r.cfg.healTimeout {
		if err := benchns.Sleep(ctx, time.Second); err != nil {
			return lat, err
		}
		body, err := r.scrapeExporter()
		if err != nil {
			ph.ScrapeErrors++
			continue
		}
		ph.Scrapes++
		d, ok := promtext.Value(body, "proxyhealth_rules_services_drifted")
		ph.MaxDrifted = max(ph.MaxDrifted, d)
		if ok && d == 0 && !promtext.HasSeries(body, "proxyhealth_service_drift_endpoints", want) {
			lat.Cleared, lat.ClearedAfter = true, time.Since(healed)
			break
		}
	}
	return lat, r.checkAlive()
}

// meter reads both cgroups at a phase's start and end.
type meter struct {
	r            *ncRun
	t0           time.Time
	exp0, kp0    uint64
	load0        float64
	syncs0       [2]float64 // kube-proxy's sync count and duration sum
	resetFailed  bool
	resetFailErr error
}

func (r *ncRun) newMeter() *meter { return &meter{r: r} }

func (mt *meter) begin() {
	r := mt.r
	for _, cg := range []*cgroupmeter.Group{r.expCG, r.kpCG} {
		if err := cg.ResetMax(); err != nil && !mt.resetFailed {
			mt.resetFailed = true
			r.m.Notes = append(r.m.Notes, fmt.Sprintf("memory.max_usage_in_bytes could not be reset (%v): each phase's peak is the peak so far", err))
		}
	}
	if r.fw != nil {
		r.fw.Take("proxyhealth")
		r.fw.Take("kube-proxy")
	}
	r.polled.Take("proxyhealth")
	r.polled.Take("kube-proxy")
	mt.syncs0 = r.kubeProxySyncs()
	mt.exp0, _ = r.expCG.CPUNanos()
	mt.kp0, _ = r.kpCG.CPUNanos()
	mt.load0 = benchns.Load1()
	mt.t0 = time.Now()
}

func (mt *meter) end(ph *ncPhase) {
	r := mt.r
	wall := time.Since(mt.t0)
	exp, _ := r.expCG.CPUNanos()
	kp, _ := r.kpCG.CPUNanos()
	ph.Wall = wall
	ph.ExpCPU = float64(exp-mt.exp0) / float64(wall.Nanoseconds()) * 100
	ph.KPCPU = float64(kp-mt.kp0) / float64(wall.Nanoseconds()) * 100
	ph.ExpPeak, _ = r.expCG.MaxUsage()
	ph.KPPeak, _ = r.kpCG.MaxUsage()
	if r.fw != nil {
		ph.ExpChildren, ph.ExpChildCmds = r.fw.Take("proxyhealth")
		ph.KPChildren, ph.KPChildCmds = r.fw.Take("kube-proxy")
	}
	ph.ExpPolled = r.polled.Take("proxyhealth")
	kpPolled := r.polled.Take("kube-proxy")
	if r.fw == nil {
		ph.ExpChildren, ph.KPChildren = ph.ExpPolled, kpPolled
	}
	ph.Load1 = [2]float64{mt.load0, benchns.Load1()}
	if syncs := r.kubeProxySyncs(); syncs[0] >= mt.syncs0[0] {
		ph.KPSyncs, ph.KPSyncSeconds = int(syncs[0]-mt.syncs0[0]), syncs[1]-mt.syncs0[1]
	}
}

// kubeProxySyncs reads kube-proxy's sync count and total sync time (zero before it answers).
func (r *ncRun) kubeProxySyncs() [2]float64 {
	if r.kp == nil {
		return [2]float64{}
	}
	body, err := r.kubeProxyMetrics()
	if err != nil {
		return [2]float64{}
	}
	n, _ := promtext.Value(body, "kubeproxy_sync_proxy_rules_duration_seconds_count")
	sum, _ := promtext.Value(body, "kubeproxy_sync_proxy_rules_duration_seconds_sum")
	return [2]float64{n, sum}
}
