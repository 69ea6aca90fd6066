// Package rules is the rules collector: it compares, per Service port, the endpoints
// kube-proxy programmed on this node with those the API says it should have (incident 3:
// kube-proxy's list/watch silently failing while its rules keep yesterday's endpoints). The
// comparison runs in the background whenever the rules (internal/hostrules) or the API view
// change; a scrape reads its last result.
package rules

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/prometheus/client_golang/prometheus"

	phcollectors "github.com/proxyhealth/proxyhealth/collectors"
	"github.com/proxyhealth/proxyhealth/internal/cluster"
	"github.com/proxyhealth/proxyhealth/internal/hostrules"
	"github.com/proxyhealth/proxyhealth/internal/metricdesc"
)

// Name is the collector's name (--[no-]collector.rules).
const Name = "rules"

// Rules is where the collector reads kube-proxy's programmed rules: the exporter's one reader
// of the node's netfilter state (*hostrules.Source), or a fake in tests.
type Rules interface {
	// State returns the last read, nil before the first.
	State() *hostrules.State
	// Subscribe returns a channel that receives a value after each new read.
	Subscribe() <-chan struct{}
}

// LaggingRules is Rules whose last read may lag the node's rules for a while: the
// iptables-legacy tables, which announce no change, are read on kube-proxy's word at most so
// often (*hostrules.Source).
type LaggingRules interface {
	// Behind returns since when the last read may lag the node's rules; zero when it does
	// not, as far as is known.
	Behind() time.Time
	// CatchUp asks for a read of what the last one may lag, now.
	CatchUp()
}

// Config holds the collector's settings; AddFlags binds them to command-line flags.
type Config struct {
	View  cluster.View // the API view (required)
	Rules Rules        // the node's netfilter state

	CheckInterval time.Duration
	GracePeriod   time.Duration
	MaxSeries     int
	// MinCheckGap is the least time between two comparisons (AddFlags sets it; not a flag);
	// zero compares as soon as told.
	MinCheckGap time.Duration
	// Now is the clock; nil is time.Now. A field rather than a setting, with no default in
	// AddFlags: it exists only so that tests can fix the time drift is measured by.
	Now func() time.Time
}

// AddFlags registers the collector's flags on app.
func (c *Config) AddFlags(app *kingpin.Application) {
	app.Flag("rules.check-interval", "Longest time between two comparisons of kube-proxy's rules with the API. A comparison also runs whenever either changes, and when a difference reaches the grace period.").
		Default("30s").DurationVar(&c.CheckInterval)
	app.Flag("rules.grace-period", "How long an endpoint may differ between kube-proxy's rules and the API before it counts as drift (kube-proxy's sync lag must not page anyone).").
		Default("60s").DurationVar(&c.GracePeriod)
	app.Flag("rules.max-service-series", "Most drifting service ports given their own proxyhealth_service_drift_endpoints series; the rest are counted in proxyhealth_rules_drift_unlisted.").
		Default("100").IntVar(&c.MaxSeries)
	// Not a flag: under churn the rules and the API change many times a second, and one
	// comparison of 10,000 service ports costs about 15 ms.
	c.MinCheckGap = time.Second
	// Rules are no longer read by a command; kept so that existing command lines still parse.
	app.Flag("rules.command-timeout", "Deprecated and ignored: the rules are read in-process.").Hidden().Duration()
}

func (c *Config) validate() error {
	var noRules, noView error
	if c.Rules == nil {
		noRules = errors.New("rules collector: no netfilter reader")
	}
	if c.View == nil {
		noView = errors.New("rules collector: no API view")
	}
	return errors.Join(
		phcollectors.Positive("rules.check-interval", c.CheckInterval),
		phcollectors.NotNegative("rules.grace-period", c.GracePeriod),
		phcollectors.NotNegative("rules.max-service-series", c.MaxSeries),
		noRules, noView,
	)
}

// Collector is the rules collector.
type Collector struct {
	cfg    Config
	logger *slog.Logger
	engine *driftEngine
	now    func() time.Time
	// askedToConfirm is set by a check that asked the view or the rules to prove themselves
	// current; Run's own.
	askedToConfirm bool

	mu          sync.Mutex
	checkErrors uint64
	last        *checkResult // nil until the first check
	lastNote    string
	lastRules   uint64 // the hostrules.State.Seq last compared
}

// New builds the collector; it compares nothing until Run.
func New(cfg Config, logger *slog.Logger) (*Collector, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	return &Collector{
		cfg:    cfg,
		logger: logger,
		engine: newDriftEngine(cfg.GracePeriod),
		now:    now,
	}, nil
}

var _ phcollectors.Runner = (*Collector)(nil)

// Run compares whenever the rules or the API view change, when a difference comes of age, and
// at least every CheckInterval, until ctx is done. Comparisons are at least MinCheckGap apart,
// so a burst of changes costs one.
func (c *Collector) Run(ctx context.Context) {
	rulesChanged := c.cfg.Rules.Subscribe()
	var viewChanged <-chan struct{}
	if n, ok := c.cfg.View.(cluster.Notifier); ok {
		viewChanged = n.Subscribe()
	}
	timer := time.NewTimer(0)
	defer timer.Stop()
	skippedGap := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-rulesChanged:
		case <-viewChanged:
		case <-timer.C:
		}
		started := c.now()
		c.askedToConfirm = false
		next, ran := c.check()
		// Wait for the next change, or the next deadline, but at least MinCheckGap; except
		// that the answer to a check's request for proof (the view's probe, the rules'
		// read) is compared at once: a drift that came of age is then reported a second
		// sooner. Never twice in a row, so a request answered at once cannot spin the loop.
		wait := c.cfg.CheckInterval
		if !next.IsZero() {
			wait = min(wait, next.Sub(c.now()))
		}
		skip := c.askedToConfirm && !skippedGap
		skippedGap = skip
		if gap := c.cfg.MinCheckGap - c.now().Sub(started); gap > 0 && ran && !skip {
			select {
			case <-ctx.Done():
				return
			case <-time.After(gap):
			}
			wait -= gap
		}
		timer.Reset(max(wait, 0))
	}
}

// check runs one comparison and publishes it. It returns when a difference seen now comes of
// age (zero when none is pending), for Run to check again then, and whether it ran at all (not
// before the rules' first read).
func (c *Collector) check() (time.Time, bool) {
	start := c.now()
	snap := c.cfg.View.Snapshot()
	st := c.cfg.Rules.State()
	if st == nil {
		return time.Time{}, false // not read yet: nothing to say, and nothing wrong
	}
	var res checkResult
	switch {
	case st.ProxyErr != nil && len(st.Proxy) == 0 && st.IPVS == nil:
		res = checkResult{at: start, err: fmt.Errorf("read kube-proxy's rules: %w", st.ProxyErr)}
		if st.Mode == hostrules.ModeIPVS {
			// The mode is known (kube-ipvs0) though IPVS cannot be read (no ip_vs, or no
			// CAP_NET_ADMIN): said, with the error. The grace periods start anew once it can.
			res.mode = st.Mode
			c.engine.check(&cluster.Snapshot{}, nil, start)
		}
	case comparable(st):
		var behind time.Time
		if lr, ok := c.cfg.Rules.(LaggingRules); ok {
			behind = lr.Behind()
		}
		res = c.engine.checkBehind(snap, programmedByFamily(st), behind, start)
		if res.rulesUnconfirmed {
			// A difference came of age, but kube-proxy may have changed its rules since the
			// last read: read them now rather than at the reader's next turn.
			c.cfg.Rules.(LaggingRules).CatchUp()
			c.askedToConfirm = true
		}
		res.mode = st.Mode
		if st.ProxyErr != nil {
			res.err = fmt.Errorf("read kube-proxy's rules in part: %w", st.ProxyErr)
		}
	default:
		// Nothing to compare: the engine's grace periods start anew if rules appear.
		c.engine.check(&cluster.Snapshot{}, nil, start)
		res = checkResult{at: start, mode: st.Mode, fresh: snap.Fresh}
	}
	res.duration = c.now().Sub(start)
	c.noteMode(st)
	c.publish(&res)
	if res.viewUnconfirmed {
		// A difference came of age, but the view was last heard from before that: ask it
		// to prove itself now rather than wait for its next probe.
		if cf, ok := c.cfg.View.(cluster.Confirmer); ok {
			cf.Confirm()
			c.askedToConfirm = true
		}
	}
	return res.nextDeadline, true
}

// noteMode logs once, and again on a change, what this node's rules allow.
func (c *Collector) noteMode(st *hostrules.State) {
	var note string
	switch st.Mode {
	case hostrules.ModeIPVS:
		note = "kube-proxy is in IPVS mode (kube-ipvs0 exists): checking drift of its virtual servers"
	case hostrules.ModeIPTables, hostrules.ModeNFTables:
		families := "IPv4"
		switch {
		case st.Proxy[false] != nil && st.Proxy[true] != nil:
			families = "IPv4 and IPv6"
		case st.Proxy[true] != nil:
			families = "IPv6"
		}
		note = fmt.Sprintf("kube-proxy is in %s mode (%s, %s): checking drift", st.Mode, st.Backend, families)
	default:
		note = "no kube-proxy rules on this node (no KUBE-SERVICES chain, no kube-proxy nftables table): a kube-proxy replacement or no kube-proxy; the drift check is idle"
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if note != c.lastNote {
		c.logger.Info(note)
		c.lastNote = note
	}
}

// stalled says why the comparison cannot be trusted to be current: the check loop, which goes
// round at least every CheckInterval, has not for three; or the netfilter reader is stuck.
func (c *Collector) stalled(res *checkResult) error {
	if since := c.now().Sub(res.at); since > 3*c.cfg.CheckInterval+c.cfg.MinCheckGap {
		return fmt.Errorf("the drift check is stuck: last ran %v ago (--rules.check-interval %v)", since.Round(time.Second), c.cfg.CheckInterval)
	}
	if s, ok := c.cfg.Rules.(interface{ Stalled() error }); ok {
		return s.Stalled()
	}
	return nil
}

func (c *Collector) publish(res *checkResult) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if res.err != nil {
		c.checkErrors++
	}
	c.last = res
}

var (
	modeDesc = metricdesc.New("", "proxy_mode",
		"kube-proxy's mode on this node, found from its rules: 1 for the mode in use (iptables, nftables, ipvs, or none when there are no kube-proxy rules).", "mode")
	servicesCheckedDesc = metricdesc.New("rules", "services_checked", "Service ports whose programmed endpoints were compared with the API in the last check (0 while the exporter's API view is not fresh).")
	servicesDriftedDesc = metricdesc.New("rules", "services_drifted", "Service ports with endpoints that have differed between kube-proxy's rules and the API for longer than --rules.grace-period.")
	endpointsStaleDesc  = metricdesc.New("rules", "endpoints_stale", "Endpoints that one of a service port's chains (or IPVS virtual servers) in kube-proxy's rules holds though the API does not give them to it, past the grace period; each counts once per service port, over all service ports. A real server kube-proxy keeps at weight 0 while its connections drain is not stale.")
	endpointsMissDesc   = metricdesc.New("rules", "endpoints_missing", "Endpoints that the API gives to one of a service port's chains (or IPVS virtual servers) though it does not hold them in kube-proxy's rules (one held by the cluster chain but not by the local chain is missing), past the grace period; each counts once per service port, over all service ports.")
	serviceDriftDesc    = metricdesc.New("", "service_drift_endpoints",
		"Endpoints of one drifting service port that are stale (held by one of its chains in the rules, not given to that chain by the API) or missing (given to one of its chains by the API, not held by that chain in the rules) past the grace period, each counted once per kind. Only drifting service ports have series, at most --rules.max-service-series.", "service_namespace", "service_name", "service_port", "protocol", "kind")
	driftUnlistedDesc = metricdesc.New("rules", "drift_unlisted", "Drifting service ports left out of proxyhealth_service_drift_endpoints by --rules.max-service-series.")
	driftAgeDesc      = metricdesc.New("rules", "drift_age_seconds", "How long the oldest current drift has lasted (0 when none).")
	orphanChainsDesc  = metricdesc.New("rules", "orphan_chains", "kube-proxy service port chains (iptables KUBE-SVC-*, KUBE-SVL-*; nftables service-*, local-* with rules), or IPVS virtual servers, that no Service port in the API accounts for: rules left for deleted Services.")
	checkDurationDesc = metricdesc.New("rules", "check_duration_seconds", "How long the last drift check took (reading the rules and comparing).")
	lastCheckDesc     = metricdesc.New("rules", "last_check_timestamp_seconds", "When the last drift check ran.")
	checkErrorsDesc   = metricdesc.New("rules", "check_errors_total", "Drift checks that failed to read kube-proxy's rules or the API view.")
)

// Describe sends every descriptor Update may use.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{modeDesc, servicesCheckedDesc, servicesDriftedDesc, endpointsStaleDesc,
		endpointsMissDesc, serviceDriftDesc, driftUnlistedDesc, driftAgeDesc, orphanChainsDesc, checkDurationDesc,
		lastCheckDesc, checkErrorsDesc} {
		ch <- d
	}
}

// Update publishes the last check and the API view's freshness.
func (c *Collector) Update(ch chan<- prometheus.Metric) error {
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	var viewErr error
	snap := c.cfg.View.Snapshot()
	fresh := snap.Fresh
	if !snap.Fresh {
		// A stale own view is its own signal, never a false "kube-proxy is stale".
		viewErr = errors.New("the exporter's API view is not fresh, so drift is not reported")
		if r, ok := c.cfg.View.(cluster.ErrorReporter); ok {
			if err := r.LastError(); err != nil {
				viewErr = fmt.Errorf("%w: %w", viewErr, err)
			}
		}
	}

	c.mu.Lock()
	res, errorsTotal := c.last, c.checkErrors
	c.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(checkErrorsDesc, prometheus.CounterValue, float64(errorsTotal))
	if res == nil {
		return viewErr // no check yet
	}
	gauge(lastCheckDesc, float64(res.at.UnixNano())/1e9)
	gauge(checkDurationDesc, res.duration.Seconds())
	if err := c.stalled(res); err != nil {
		return err
	}
	if res.err != nil && res.mode == "" {
		return res.err
	}
	for _, m := range hostrules.Modes {
		gauge(modeDesc, boolFloat(m == res.mode), m)
	}
	drifting, checked := res.drifting, res.checked
	if !fresh {
		// The view went stale since the check: what it found cannot be trusted now.
		drifting, checked = nil, 0
	}
	var stale, missing int
	oldest := res.at
	for _, d := range drifting {
		stale += d.stale
		missing += d.missing
		if d.since.Before(oldest) {
			oldest = d.since
		}
	}
	gauge(servicesCheckedDesc, float64(checked))
	gauge(servicesDriftedDesc, float64(len(drifting)))
	gauge(endpointsStaleDesc, float64(stale))
	gauge(endpointsMissDesc, float64(missing))
	gauge(driftAgeDesc, c.now().Sub(oldest).Seconds()*boolFloat(len(drifting) > 0))
	gauge(orphanChainsDesc, float64(res.orphans))
	listed := min(len(drifting), c.cfg.MaxSeries)
	for _, d := range drifting[:listed] {
		port := strconv.Itoa(int(d.port))
		proto := strings.ToLower(d.name.Protocol)
		if d.stale > 0 {
			gauge(serviceDriftDesc, float64(d.stale), d.name.Namespace, d.name.Name, port, proto, "stale")
		}
		if d.missing > 0 {
			gauge(serviceDriftDesc, float64(d.missing), d.name.Namespace, d.name.Name, port, proto, "missing")
		}
	}
	gauge(driftUnlistedDesc, float64(len(drifting)-listed))
	return errors.Join(res.err, viewErr)
}

func boolFloat(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
