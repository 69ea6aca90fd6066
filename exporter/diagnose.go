package exporter

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/prometheus/common/promslog"

	"github.com/proxyhealth/proxyhealth/collectors/conntrack"
	"github.com/proxyhealth/proxyhealth/collectors/kubeproxy"
	"github.com/proxyhealth/proxyhealth/collectors/rules"
	"github.com/proxyhealth/proxyhealth/internal/verdict"
)

// diagnose's exit codes: the verdict's (verdict.Verdict.ExitCode), the plugin's too; it exits
// as for an unknown verdict when it cannot diagnose at all.
const (
	exitNoFinding      = verdict.ExitHealthy
	exitWarnings       = verdict.ExitWarnings
	exitCritical       = verdict.ExitCritical
	exitCannotDiagnose = verdict.ExitUnknown
)

const diagnoseHelp = `Judge this node once, locally, without a running exporter, and print the findings: the same causes, evidence and runbooks as the exporter's /status. It reads the node's counters twice, --window apart, and counts a difference between kube-proxy's rules and the API as stale rules only when it lasted the whole window. Exit code, as the verdict: 0 healthy (no finding), 1 warning (only warnings), 2 critical (a critical finding), 3 unknown: it could not diagnose (usage, privileges), or a cause could not be checked and nothing critical was found (the message says why).`

// diagnoseConfig is diagnose's own flags; the exporter's flags (kubeconfig, node name,
// kube-proxy endpoints and log, collectors) apply as well.
type diagnoseConfig struct {
	Window      time.Duration
	Output      string
	Service     string
	LogSince    time.Duration
	SyncTimeout time.Duration
}

func addDiagnoseFlags(cmd *kingpin.CmdClause) *diagnoseConfig {
	c := &diagnoseConfig{}
	cmd.Flag("window", "How long to watch: counters are read at its start and end, and a difference between kube-proxy's rules and the API must last all of it to count as stale rules rather than sync lag.").
		Default("15s").DurationVar(&c.Window)
	cmd.Flag("output", "Output format: text, or json in the /status schema.").Default("text").EnumVar(&c.Output, "text", "json")
	cmd.Flag("service", "Show this Service side by side, per port: the endpoints the API wants on this node and those kube-proxy programmed, by address, and its unreplied flows (NAMESPACE/NAME).").
		PlaceHolder("NAMESPACE/NAME").StringVar(&c.Service)
	cmd.Flag("log-since", "How far back kube-proxy's log is read for list/watch failures (the last 16 MiB of each file at most).").
		Default("1h").DurationVar(&c.LogSince)
	cmd.Flag("sync-timeout", "How long to wait for the API view to sync and the node's rules to be read before the window starts.").
		Default("30s").DurationVar(&c.SyncTimeout)
	return c
}

func (c *diagnoseConfig) validate() error {
	switch {
	case c.Window < 0:
		return errors.New("--window must not be negative")
	case c.LogSince <= 0:
		return errors.New("--log-since must be positive")
	case c.SyncTimeout < 0:
		return errors.New("--sync-timeout must not be negative")
	}
	if c.Service != "" {
		if _, _, err := splitService(c.Service); err != nil {
			return err
		}
	}
	return nil
}

func splitService(s string) (namespace, name string, err error) {
	namespace, name, ok := strings.Cut(s, "/")
	if !ok || namespace == "" || name == "" || strings.Contains(name, "/") {
		return "", "", fmt.Errorf("--service %q: want NAMESPACE/NAME", s)
	}
	return namespace, name, nil
}

// wantsDiagnose tells whether the command line asks for diagnose, for the exit code of a
// command line that does not parse.
func wantsDiagnose(args []string) bool {
	for _, a := range args {
		if a == "diagnose" {
			return true
		}
		if a == "--" {
			break
		}
	}
	return false
}

// maxLogScanBytes bounds how much of each kube-proxy log file diagnose reads.
const maxLogScanBytes = 16 << 20

// diagnosis is one look at the node. Its functions are the node's parts (real collectors from
// runDiagnose, fakes in tests); a nil one is a part that is off.
type diagnosis struct {
	cfg diagnoseConfig
	src *factSources
	// start starts the background readers; ready waits (within cfg.SyncTimeout) until they
	// have something to say.
	start func(ctx context.Context)
	ready func(ctx context.Context)
	// pollKubeProxy asks kube-proxy once; scanLog reads its log back to since.
	pollKubeProxy func(ctx context.Context)
	scanLog       func(since time.Time) kubeproxy.LogScan
	// driftReady is when the drift check first compared with a fresh view (zero when it
	// has not); driftSettled waits until a comparison has covered the window from then, and
	// says why not when it cannot.
	driftReady   func() time.Time
	driftSettled func(ctx context.Context, from time.Time) error
	// service returns the Service's ports side by side.
	service func(namespace, name string) ([]rules.PortEndpoints, error)
	sleep   func(ctx context.Context, d time.Duration) error
}

// result is what diagnose prints.
type result struct {
	verdict.Report
	// ServicePorts is the --service Service side by side; absent without --service.
	ServicePorts []servicePort `json:"service_ports,omitempty"`
}

// servicePort is one port of the --service Service, side by side.
type servicePort struct {
	Service    verdict.Service `json:"service"`
	ClusterIPs []string        `json:"cluster_ips"`
	// Expected are the endpoints the API wants kube-proxy to program on this node,
	// Programmed those its rules hold; Missing and Stale the differences now (a difference
	// counts as stale rules only when it lasts, see findings).
	Expected       []string                 `json:"expected"`
	Programmed     []string                 `json:"programmed"`
	Missing        []string                 `json:"missing"`
	Stale          []string                 `json:"stale"`
	Chains         []string                 `json:"chains"`
	ByChain        []chainSide              `json:"by_chain,omitempty"`
	UnrepliedFlows []verdict.UnrepliedCount `json:"unreplied_flows"`
}

// chainSide is one of the port's chains side by side: each chain is compared with what it
// should hold, so an endpoint can be missing from the local chain while the cluster chain
// still holds it.
type chainSide struct {
	Chain      string   `json:"chain"` // cluster or local
	Name       string   `json:"name,omitempty"`
	Expected   []string `json:"expected"`
	Programmed []string `json:"programmed"`
	Missing    []string `json:"missing"`
	Stale      []string `json:"stale"`
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// run looks at the node over the window and judges it.
func (d *diagnosis) run(ctx context.Context) (result, error) {
	if d.start != nil {
		d.start(ctx)
	}
	if d.ready != nil {
		d.ready(ctx)
	}
	if d.pollKubeProxy != nil {
		d.pollKubeProxy(ctx)
	}
	first := d.src.sample()
	var from time.Time
	if d.driftReady != nil {
		from = d.driftReady()
	}
	if err := d.sleep(ctx, d.cfg.Window); err != nil {
		return result{}, err
	}
	var driftErr error
	if d.driftSettled != nil && !from.IsZero() {
		driftErr = d.driftSettled(ctx, from)
	}
	if d.pollKubeProxy != nil {
		d.pollKubeProxy(ctx)
	}
	last := d.src.sample()
	opts := inputOptions{logSpan: d.cfg.LogSince}
	if d.scanLog != nil {
		scan := d.scanLog(last.at.Add(-d.cfg.LogSince))
		opts.logScan = &scan
	}
	in := d.src.input([]factSample{first, last}, opts)
	if driftErr != nil && in.Rules.Err == "" {
		in.Rules.Checked, in.Rules.Err = false, driftErr.Error()
	}
	res := result{Report: verdict.Evaluate(in)}
	if d.cfg.Service != "" {
		ports, err := d.servicePorts(in)
		if err != nil {
			return res, err
		}
		res.ServicePorts = ports
	}
	return res, ctx.Err()
}

func (d *diagnosis) servicePorts(in verdict.Input) ([]servicePort, error) {
	namespace, name, err := splitService(d.cfg.Service)
	if err != nil {
		return nil, err
	}
	if d.service == nil {
		return nil, errors.New("--service needs the rules collector and a Kubernetes API")
	}
	ports, err := d.service(namespace, name)
	if err != nil {
		return nil, err
	}
	if len(ports) == 0 {
		return nil, fmt.Errorf("Service %s/%s not found in the API view (or it has no port kube-proxy programs)", namespace, name)
	}
	out := make([]servicePort, 0, len(ports))
	for _, p := range ports {
		svc := verdict.Service{Namespace: p.Name.Namespace, Name: p.Name.Name, Port: p.Port,
			Protocol: strings.ToLower(p.Name.Protocol), PortName: p.Name.Port}
		sp := servicePort{
			Service:        svc,
			ClusterIPs:     addrStrings(p.ClusterIPs),
			Expected:       addrStrings(p.Expected),
			Programmed:     addrStrings(p.Programmed),
			Missing:        addrStrings(p.Missing),
			Stale:          addrStrings(p.Stale),
			Chains:         p.Chains,
			UnrepliedFlows: []verdict.UnrepliedCount{},
		}
		if p.Missing == nil && p.Stale == nil {
			// Not compared chain by chain (the rules were not read): the port's endpoints as
			// a whole.
			sp.Missing, sp.Stale = addrStrings(minus(p.Expected, p.Programmed)), addrStrings(minus(p.Programmed, p.Expected))
		}
		for _, c := range p.ByChain {
			sp.ByChain = append(sp.ByChain, chainSide{Chain: c.Chain.String(), Name: c.Name,
				Expected: addrStrings(c.Expected), Programmed: addrStrings(c.Programmed),
				Missing: addrStrings(c.Missing), Stale: addrStrings(c.Stale)})
		}
		if sp.Chains == nil {
			sp.Chains = []string{}
		}
		for _, u := range in.Conntrack.Unreplied {
			if u.Service.Namespace == svc.Namespace && u.Service.Name == svc.Name && u.Service.Port == svc.Port && u.Service.Protocol == svc.Protocol {
				sp.UnrepliedFlows = append(sp.UnrepliedFlows, u)
			}
		}
		out = append(out, sp)
	}
	return out, nil
}

// chainsWhere names the chains whose list (of) holds ep, as " from the local chain" (prep
// "from"), or "" when the port's chains were not compared one by one.
func (p servicePort) chainsWhere(ep string, of func(chainSide) []string, prep string) string {
	var chains []string
	for _, c := range p.ByChain {
		if slices.Contains(of(c), ep) {
			chains = append(chains, c.Chain)
		}
	}
	switch len(chains) {
	case 0:
		return ""
	case 1:
		return " " + prep + " the " + chains[0] + " chain"
	}
	return " " + prep + " the " + strings.Join(chains, " and ") + " chains"
}

// minus is a without b (both sorted and distinct).
func minus(a, b []netip.AddrPort) []netip.AddrPort {
	out := []netip.AddrPort{}
	for _, x := range a {
		if _, found := slices.BinarySearchFunc(b, x, netip.AddrPort.Compare); !found {
			out = append(out, x)
		}
	}
	return out
}

// exitCode is diagnose's verdict for scripts.
func exitCode(r verdict.Report) int { return r.Verdict.ExitCode() }

// write prints res in format (text or json).
func (res result) write(w io.Writer, format string) error {
	if format == "json" {
		b, err := json.MarshalIndent(res, "", "  ")
		if err != nil {
			return err
		}
		_, err = w.Write(append(b, '\n'))
		return err
	}
	if err := verdict.WriteText(w, res.Report); err != nil {
		return err
	}
	for _, p := range res.ServicePorts {
		if err := p.writeText(w, res.WindowSeconds); err != nil {
			return err
		}
	}
	return nil
}

func (p servicePort) writeText(w io.Writer, window float64) error {
	var b strings.Builder
	fmt.Fprintf(&b, "\nservice %s", p.Service)
	if len(p.ClusterIPs) > 0 {
		fmt.Fprintf(&b, ", cluster IP %s", strings.Join(p.ClusterIPs, ", "))
	}
	fmt.Fprintf(&b, ": %d endpoints in the API for this node, %d programmed", len(p.Expected), len(p.Programmed))
	if len(p.Missing)+len(p.Stale) > 0 {
		fmt.Fprintf(&b, " (now %d missing, %d stale)", len(p.Missing), len(p.Stale))
	}
	b.WriteString("\n")
	var table bytes.Buffer
	tw := tabwriter.NewWriter(&table, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  endpoint\tAPI\trules\t")
	all := slices.Concat(p.Expected, p.Stale)
	slices.SortFunc(all, func(a, b string) int {
		return netip.MustParseAddrPort(a).Compare(netip.MustParseAddrPort(b))
	})
	for _, ep := range slices.Compact(all) {
		api, prog := "yes", "yes"
		var notes []string
		if slices.Contains(p.Missing, ep) {
			if !slices.Contains(p.Programmed, ep) {
				prog = "-"
			}
			notes = append(notes, "missing"+p.chainsWhere(ep, func(c chainSide) []string { return c.Missing }, "from"))
		}
		if slices.Contains(p.Stale, ep) {
			if !slices.Contains(p.Expected, ep) {
				api = "-"
			}
			notes = append(notes, "stale"+p.chainsWhere(ep, func(c chainSide) []string { return c.Stale }, "in"))
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", ep, api, prog, strings.Join(notes, ", "))
	}
	tw.Flush()
	for line := range strings.Lines(table.String()) {
		b.WriteString(strings.TrimRight(line, " \n") + "\n")
	}
	if len(p.Chains) > 0 {
		fmt.Fprintf(&b, "  chains: %s\n", strings.Join(p.Chains, ", "))
	} else {
		b.WriteString("  chains: none found in the rules\n")
	}
	if len(p.UnrepliedFlows) == 0 {
		b.WriteString("  unreplied flows: none\n")
	}
	for _, u := range p.UnrepliedFlows {
		fmt.Fprintf(&b, "  unreplied flows, %s: %d ended unreplied in the last %s, %d waiting for a reply now\n",
			u.Reason, u.Ended, verdict.FormatDuration(time.Duration(window*float64(time.Second))), u.Open)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// notCheckedMessage says, for stderr, what could not be checked.
func notCheckedMessage(r verdict.Report) string {
	var b strings.Builder
	b.WriteString("proxyhealth diagnose: could not check everything:\n")
	for _, n := range r.NotChecked {
		causes := make([]string, 0, len(n.Causes))
		for _, c := range n.Causes {
			causes = append(causes, string(c))
		}
		fmt.Fprintf(&b, "  %s: %s\n", strings.Join(causes, ", "), n.Reason)
	}
	return b.String()
}

// runDiagnose builds the collectors the exporter's flags enable, looks at the node once and
// prints the result; it returns the exit code.
func runDiagnose(ctx context.Context, cfg diagnoseConfig, flags *collectorFlags, logger *slog.Logger, stdout, stderr io.Writer) int {
	fail := func(err error) int {
		fmt.Fprintf(stderr, "proxyhealth diagnose: cannot diagnose: %v\n", err)
		return exitCannotDiagnose
	}
	if err := cfg.validate(); err != nil {
		return fail(err)
	}
	flags.api.logger, flags.host.logger = logger, logger
	// The drift check's grace period is the window, and it compares at least every
	// driftCheckInterval; only the --service Service is looked at closely.
	flags.rules.CheckInterval, flags.rules.GracePeriod, flags.rules.MaxSeries = driftCheckInterval, cfg.Window, 1
	built, err := flags.build(logger)
	// Collectors that changed the node put it back when diagnose ends, as the exporter's do.
	defer built.Close(logger)
	if err != nil {
		if be, ok := errors.AsType[*buildError](err); ok {
			err = fmt.Errorf("build the %s collector: %w", be.collector, be.err)
		}
		return fail(err)
	}
	d := newDiagnosis(cfg, built, flags.api.cfg.NodeName)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	res, err := d.run(ctx)
	if err != nil {
		return fail(err)
	}
	if err := res.write(stdout, cfg.Output); err != nil {
		return fail(err)
	}
	code := exitCode(res.Report)
	if code == exitCannotDiagnose {
		io.WriteString(stderr, notCheckedMessage(res.Report))
	}
	return code
}

// newDiagnosis looks at the node through the collectors built as the exporter would, but
// kube-proxy is asked at the window's ends and its log read back rather than followed.
func newDiagnosis(cfg diagnoseConfig, built *builtCollectors, nodeName string) *diagnosis {
	d := &diagnosis{
		cfg:   cfg,
		src:   sourcesOf(built, nodeName),
		sleep: sleepCtx,
	}
	d.start = func(ctx context.Context) {
		built.startReaders(ctx)
		for _, c := range built.named() {
			if c.runner != nil && c.name != kubeproxy.Name { // kube-proxy is asked, not followed
				go c.runner.Run(ctx)
			}
		}
	}
	d.ready = func(ctx context.Context) { waitReady(ctx, cfg.SyncTimeout, d.src) }
	if kp := built.kubeproxy; kp != nil {
		d.pollKubeProxy = kp.Poll
		d.scanLog = func(since time.Time) kubeproxy.LogScan { return kp.ScanLog(since, maxLogScanBytes) }
	}
	if rc := built.rules; rc != nil {
		d.driftReady = func() time.Time {
			if lc := rc.LastCheck(); lc.Compared && lc.Fresh && lc.Err == nil {
				return lc.At
			}
			return time.Time{}
		}
		settle := min(maxDriftSettle, built.api.ProbeCycle()+driftCheckInterval)
		d.driftSettled = func(ctx context.Context, from time.Time) error {
			return waitDriftSettled(ctx, rc, from.Add(cfg.Window), settle)
		}
		d.service = func(namespace, name string) ([]rules.PortEndpoints, error) {
			if built.api == nil || !built.api.Snapshot().Synced {
				return nil, errors.New("--service: the API view has not synced")
			}
			return rules.ServiceEndpoints(built.api.Snapshot(), built.host.State(), namespace, name), nil
		}
	}
	return d
}

// waitReady waits, at most timeout, until what the window starts from is there: the node's
// rules read, the API view fresh (when one is configured), the drift check run on it, and the
// conntrack listener subscribed.
func waitReady(ctx context.Context, timeout time.Duration, src *factSources) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		ready := true
		if src.host != nil && src.host.State() == nil {
			ready = false
		}
		if src.api != nil && src.api.Configured() && !src.api.Snapshot().Fresh {
			ready = false
		}
		if src.rules != nil && src.api != nil && src.api.Snapshot().Fresh {
			if lc := src.rules.LastCheck(); lc.At.IsZero() || !lc.Compared {
				ready = false
			}
		}
		if src.conntrack != nil && errors.Is(src.conntrack.Flows().Err, conntrack.ErrNotListening) {
			ready = false
		}
		if ready || sleepCtx(ctx, 100*time.Millisecond) != nil {
			return
		}
	}
}

// driftCheckInterval is how often diagnose's drift check compares at least.
const driftCheckInterval = time.Second

// maxDriftSettle bounds the wait for the drift check at the window's end: with the default
// --api.probe-interval (15s), the next probe of the API view and its timeout take longer.
const maxDriftSettle = 15 * time.Second

// waitDriftSettled waits until the drift check ran at or after until with its API view
// confirmed current, so that every difference it counts lasted the whole window; at most
// within more: the time the view takes to prove itself current, or fail to (the next probe
// of the API and its timeout, then a check), no more than maxDriftSettle.
func waitDriftSettled(ctx context.Context, rc *rules.Collector, until time.Time, within time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	for {
		lc := rc.LastCheck()
		if !lc.At.Before(until) && lc.Compared && !lc.Unconfirmed {
			return nil
		}
		if sleepCtx(ctx, 100*time.Millisecond) != nil {
			if lc.Unconfirmed {
				return errors.New("the API view could not be confirmed current at the end of the window: differences from kube-proxy's rules were not judged")
			}
			return errors.New("the drift check did not run at the end of the window")
		}
	}
}

// diagnoseLogger logs to stderr, errors only unless --log.level was given: the
// findings are the output.
func diagnoseLogger(args []string, cfg *promslog.Config) *slog.Logger {
	given := slices.ContainsFunc(args, func(a string) bool { return a == "--log.level" || strings.HasPrefix(a, "--log.level=") })
	if !given {
		cfg.Level = promslog.NewLevel()
		_ = cfg.Level.Set("error")
	}
	cfg.Writer = os.Stderr
	return promslog.New(cfg)
}
