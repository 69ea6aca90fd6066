//go:build linux

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/proxyhealth/proxyhealth/bench/internal/benchns"
)

const proc = "/proc"

type step struct {
	Label string
	Rate  float64 // new flows/s; 0 = as fast as the generator goes
}

type config struct {
	steps        []step
	stepDur      time.Duration
	exporterBin  string
	repo         string
	consumers    []string
	out          string
	smoke        bool
	exporterArgs []string
	genCPU       int
	consCPU      int
	sockets      int
	batch        int
	udpTimeout   int
	filler       int
	drainTimeout time.Duration
	listenPort   int
	keepTmp      bool
	eventDir     string
	lockWait     time.Duration
}

type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, " ") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

func parseSteps(s string) ([]step, error) {
	var out []step
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if f == "max" {
			out = append(out, step{Label: "max"})
			continue
		}
		mult := 1.0
		num := f
		if strings.HasSuffix(f, "k") {
			mult, num = 1000, strings.TrimSuffix(f, "k")
		}
		v, err := strconv.ParseFloat(num, 64)
		if err != nil || v <= 0 || v*mult > 10_000_000 {
			return nil, fmt.Errorf("bad step %q (a rate in new flows/s such as 25000 or 25k, or max)", f)
		}
		out = append(out, step{Label: f, Rate: v * mult})
	}
	if len(out) == 0 {
		return nil, errors.New("no steps")
	}
	return out, nil
}

func runMain(args []string) int {
	fs := flag.NewFlagSet("conntrack-events", flag.ContinueOnError)
	var cfg config
	var stepsS, consumersS string
	var exporterArgs stringList
	fs.StringVar(&stepsS, "steps", "10k,25k,50k,75k,100k,150k,max", "target rates of new UDP flows/s, comma separated; max = as fast as one core sends")
	fs.DurationVar(&cfg.stepDur, "step-duration", 5*time.Second, "how long the generator sends in each phase")
	fs.StringVar(&cfg.exporterBin, "exporter-bin", "", "prebuilt proxyhealth binary (default: go build the repository at --repo)")
	fs.StringVar(&cfg.repo, "repo", "", "proxyhealth repository root to build (default: found upwards from the working directory)")
	fs.StringVar(&consumersS, "consumers", "exporter,conntrack", "consumers to measure in each step, in order (exporter, conntrack, invalid); the order alternates from step to step. invalid is the exporter with --conntrack.invalid-reasons under a load of INVALID packets (SYN+FIN) instead of new flows")
	fs.StringVar(&cfg.out, "out", "", "also write the markdown report to this file")
	fs.BoolVar(&cfg.smoke, "smoke", false, "one short low-rate step; fails only if the harness breaks or a consumer gets no event")
	fs.Var(&exporterArgs, "exporter-arg", "extra argument for proxyhealth (repeatable)")
	fs.IntVar(&cfg.genCPU, "generator-cpu", 0, "CPU the flow generator is pinned to")
	fs.IntVar(&cfg.consCPU, "consumer-cpu", 1, "CPU the consumers are pinned to")
	fs.IntVar(&cfg.sockets, "sockets", 64, "generator sockets (distinct source ports)")
	fs.IntVar(&cfg.batch, "batch", 32, "datagrams per sendmmsg call")
	fs.IntVar(&cfg.udpTimeout, "udp-timeout", 1, "net.netfilter.nf_conntrack_udp_timeout in the namespace (seconds)")
	fs.IntVar(&cfg.filler, "filler-services", 20, "other (TCP) services ahead of the benchmarked one in KUBE-SERVICES")
	fs.DurationVar(&cfg.drainTimeout, "drain-timeout", 20*time.Second, "how long to wait for the conntrack table to empty after a phase")
	fs.IntVar(&cfg.listenPort, "listen-port", 9869, "exporter port on 127.0.0.1 inside the namespace")
	fs.BoolVar(&cfg.keepTmp, "keep-tmp", false, "keep the temporary directory (consumer logs)")
	fs.DurationVar(&cfg.lockWait, "lock-wait", 0, "wait up to this long for another benchmark to release "+benchns.BenchLock+" (0: fail at once)")
	fs.StringVar(&cfg.eventDir, "event-dir", "/dev/shm", "directory (tmpfs, so that disk writeback never stalls it) for the file conntrack -E writes; the default temporary directory if empty or missing")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	cfg.exporterArgs = exporterArgs
	var err error
	if cfg.smoke {
		cfg.steps = []step{{Label: "2k", Rate: 2000}}
		cfg.stepDur = time.Second
	} else if cfg.steps, err = parseSteps(stepsS); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	for _, c := range strings.Split(consumersS, ",") {
		c = strings.TrimSpace(c)
		if c != "exporter" && c != "conntrack" && c != "invalid" {
			fmt.Fprintf(os.Stderr, "unknown consumer %q (exporter, conntrack)\n", c)
			return 2
		}
		cfg.consumers = append(cfg.consumers, c)
	}
	if cfg.stepDur <= 0 || cfg.stepDur > 5*time.Minute {
		fmt.Fprintln(os.Stderr, "--step-duration must be in (0, 5m]")
		return 2
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "conntrack-events must run as root (it creates network namespaces)")
		return 2
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	results, hdr, err := bench(ctx, cfg, append([]string{"conntrack-events"}, args...))
	if hdr != nil {
		report := renderReport(hdr, results)
		fmt.Print(report)
		if cfg.out != "" {
			if werr := os.WriteFile(cfg.out, []byte(report), 0o644); werr != nil {
				fmt.Fprintln(os.Stderr, werr)
				return 1
			}
		}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "conntrack-events: %v\n", err)
		if ctx.Err() != nil {
			return 130
		}
		return 1
	}
	failed := 0
	for _, r := range results {
		if r.Err != nil || r.Handled == 0 {
			failed++
		}
	}
	if failed > 0 {
		fmt.Fprintf(os.Stderr, "conntrack-events: %d phase(s) failed or handled no event\n", failed)
		return 1
	}
	return 0
}

// header is what the report says about the run.
type header struct {
	Date, Kernel, CPU, Cmdline     string
	Events, CTMax, UDPTimeout, NS  string
	ConntrackVersion, ExporterInfo string
	EventDir                       string
	Cores                          int
	StepDur                        time.Duration
	Sockets, Filler                int
	GenCPU, ConsCPU                int
}

// bench sets up the namespace, runs every step and phase and always tears down what it made.
func bench(ctx context.Context, cfg config, argv []string) (results []phaseResult, hdr *header, err error) {
	unlock, err := benchns.LockWithin(ctx, cfg.lockWait, func(err error) {
		fmt.Fprintf(os.Stderr, "conntrack-events: %v; waiting up to %s\n", err, cfg.lockWait)
	})
	if err != nil {
		return nil, nil, err
	}
	defer unlock()

	if err := benchns.RemoveLeftovers(nsPrefix); err != nil {
		return nil, nil, err
	}
	tmp, err := os.MkdirTemp("", "ph-bench-")
	if err != nil {
		return nil, nil, err
	}
	if !cfg.keepTmp {
		defer os.RemoveAll(tmp)
	} else {
		fmt.Fprintf(os.Stderr, "keeping %s\n", tmp)
	}
	self, err := os.Executable()
	if err != nil {
		return nil, nil, err
	}

	exporterBin := cfg.exporterBin
	if (slices.Contains(cfg.consumers, "exporter") || slices.Contains(cfg.consumers, "invalid")) && exporterBin == "" {
		repo := cfg.repo
		if repo == "" {
			if repo, err = findRepo(); err != nil {
				return nil, nil, err
			}
		}
		exporterBin = filepath.Join(tmp, "proxyhealth")
		fmt.Fprintf(os.Stderr, "building proxyhealth from %s\n", repo)
		bctx, cancel := context.WithTimeout(ctx, 15*time.Minute)
		cmd := exec.CommandContext(bctx, "go", "build", "-o", exporterBin, ".")
		cmd.Dir = repo
		out, berr := cmd.CombinedOutput()
		cancel()
		if berr != nil {
			return nil, nil, fmt.Errorf("go build: %w: %s", berr, out)
		}
	}

	ns := benchns.NewName(nsPrefix)
	defer func() {
		if derr := benchns.Delete(nsPrefix, ns); derr != nil {
			fmt.Fprintf(os.Stderr, "removing namespace %s: %v\n", ns, derr)
		}
	}()
	if err := setupNS(ctx, ns, cfg.udpTimeout, cfg.filler, cfg.listenPort); err != nil {
		return nil, nil, err
	}

	hdr = &header{
		Date:       time.Now().UTC().Format(time.RFC3339),
		Kernel:     strings.TrimSpace(readFile("/proc/sys/kernel/osrelease")),
		CPU:        benchns.CPUModel(),
		Cores:      benchns.NumCPU(),
		Cmdline:    strings.Join(argv, " "),
		Events:     nsSysctl(ctx, ns, "net.netfilter.nf_conntrack_events"),
		CTMax:      nsSysctl(ctx, ns, "net.netfilter.nf_conntrack_max"),
		UDPTimeout: nsSysctl(ctx, ns, "net.netfilter.nf_conntrack_udp_timeout"),
		NS:         ns,
		StepDur:    cfg.stepDur,
		Sockets:    cfg.sockets,
		Filler:     cfg.filler,
		GenCPU:     cfg.genCPU,
		ConsCPU:    cfg.consCPU,
	}
	if slices.Contains(cfg.consumers, "conntrack") {
		out, _ := run(ctx, "", "conntrack", "--version")
		hdr.ConntrackVersion = strings.TrimSpace(out)
	}
	var exporterBase, invalidArgs []string
	if exporterBin != "" && (slices.Contains(cfg.consumers, "exporter") || slices.Contains(cfg.consumers, "invalid")) {
		out, _ := run(ctx, "", exporterBin, "--version")
		hdr.ExporterInfo = firstLine(out)
		if repo := cfg.repo; cfg.exporterBin == "" {
			if repo == "" {
				repo, _ = findRepo()
			}
			if c, err := run(ctx, "", "git", "-C", repo, "rev-parse", "--short", "HEAD"); err == nil {
				hdr.ExporterInfo += " (commit " + strings.TrimSpace(c) + ")"
			}
		}
		exporterBase = []string{fmt.Sprintf("--web.listen-address=127.0.0.1:%d", cfg.listenPort)}
		help, _ := run(ctx, "", exporterBin, "--help")
		if strings.Contains(help, "collector.node") {
			exporterBase = append(exporterBase, "--no-collector.node")
		}
		exporterBase = append(exporterBase, cfg.exporterArgs...)
		// The invalid consumer measures the reader's cost per packet: every packet is read,
		// unless the run sets the bound itself.
		if strings.Contains(help, "conntrack.invalid-reasons.max-rate") && !slices.ContainsFunc(cfg.exporterArgs, func(a string) bool {
			return strings.HasPrefix(a, "--conntrack.invalid-reasons.max-rate")
		}) {
			invalidArgs = []string{"--conntrack.invalid-reasons.max-rate=0"}
		}
	}

	eventDir := tmp
	if fi, err := os.Stat(cfg.eventDir); cfg.eventDir != "" && err == nil && fi.IsDir() {
		if eventDir, err = os.MkdirTemp(cfg.eventDir, "ph-bench-"); err != nil {
			return nil, hdr, err
		}
		defer os.RemoveAll(eventDir)
	}
	hdr.EventDir = eventDir
	env := &phaseEnv{cfg: cfg, ns: ns, tmp: tmp, eventDir: eventDir, self: self, exporterBin: exporterBin, exporterArgs: exporterBase, invalidArgs: invalidArgs}
	for i, st := range cfg.steps {
		order := slices.Clone(cfg.consumers)
		if i%2 == 1 {
			slices.Reverse(order)
		}
		for _, c := range order {
			if err := ctx.Err(); err != nil {
				return results, hdr, err
			}
			fmt.Fprintf(os.Stderr, "step %s: %s ...\n", st.Label, c)
			r := env.runPhase(ctx, st, c)
			if ctx.Err() != nil {
				return results, hdr, ctx.Err()
			}
			if r.Err != nil {
				fmt.Fprintf(os.Stderr, "step %s: %s: %v\n", st.Label, c, r.Err)
			} else {
				fmt.Fprintf(os.Stderr, "step %s: %s: %d events, %d lost, %.2f us/event\n", st.Label, c, r.Handled, r.Lost, r.usPerEvent())
			}
			results = append(results, r)
		}
	}
	return results, hdr, nil
}

func findRepo() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for i := 0; i < 64; i++ {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && bytes.Contains(b, []byte("module github.com/proxyhealth/proxyhealth\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			break
		}
		dir = parent
	}
	return "", errors.New("cannot find the proxyhealth repository above the working directory; pass --repo or --exporter-bin")
}

func readFile(p string) string {
	b, _ := os.ReadFile(p)
	return string(b)
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// phaseEnv is what every phase shares.
type phaseEnv struct {
	cfg          config
	ns, tmp      string
	eventDir     string // where conntrack -E writes its events
	self         string
	exporterBin  string
	exporterArgs []string
	invalidArgs  []string // the invalid consumer's own, after exporterArgs
}

// phaseResult is one consumer at one step.
type phaseResult struct {
	Step      step
	Consumer  string
	Gen       genResult
	Handled   uint64
	Lost      uint64 // the kernel's Drops for the consumer's conntrack sockets
	ExpLost   float64
	HaveExpCt bool   // the exporter served proxyhealth_conntrack_events_lost_total
	Ticks     uint64 // utime+stime
	SysTicks  uint64 // stime
	Wall      time.Duration
	HWMKB     uint64
	Table     ctStats // deltas of drop/early_drop/insert_failed
	MaxEnt    uint64
	QueuedMax uint64 // the most bytes seen queued on its conntrack sockets (Rmem), sampled
	Err       error
}

func (r phaseResult) usPerEvent() float64 {
	if r.Handled == 0 {
		return 0
	}
	return float64(r.Ticks) * 1e6 / float64(clkTck) / float64(r.Handled)
}

// clkTck is USER_HZ, the unit of utime/stime in /proc/<pid>/stat (100 on Linux).
const clkTck = 100

// consumer is one running event consumer.
type consumer struct {
	kind    string
	cmd     *exec.Cmd
	pid     int
	outPath string
	logPath string
	exited  chan struct{}
	waitErr error
}

func (e *phaseEnv) startConsumer(kind string) (*consumer, error) {
	c := &consumer{kind: kind, exited: make(chan struct{})}
	base := []string{"netns", "exec", e.ns, "taskset", "-c", strconv.Itoa(e.cfg.consCPU)}
	var args []string
	switch kind {
	case "conntrack":
		args = append(base, "conntrack", "-E", "-e", "NEW,UPDATE,DESTROY")
	case "exporter":
		args = append(append(base, e.exporterBin), e.exporterArgs...)
	case "invalid":
		args = append(append(append(base, e.exporterBin), e.exporterArgs...), "--conntrack.invalid-reasons", "--conntrack.invalid-reasons.state-dir="+filepath.Join(e.tmp, "state"))
		args = append(args, e.invalidArgs...)
	}
	stamp := strconv.FormatInt(time.Now().UnixNano(), 36)
	c.outPath = filepath.Join(e.eventDir, kind+"-"+stamp+".out")
	c.logPath = filepath.Join(e.tmp, kind+"-"+stamp+".log")
	out, err := os.Create(c.outPath)
	if err != nil {
		return nil, err
	}
	defer out.Close()
	log, err := os.Create(c.logPath)
	if err != nil {
		return nil, err
	}
	defer log.Close()
	c.cmd = exec.Command("ip", args...)
	c.cmd.Stdout, c.cmd.Stderr = out, log
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := c.cmd.Start(); err != nil {
		return nil, err
	}
	c.pid = c.cmd.Process.Pid
	go func() {
		c.waitErr = c.cmd.Wait()
		close(c.exited)
	}()
	return c, nil
}

// stop ends the consumer: SIGINT (conntrack prints its count), SIGTERM for the exporter, then
// SIGKILL after a while.
func (c *consumer) stop() {
	sig := syscall.SIGTERM
	if c.kind == "conntrack" {
		sig = syscall.SIGINT
	}
	_ = syscall.Kill(c.pid, sig)
	select {
	case <-c.exited:
		return
	case <-time.After(10 * time.Second):
	}
	_ = syscall.Kill(-c.pid, syscall.SIGKILL)
	select {
	case <-c.exited:
	case <-time.After(5 * time.Second):
	}
}

func (c *consumer) logTail() string {
	b := readFile(c.logPath)
	if len(b) > 1500 {
		b = "..." + b[len(b)-1500:]
	}
	return strings.TrimSpace(b)
}

// eventSocket reports whether the consumer holds a conntrack netlink socket subscribed to
// multicast groups.
func (c *consumer) eventSocket() (bool, error) {
	inodes, err := socketInodes(proc, c.pid)
	if err != nil {
		return false, err
	}
	f, err := os.Open(filepath.Join(proc, strconv.Itoa(c.pid), "net", "netlink"))
	if err != nil {
		return false, err
	}
	defer f.Close()
	rows, err := parseNetlink(f)
	if err != nil {
		return false, err
	}
	for _, r := range rows {
		if r.Proto == netlinkNetfilter && r.Groups != 0 && inodes[r.Inode] {
			return true, nil
		}
	}
	return false, nil
}

// queued returns the bytes waiting in the consumer's conntrack sockets.
func (c *consumer) queued() (uint64, error) {
	inodes, err := socketInodes(proc, c.pid)
	if err != nil {
		return 0, err
	}
	b, err := os.ReadFile(filepath.Join(proc, strconv.Itoa(c.pid), "net", "netlink"))
	if err != nil {
		return 0, err
	}
	rows, err := parseNetlink(bytes.NewReader(b))
	if err != nil {
		return 0, err
	}
	var n uint64
	for _, r := range rows {
		if r.Proto == netlinkNetfilter && inodes[r.Inode] {
			n += r.Rmem
		}
	}
	return n, nil
}

// dropTracker follows the kernel's drop counter of every conntrack socket the consumer holds
// over a phase, including sockets it replaces meanwhile.
type dropTracker struct {
	pid  int
	mu   sync.Mutex
	base map[uint64]uint64
	max  map[uint64]uint64
	ent  uint64
	rmem uint64 // the largest Rmem sum of the sockets seen
}

func newDropTracker(pid int) *dropTracker {
	return &dropTracker{pid: pid, max: map[uint64]uint64{}}
}

func (d *dropTracker) sample() error {
	inodes, err := socketInodes(proc, d.pid)
	if err != nil {
		return err
	}
	b, err := os.ReadFile(filepath.Join(proc, strconv.Itoa(d.pid), "net", "netlink"))
	if err != nil {
		return err
	}
	rows, err := parseNetlink(bytes.NewReader(b))
	if err != nil {
		return err
	}
	st, stErr := nsCTStats(d.pid)
	d.mu.Lock()
	defer d.mu.Unlock()
	var rmem uint64
	for _, r := range rows {
		if r.Proto != netlinkNetfilter || !inodes[r.Inode] {
			continue
		}
		rmem += r.Rmem
		if r.Drops >= d.max[r.Inode] {
			d.max[r.Inode] = r.Drops
		}
	}
	d.rmem = max(d.rmem, rmem)
	if d.base == nil {
		d.base = make(map[uint64]uint64)
		for k, v := range d.max {
			d.base[k] = v
		}
	}
	if stErr == nil && st.Entries > d.ent {
		d.ent = st.Entries
	}
	return nil
}

func (d *dropTracker) total() uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	var n uint64
	for k, v := range d.max {
		n += v - d.base[k]
	}
	return n
}

func nsCTStats(pid int) (ctStats, error) {
	f, err := os.Open(filepath.Join(proc, strconv.Itoa(pid), "net", "stat", "nf_conntrack"))
	if err != nil {
		return ctStats{}, err
	}
	defer f.Close()
	return parseCTStats(f)
}

// nsEntries reads the namespace's conntrack entry count without a consumer running.
func (e *phaseEnv) nsEntries(ctx context.Context) (uint64, error) {
	out, err := run(ctx, "", "ip", "netns", "exec", e.ns, "cat", "/proc/net/stat/nf_conntrack")
	if err != nil {
		return 0, err
	}
	st, err := parseCTStats(strings.NewReader(out))
	return st.Entries, err
}

// sleepCtx sleeps unless ctx ends first.
func (e *phaseEnv) scrape(ctx context.Context) (exporterCounts, error) {
	out, err := run(ctx, "", "ip", "netns", "exec", e.ns, e.self, "get", fmt.Sprintf("http://127.0.0.1:%d/metrics", e.cfg.listenPort))
	if err != nil {
		return exporterCounts{}, err
	}
	return parseExporterMetrics(strings.NewReader(out))
}

// handled is the consumer's count of events received so far.
func (e *phaseEnv) handled(ctx context.Context, c *consumer) (float64, exporterCounts, error) {
	if c.kind == "conntrack" {
		n, err := countLines(c.outPath)
		return float64(n), exporterCounts{}, err
	}
	m, err := e.scrape(ctx)
	if err != nil {
		return 0, m, err
	}
	if c.kind == "invalid" {
		if !m.HaveInvalidLost {
			return 0, m, errors.New("the exporter serves no proxyhealth_conntrack_invalid_reason_packets_lost_total (built without --conntrack.invalid-reasons?)")
		}
		return m.Invalid, m, nil
	}
	if !m.HaveEvents {
		return 0, m, errors.New("the exporter serves no proxyhealth_conntrack_events_total (conntrack collector missing or not counting events?)")
	}
	return m.Events, m, nil
}

// runPhase measures one consumer at one step.
func (e *phaseEnv) runPhase(ctx context.Context, st step, kind string) (res phaseResult) {
	res = phaseResult{Step: st, Consumer: kind}
	fail := func(err error) phaseResult {
		res.Err = err
		return res
	}

	// Start from an empty table, so that every event of the phase belongs to its own flows.
	if err := e.reapUntilEmpty(ctx, e.nsEntries); err != nil {
		return fail(err)
	}
	c, err := e.startConsumer(kind)
	if err != nil {
		return fail(err)
	}
	defer c.stop()

	// Ready: an event socket is open (and the exporter answers).
	deadline := time.Now().Add(20 * time.Second)
	for {
		select {
		case <-c.exited:
			return fail(fmt.Errorf("%s exited at start (%v): %s", kind, c.waitErr, c.logTail()))
		default:
		}
		ok, err := c.eventSocket()
		if err == nil && ok {
			if kind == "conntrack" {
				break
			}
			// The invalid consumer is ready once its NFLOG reader is: the log's settings
			// are set then (the exporter serves no collector error).
			if m, err := e.scrape(ctx); err == nil && (kind == "exporter" || e.invalidLogReady(ctx, m)) {
				break
			}
		}
		if time.Now().After(deadline) {
			return fail(fmt.Errorf("%s opened no conntrack event socket within 20s: %s", kind, c.logTail()))
		}
		if err := benchns.Sleep(ctx, 100*time.Millisecond); err != nil {
			return fail(err)
		}
	}
	if err := benchns.Sleep(ctx, 300*time.Millisecond); err != nil {
		return fail(err)
	}

	// Baseline.
	h0, m0, err := e.handled(ctx, c)
	if err != nil {
		return fail(err)
	}
	u0, s0, err := cpuTicks(proc, c.pid)
	if err != nil {
		return fail(err)
	}
	st0, err := nsCTStats(c.pid)
	if err != nil {
		return fail(err)
	}
	dt := newDropTracker(c.pid)
	if err := dt.sample(); err != nil {
		return fail(err)
	}
	wall0 := time.Now()
	samplerCtx, stopSampler := context.WithCancel(ctx)
	samplerDone := make(chan struct{})
	go func() {
		defer close(samplerDone)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-samplerCtx.Done():
				return
			case <-tick.C:
				_ = dt.sample()
			}
		}
	}()
	defer stopSampler()

	// Load.
	g, err := e.generate(ctx, st, kind == "invalid")
	if err != nil {
		return fail(err)
	}
	res.Gen = g

	// End of the window: the consumer has read what its sockets held and its count is
	// stable. Entries of the last flows expire meanwhile but nothing evicts them yet (the
	// kernel's own garbage collection aside).
	for i := 0; i < 500; i++ {
		q, err := c.queued()
		if err != nil {
			return fail(err)
		}
		if q == 0 {
			break
		}
		if err := benchns.Sleep(ctx, 20*time.Millisecond); err != nil {
			return fail(err)
		}
	}
	var h1 float64
	var m1 exporterCounts
	prev := -1.0
	for i := 0; i < 50; i++ {
		if h1, m1, err = e.handled(ctx, c); err != nil {
			return fail(err)
		}
		if h1 == prev {
			break
		}
		prev = h1
		if err := benchns.Sleep(ctx, 200*time.Millisecond); err != nil {
			return fail(err)
		}
	}
	stopSampler()
	<-samplerDone
	if err := dt.sample(); err != nil {
		return fail(err)
	}
	u1, s1, err := cpuTicks(proc, c.pid)
	if err != nil {
		return fail(err)
	}
	res.Wall = time.Since(wall0)
	st1, err := nsCTStats(c.pid)
	if err != nil {
		return fail(err)
	}
	res.HWMKB, _ = statusKB(proc, c.pid, "VmHWM")
	res.Handled = uint64(h1 - h0)
	res.Lost = dt.total()
	res.Ticks = u1 - u0 + s1 - s0
	res.SysTicks = s1 - s0
	res.MaxEnt = dt.ent
	res.QueuedMax = dt.rmem
	res.Table = ctStats{Drop: st1.Drop - st0.Drop, EarlyDrop: st1.EarlyDrop - st0.EarlyDrop, InsertFailed: st1.InsertFailed - st0.InsertFailed}
	switch kind {
	case "exporter":
		res.HaveExpCt = m0.HaveLost && m1.HaveLost
		res.ExpLost = m1.Lost - m0.Lost
	case "invalid":
		res.HaveExpCt = m0.HaveInvalidLost && m1.HaveInvalidLost
		res.ExpLost = m1.InvalidLost - m0.InvalidLost
	}
	select {
	case <-c.exited:
		return fail(fmt.Errorf("%s exited during the phase (%v): %s", kind, c.waitErr, c.logTail()))
	default:
	}
	// Drain, outside the measurement: evict the expired entries while the consumer still
	// listens (their DESTROY events were announced to it), then stop it.
	if err := e.reapUntilEmpty(ctx, func(context.Context) (uint64, error) {
		s, err := nsCTStats(c.pid)
		return s.Entries, err
	}); err != nil {
		return fail(err)
	}
	c.stop()
	os.Remove(c.outPath)
	return res
}

// reapUntilEmpty runs the reaper (see reap.go) on the generator's CPU until the namespace's
// table is empty.
func (e *phaseEnv) reapUntilEmpty(ctx context.Context, entries func(context.Context) (uint64, error)) error {
	cmd := exec.Command("ip", "netns", "exec", e.ns, "taskset", "-c", strconv.Itoa(e.cfg.genCPU), e.self, "reap",
		"--duration", (e.cfg.drainTimeout + 5*time.Second).String())
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	defer func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}()
	return e.waitEmpty(ctx, func(context.Context) (uint64, error) {
		select {
		case err := <-done:
			done <- err
			return 0, fmt.Errorf("the conntrack reaper stopped (%v): %s", err, strings.TrimSpace(stderr.String()))
		default:
		}
		return entries(ctx)
	})
}

// waitEmpty waits (bounded) until the namespace's conntrack table is empty.
func (e *phaseEnv) waitEmpty(ctx context.Context, entries func(context.Context) (uint64, error)) error {
	deadline := time.Now().Add(e.cfg.drainTimeout)
	for {
		n, err := entries(ctx)
		if err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			list, _ := run(ctx, "", "ip", "netns", "exec", e.ns, "conntrack", "-L")
			return fmt.Errorf("conntrack table still has %d entries after %s: %s", n, e.cfg.drainTimeout, strings.Join(strings.Split(strings.TrimSpace(list), "\n"), " ; "))
		}
		if err := benchns.Sleep(ctx, 200*time.Millisecond); err != nil {
			return err
		}
	}
}

// invalidLogReady reports whether the exporter reads conntrack's INVALID log: the namespace's
// nf_conntrack_log_invalid is set, and the exporter serves the log's counters.
func (e *phaseEnv) invalidLogReady(ctx context.Context, m exporterCounts) bool {
	out, err := run(ctx, "", "ip", "netns", "exec", e.ns, "cat", "/proc/sys/net/netfilter/nf_conntrack_log_invalid")
	return err == nil && strings.TrimSpace(out) == "255" && m.HaveInvalidLost
}

// generate runs the flow generator in the namespace, pinned to its CPU; with invalid, the
// generator sends INVALID packets instead of new flows.
func (e *phaseEnv) generate(ctx context.Context, st step, invalid bool) (genResult, error) {
	gctx, cancel := context.WithTimeout(ctx, e.cfg.stepDur+60*time.Second)
	defer cancel()
	args := []string{"netns", "exec", e.ns, "taskset", "-c", strconv.Itoa(e.cfg.genCPU), e.self, "gen",
		"--rate", strconv.FormatFloat(st.Rate, 'f', -1, 64),
		"--duration", e.cfg.stepDur.String(),
		"--sockets", strconv.Itoa(e.cfg.sockets),
		"--batch", strconv.Itoa(e.cfg.batch)}
	if invalid {
		args = append(args, "--invalid")
	}
	cmd := exec.CommandContext(gctx, "ip", args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return genResult{}, fmt.Errorf("generator: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	var g genResult
	if err := json.Unmarshal(out, &g); err != nil {
		return g, fmt.Errorf("generator output %q: %w", out, err)
	}
	if g.Sent == 0 {
		return g, fmt.Errorf("generator sent nothing (errors %v)", g.Errors)
	}
	return g, nil
}
