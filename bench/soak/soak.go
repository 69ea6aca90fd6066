//go:build linux

package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/proxyhealth/proxyhealth/bench/internal/benchns"
	"github.com/proxyhealth/proxyhealth/bench/internal/benchrun"
	"github.com/proxyhealth/proxyhealth/bench/internal/nsproc"
	"github.com/proxyhealth/proxyhealth/internal/testsupport/netnsdial"
	"github.com/proxyhealth/proxyhealth/test/kubelab"
)

// Slack above the baseline that still counts as clean: a scrape in flight holds a goroutine or
// two and a socket, the API view's informers restart their watches.
const (
	goroutineSlack = 10
	fdSlack        = 5
)

// logPoll is the exporter's --kubeproxy.log-poll-interval here.
const logPoll = 500 * time.Millisecond

// sample is one look at the exporter.
type sample struct {
	at               time.Time
	rssKiB, hwmKiB   int64
	fds, threads     int
	children         int
	goroutines       float64
	scrape           time.Duration
	scrapeErr        error
	values           map[string]float64 // the series the clean check reads
	linesLo, linesHi uint64             // log lines written before and after the scrape
	failsLo, failsHi uint64
	exporterGone     bool
}

// faultRun is one injected fault and how the exporter came back.
type faultRun struct {
	kind       string
	start, end time.Time // the fault itself
	clean      time.Time // zero: not clean within --settle
	reason     string    // why not clean, when it was not
	injectErr  error
	unseen     string // what the exporter did not report during the fault
	peak       sample // maxima over the fault and the recovery
}

func (f *faultRun) recovery() time.Duration { return f.clean.Sub(f.end) }

// soaker is one run.
type soaker struct {
	cfg  config
	ns   string
	dir  string
	self string // this program, for the storm subcommand

	exporter *nsproc.Proc
	kp       *fakeKubeProxy
	log      *kubeProxyLog
	cp       *controlPlane
	client   *http.Client
	rng      *rand.Rand

	mu       sync.Mutex
	samples  []sample
	baseline sample
}

type fault struct {
	kind string
	// inject starts the fault and returns what ends it (nil for an instant fault).
	inject func(ctx context.Context) (heal func(), err error)
	// seen, when set, tells from a look at the fault's end whether the exporter reports the
	// fault ("" when it does, else what is missing).
	seen func(sample) string
}

func soak(ctx context.Context, cfg config, smoke bool, argv []string) (rep *report, err error) {
	unlock, err := benchns.LockFile(benchns.SoakLock)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := benchns.RemoveLeftovers(nsPrefix); err != nil {
		return nil, err
	}
	repo := cfg.Repo
	if repo == "" {
		if repo, err = benchrun.FindRepo(); err != nil {
			return nil, err
		}
	}
	tmp, err := os.MkdirTemp("", "ph-soak-")
	if err != nil {
		return nil, err
	}
	if cfg.KeepTmp {
		benchrun.Logf("temporary directory %s kept", tmp)
	} else {
		defer os.RemoveAll(tmp)
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	s := &soaker{cfg: cfg, ns: benchns.NewName(nsPrefix), dir: tmp, self: self, rng: rand.New(rand.NewPCG(uint64(cfg.seed), 0))}
	rep = &report{Machine: benchrun.Describe(repo, argv), cfg: cfg, smoke: smoke}

	bin := cfg.exporter
	if bin == "" {
		bin = filepath.Join(tmp, "proxyhealth")
		benchrun.Logf("building the exporter")
		cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", bin, ".")
		cmd.Dir, cmd.Env = repo, append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("building the exporter: %w\n%s", err, out)
		}
	}

	if err := setupNamespace(ctx, s.ns, cfg.services); err != nil {
		return nil, err
	}
	defer func() {
		s.stop()
		if derr := benchns.Delete(nsPrefix, s.ns); derr != nil && err == nil {
			err = derr
		}
	}()

	if cfg.kube != "off" {
		bins, kerr := kubelab.FindBinaries(repo)
		switch {
		case kerr != nil && cfg.kube == "on":
			return nil, kerr
		case kerr != nil:
			rep.kubeSkipped = kerr.Error()
		default:
			benchrun.Logf("starting etcd and kube-apiserver")
			if s.cp, err = startControlPlane(ctx, s.ns, tmp, bins); err != nil {
				return nil, err
			}
			rep.kubeVersion = bins.Version
		}
	} else {
		rep.kubeSkipped = "--kube=off"
	}

	metrics, err := os.ReadFile(filepath.Join(repo, "test", "e2e", "testdata", "kube-proxy-v1.36.3", "kube-proxy-metrics.txt"))
	if err != nil {
		return nil, err
	}
	s.kp = newFakeKubeProxy(s.ns, metrics)
	if err := s.kp.up(); err != nil {
		return nil, err
	}
	// The log exists, empty, before the exporter starts: it is followed from its end, which is
	// then its start, so every line written is counted.
	s.log = &kubeProxyLog{path: filepath.Join(tmp, "kube-proxy.log")}
	if err := os.WriteFile(s.log.path, nil, 0o644); err != nil {
		return nil, err
	}

	args := []string{bin, "--web.listen-address=" + exporterAddr, "--log.level=info",
		"--kubeproxy.log-path=" + s.log.path, "--kubeproxy.log-poll-interval=" + logPoll.String(), "--kubeproxy.poll-interval=2s", "--node-name=" + soakNodeName}
	if s.cp != nil {
		args = append(args, "--kubeconfig="+s.cp.kubeconfig, "--api.probe-interval=3s", "--api.fresh-within=10s")
	} else {
		// Without an API the rules collector can only fail; the others need none.
		args = append(args, "--no-collector.rules")
	}
	rep.exporterArgs = strings.Join(args[1:], " ")
	if s.exporter, err = nsproc.Start(s.ns, tmp, "proxyhealth", args...); err != nil {
		return nil, err
	}
	s.client = netnsdial.HTTPClient(s.ns, 10*time.Second)

	logCtx, stopLog := context.WithCancel(ctx)
	defer stopLog()
	go s.log.run(logCtx, 100*time.Millisecond)
	sampleCtx, stopSampling := context.WithCancel(ctx)
	defer stopSampling()
	go s.sampleEvery(sampleCtx, cfg.sampleEvery)

	// The baseline: clean once, after a warm-up in which every background check ran.
	time.Sleep(10 * time.Second)
	startedAt := time.Now()
	if _, why := s.waitClean(ctx, nil, cfg.settle); why != "" {
		return rep, fmt.Errorf("the exporter never came up clean: %s\n%s", why, s.exporter.Tail())
	}
	s.mu.Lock()
	s.baseline = s.samples[len(s.samples)-1]
	s.samples = s.samples[len(s.samples)-1:] // the warm-up is no part of the record
	s.mu.Unlock()
	rep.baseline = s.baseline
	benchrun.Logf("baseline: RSS %d KiB, %g goroutines, %d fds", s.baseline.rssKiB, s.baseline.goroutines, s.baseline.fds)

	faults := s.faults()
	order := func(i int) fault { return faults[s.rng.IntN(len(faults))] }
	if smoke {
		order = func(i int) fault { return faults[i] }
	}
	t0 := time.Now()
	for i := 0; ; i++ {
		if smoke && i == len(faults) || !smoke && time.Since(t0) >= cfg.duration || ctx.Err() != nil {
			break
		}
		gap := cfg.faultEvery/2 + time.Duration(s.rng.Int64N(int64(cfg.faultEvery)+1))
		if err := benchns.Sleep(ctx, gap); err != nil {
			break
		}
		f := order(i)
		fr := s.inject(ctx, f)
		rep.faults = append(rep.faults, fr)
		if fr.reason != "" {
			benchrun.Logf("%s: NOT clean after %s: %s", fr.kind, cfg.settle, fr.reason)
		} else {
			benchrun.Logf("%s: clean %.1fs after the fault ended (peak RSS %d KiB, %g goroutines, %d fds)",
				fr.kind, fr.recovery().Seconds(), fr.peak.rssKiB, fr.peak.goroutines, fr.peak.fds)
		}
		if s.exporter.Exited() {
			return rep, fmt.Errorf("the exporter exited:\n%s", s.exporter.Tail())
		}
	}
	rep.elapsed = time.Since(startedAt)
	stopSampling()
	time.Sleep(100 * time.Millisecond)
	s.mu.Lock()
	rep.samples = slices.Clone(s.samples)
	s.mu.Unlock()
	rep.final = s.look()
	rep.exporterLog = s.exporter.Tail()
	return rep, ctx.Err()
}

func (s *soaker) stop() {
	if s.kp != nil {
		s.kp.setHang(false)
		s.kp.down()
	}
	if s.exporter != nil {
		s.exporter.Stop()
	}
	s.cp.stop()
}

// faults are the kinds of fault the soak injects; the API black hole only with an apiserver.
func (s *soaker) faults() []fault {
	kubeProxyDown := func(sm sample) string {
		if sm.scrapeErr != nil || sm.values["proxyhealth_kubeproxy_up"] != 0 {
			return "proxyhealth_kubeproxy_up not 0 at the fault's end"
		}
		return ""
	}
	fs := []fault{
		{"kube-proxy down", func(context.Context) (func(), error) {
			s.kp.down()
			return func() {
				if err := s.kp.up(); err != nil {
					benchrun.Logf("kube-proxy back up: %v", err)
				}
			}, nil
		}, kubeProxyDown},
		{"kube-proxy hangs", func(context.Context) (func(), error) {
			s.kp.setHang(true)
			return func() { s.kp.setHang(false) }, nil
		}, kubeProxyDown},
		{"rules churn", s.rulesChurn, nil},
		{"log copytruncate", func(context.Context) (func(), error) {
			return nil, s.log.copyTruncate(s.caughtUp)
		}, nil},
		{"log rename", func(context.Context) (func(), error) { return nil, s.log.rename() }, nil},
		{"log deleted", func(context.Context) (func(), error) { return nil, s.log.remove(s.caughtUp, 3*time.Second) }, nil},
		{"conntrack event storm", s.storm, nil},
		{"half-sent headers", s.halfSentHeaders, nil},
	}
	if s.cp != nil {
		fs = append(fs, fault{"API black hole", func(context.Context) (func(), error) {
			s.cp.proxy.Blackhole()
			return s.cp.proxy.Heal, nil
		}, func(sm sample) string {
			// Seen once the view is no longer fresh (--api.fresh-within, shorter than a fault).
			if sm.scrapeErr != nil || sm.values["proxyhealth_api_view_fresh"] != 0 {
				return "proxyhealth_api_view_fresh not 0 at the fault's end"
			}
			return ""
		}})
	}
	return fs
}

// inject runs one fault for --fault-length (or once, for an instant one) and waits for the
// exporter to come back clean.
func (s *soaker) inject(ctx context.Context, f fault) *faultRun {
	benchrun.Logf("fault: %s", f.kind)
	fr := &faultRun{kind: f.kind, start: time.Now()}
	s.mu.Lock()
	first := len(s.samples)
	s.mu.Unlock()
	heal, err := f.inject(ctx)
	if err != nil {
		fr.injectErr = err
		benchrun.Logf("%s: %v", f.kind, err)
	}
	if heal != nil {
		_ = benchns.Sleep(ctx, s.cfg.faultLength)
		if f.seen != nil {
			sm := s.look()
			fr.unseen = f.seen(sm)
			s.mu.Lock()
			s.samples = append(s.samples, sm)
			s.mu.Unlock()
		}
		heal()
	}
	fr.end = time.Now()
	fr.clean, fr.reason = s.waitClean(ctx, &s.baseline, s.cfg.settle)
	if fr.reason == "" && fr.injectErr != nil {
		fr.reason = "injecting: " + fr.injectErr.Error()
	}
	if fr.reason == "" && fr.unseen != "" {
		fr.reason = "not reported: " + fr.unseen
	}
	s.mu.Lock()
	for _, sm := range s.samples[first:] {
		fr.peak = maxSample(fr.peak, sm)
	}
	s.mu.Unlock()
	return fr
}

func maxSample(a, b sample) sample {
	a.rssKiB, a.hwmKiB = max(a.rssKiB, b.rssKiB), max(a.hwmKiB, b.hwmKiB)
	a.fds, a.threads, a.children = max(a.fds, b.fds), max(a.threads, b.threads), max(a.children, b.children)
	a.goroutines, a.scrape = max(a.goroutines, b.goroutines), max(a.scrape, b.scrape)
	return a
}

// rulesChurn rewrites a few Services' endpoints every 200 ms with iptables-nft-restore
// --noflush, and adds and deletes a native nftables table between, until healed; healing
// restores the original rules whole.
func (s *soaker) rulesChurn(ctx context.Context) (func(), error) {
	churnCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for gen := 1; churnCtx.Err() == nil; gen++ {
			in := natChurn(s.cfg.services, gen, s.rng)
			if _, err := run(churnCtx, in, "ip", "netns", "exec", s.ns, "iptables-nft-restore", "--noflush"); err != nil && churnCtx.Err() == nil {
				benchrun.Logf("rules churn: %v", err)
			}
			table := "table ip soak_churn {\n\tchain c {\n"
			for r := range 50 {
				table += fmt.Sprintf("\t\tip daddr 10.97.%d.%d tcp dport 80 counter\n", gen%200, r+1)
			}
			table += "\t}\n}\n"
			_, _ = run(churnCtx, []byte(table), "ip", "netns", "exec", s.ns, "nft", "-f", "-")
			_, _ = run(churnCtx, nil, "ip", "netns", "exec", s.ns, "nft", "delete", "table", "ip", "soak_churn")
			_ = benchns.Sleep(churnCtx, 200*time.Millisecond)
		}
	}()
	return func() {
		stop()
		<-done
		if _, err := run(ctx, natRules(s.cfg.services, 0), "ip", "netns", "exec", s.ns, "iptables-nft-restore"); err != nil {
			benchrun.Logf("restoring the rules: %v", err)
		}
	}, nil
}

// natChurn moves the endpoints of three random Services to generation gen: their KUBE-SVC
// chains are flushed (declared again under --noflush) and refilled with new KUBE-SEP chains.
func natChurn(services, gen int, rng *rand.Rand) []byte {
	var chains, rules strings.Builder
	chains.WriteString("*nat\n")
	for range 3 {
		svcIdx := rng.IntN(services)
		var c, r strings.Builder
		writeServiceChains(&c, &r, svcIdx, gen)
		chains.WriteString(c.String())
		rules.WriteString(r.String())
	}
	return []byte(chains.String() + rules.String() + "COMMIT\n")
}

// storm runs the conntrack event storm (this program's storm subcommand, in the namespace)
// for the fault's length at 20,000 new flows a second.
func (s *soaker) storm(ctx context.Context) (func(), error) {
	p, err := nsproc.Start(s.ns, s.dir, "storm", s.self, "storm", "--rate", "20000", "--duration", s.cfg.faultLength.String())
	if err != nil {
		return nil, err
	}
	return func() {
		select {
		case <-p.Done():
		case <-time.After(30 * time.Second):
			p.Stop()
		}
		if p.Cmd.ProcessState == nil || !p.Cmd.ProcessState.Success() {
			benchrun.Logf("storm: %s", p.Tail())
		}
	}, nil
}

// halfSentHeaders opens 200 connections to the exporter that send half a request's headers
// and nothing more, and holds them for the fault's length (the server's ReadHeaderTimeout
// closes them first).
func (s *soaker) halfSentHeaders(ctx context.Context) (func(), error) {
	dial := netnsdial.Dialer(s.ns)
	var conns []net.Conn
	for range 200 {
		c, err := dial(ctx, "tcp4", exporterAddr)
		if err != nil {
			for _, c := range conns {
				c.Close()
			}
			return nil, err
		}
		_, _ = io.WriteString(c, "GET /metrics HTTP/1.1\r\nHost: soak\r\n")
		conns = append(conns, c)
	}
	return func() {
		for _, c := range conns {
			c.Close()
		}
	}, nil
}

// caughtUp tells whether the exporter has read lines lines of kube-proxy's log.
func (s *soaker) caughtUp(lines uint64) bool {
	v, err := s.scrapeValues()
	return err == nil && v["proxyhealth_kubeproxy_log_lines_total"] == float64(lines)
}

// sampleEvery records a sample every interval until ctx ends.
func (s *soaker) sampleEvery(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		sm := s.look()
		s.mu.Lock()
		s.samples = append(s.samples, sm)
		s.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// look takes one sample: the exporter's process and one scrape.
func (s *soaker) look() sample {
	sm := sample{at: time.Now()}
	pid := s.exporter.Pid()
	if s.exporter.Exited() {
		sm.exporterGone = true
		return sm
	}
	status := benchrun.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	sm.rssKiB = statusKiB(status, "VmRSS:")
	sm.hwmKiB = statusKiB(status, "VmHWM:")
	sm.threads = int(statusKiB(status, "Threads:"))
	if ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid)); err == nil {
		sm.fds = len(ents)
	}
	sm.children = countChildren(pid)
	// The follower polls every logPoll: what was written longer ago than that (and a margin)
	// must have been read.
	sm.linesLo, sm.failsLo = s.log.countsAt(time.Now().Add(-logPoll - time.Second))
	start := time.Now()
	sm.values, sm.scrapeErr = s.scrapeValues()
	sm.scrape = time.Since(start)
	sm.linesHi, sm.failsHi = s.log.counts()
	sm.goroutines = sm.values["go_goroutines"]
	return sm
}

// countChildren counts the processes whose parent is pid (any of its threads).
func countChildren(pid int) int {
	n := 0
	files, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	for _, f := range files {
		n += len(strings.Fields(benchrun.ReadFile(f)))
	}
	return n
}

func statusKiB(status, key string) int64 {
	for _, line := range strings.Split(status, "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == key {
			v, _ := strconv.ParseInt(f[1], 10, 64)
			return v
		}
	}
	return 0
}

// scrapeValues scrapes the exporter and returns the series the clean check reads, summed over
// their labels except proxyhealth_collector_success, kept per collector.
func (s *soaker) scrapeValues() (map[string]float64, error) {
	resp, err := s.client.Get("http://" + exporterAddr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape: %s", resp.Status)
	}
	v := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		if sp < 0 {
			continue
		}
		val, err := strconv.ParseFloat(line[sp+1:], 64)
		if err != nil {
			continue
		}
		series := line[:sp]
		name, _, _ := strings.Cut(series, "{")
		switch name {
		case "proxyhealth_collector_success":
			v[series] = val
		case "go_goroutines", "proxyhealth_kubeproxy_up", "proxyhealth_kubeproxy_healthy", "proxyhealth_api_view_fresh",
			"proxyhealth_kubeproxy_log_lines_total", "proxyhealth_kubeproxy_list_errors_total":
			v[name] += val
		}
	}
	return v, sc.Err()
}

// dirty says why a sample is not clean, or "" when it is: every collector succeeds,
// kube-proxy is up and healthy, the API view is fresh (with an apiserver), the exporter has
// read every line of the log written before the scrape and none that was not, and (against a
// baseline) goroutines and fds are back near it and no child runs.
func (s *soaker) dirty(sm sample, base *sample) string {
	switch {
	case sm.exporterGone:
		return "the exporter exited"
	case sm.scrapeErr != nil:
		return "scrape: " + sm.scrapeErr.Error()
	}
	var why []string
	nSuccess := 0
	for k, v := range sm.values {
		if strings.HasPrefix(k, "proxyhealth_collector_success") {
			nSuccess++
			if v != 1 {
				why = append(why, k+" = "+strconv.FormatFloat(v, 'g', -1, 64))
			}
		}
	}
	if nSuccess == 0 {
		why = append(why, "no proxyhealth_collector_success series")
	}
	for _, k := range []string{"proxyhealth_kubeproxy_up", "proxyhealth_kubeproxy_healthy"} {
		if sm.values[k] != 1 {
			why = append(why, k+" != 1")
		}
	}
	if s.cp != nil && sm.values["proxyhealth_api_view_fresh"] != 1 {
		why = append(why, "proxyhealth_api_view_fresh != 1")
	}
	if l := uint64(sm.values["proxyhealth_kubeproxy_log_lines_total"]); l < sm.linesLo || l > sm.linesHi {
		why = append(why, fmt.Sprintf("log lines read %d, written %d-%d", l, sm.linesLo, sm.linesHi))
	}
	if f := uint64(sm.values["proxyhealth_kubeproxy_list_errors_total"]); f < sm.failsLo || f > sm.failsHi {
		why = append(why, fmt.Sprintf("watch failures counted %d, written %d-%d", f, sm.failsLo, sm.failsHi))
	}
	if base != nil {
		if sm.goroutines > base.goroutines+goroutineSlack {
			why = append(why, fmt.Sprintf("%g goroutines, baseline %g", sm.goroutines, base.goroutines))
		}
		if sm.fds > base.fds+fdSlack {
			why = append(why, fmt.Sprintf("%d fds, baseline %d", sm.fds, base.fds))
		}
	}
	if sm.children != 0 {
		why = append(why, fmt.Sprintf("%d child processes", sm.children))
	}
	slices.Sort(why)
	return strings.Join(why, "; ")
}

// waitClean looks every second until a look is clean, for at most timeout; it returns when,
// or the last reason it was not.
func (s *soaker) waitClean(ctx context.Context, base *sample, timeout time.Duration) (time.Time, string) {
	deadline := time.Now().Add(timeout)
	for n := 0; ; {
		sm := s.look()
		why := s.dirty(sm, base)
		if why == "" {
			s.mu.Lock()
			s.samples = append(s.samples, sm)
			s.mu.Unlock()
			return sm.at, ""
		}
		if time.Now().After(deadline) || ctx.Err() != nil || sm.exporterGone {
			return time.Time{}, why
		}
		if n++; n%10 == 0 {
			benchrun.Logf("not clean yet: %s", why)
		}
		time.Sleep(time.Second)
	}
}
