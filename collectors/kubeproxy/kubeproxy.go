// Package kubeproxy is the kube-proxy collector (docs/design.md, incident 3: kube-proxy's list/watch
// of Services and EndpointSlices failing for days while its /healthz stays green). It has two
// background loops whose last results a scrape reads:
//
//   - a log follower that reads kube-proxy's log as it grows (the kubelet's CRI pod logs, or a
//     plain file) and counts the reflector failures client-go logs there, per resource and verb;
//   - a poller of kube-proxy's metrics and health endpoints, which tells whether kube-proxy
//     answers, what it says of itself, and whether a queued change has waited unapplied.
//
// A scrape never waits on kube-proxy or on a file: the poller uses a short timeout and runs every
// few seconds, so a hung kube-proxy costs a scrape nothing and its state is at most one poll old.
package kubeproxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/prometheus/client_golang/prometheus"

	phcollectors "github.com/proxyhealth/proxyhealth/collectors"
	"github.com/proxyhealth/proxyhealth/internal/metricdesc"
	"github.com/proxyhealth/proxyhealth/internal/periodic"
	"github.com/proxyhealth/proxyhealth/internal/proxyversion"
)

// Name is the collector's name (--[no-]collector.kubeproxy).
const Name = "kubeproxy"

// DefaultLogPaths are where kube-proxy's log is on a node: the kubelet's pod log of a
// kube-proxy DaemonSet (kubeadm and most distributions), or a file of a kube-proxy run as a
// system service.
var DefaultLogPaths = []string{
	"/var/log/pods/kube-system_kube-proxy-*/kube-proxy/*.log",
	"/var/log/kube-proxy.log",
}

// Config configures the collector.
type Config struct {
	LogPaths        []string // files or globs
	LogPollInterval time.Duration
	LogRescan       time.Duration // how often the globs are expanded again
	LogMaxLineBytes int
	MetricsURL      string
	HealthURL       string
	PollInterval    time.Duration
	RequestTimeout  time.Duration
	// OnSync, when set, is called after a poll finds that kube-proxy applied a sync since the
	// last poll that may have changed its Service rules (syncs.go): the exporter's netfilter
	// reader then reads the legacy tables, whose changes the kernel does not announce.
	OnSync func()
	// OnVersion, when set, is called with kube-proxy's version when a poll finds it changed
	// (the unknown version when kube-proxy reports none, or one without version information):
	// the API view computes what kube-proxy programs the way that version does.
	OnVersion func(proxyversion.Version)

	// Now is the clock kube-proxy's sync times and undated log lines are measured by; nil
	// means time.Now.
	Now func() time.Time
}

// AddFlags adds the collector's flags to app.
func (c *Config) AddFlags(app *kingpin.Application) {
	app.Flag("kubeproxy.log-path", "kube-proxy log file or glob to follow (repeatable; replaces the defaults). Paths are the host's: in a container, mount the host's /var/log at /var/log (read-only). Default: "+strings.Join(DefaultLogPaths, ", ")+".").
		PlaceHolder("PATH").Default(DefaultLogPaths...).StringsVar(&c.LogPaths)
	app.Flag("kubeproxy.log-poll-interval", "How often kube-proxy's log files are read for new lines.").
		Default("1s").DurationVar(&c.LogPollInterval)
	app.Flag("kubeproxy.log-rescan-interval", "How often the log globs are expanded again to find new files (a rotation is noticed at once).").
		Default("10s").DurationVar(&c.LogRescan)
	app.Flag("kubeproxy.log-max-line-bytes", "Longest kube-proxy log line read; longer lines are skipped and counted in proxyhealth_kubeproxy_log_lines_skipped_total.").
		Default("65536").IntVar(&c.LogMaxLineBytes)
	app.Flag("kubeproxy.metrics-url", "kube-proxy's metrics endpoint (its --metrics-bind-address).").
		Default("http://127.0.0.1:10249/metrics").StringVar(&c.MetricsURL)
	app.Flag("kubeproxy.health-url", "kube-proxy's health endpoint (its --healthz-bind-address). /livez is asked first, /healthz when it answers 404 (older kube-proxy versions have no /livez; /healthz also fails while the node is being deleted, /livez does not); empty turns the health check off.").
		Default("http://127.0.0.1:10256/livez").StringVar(&c.HealthURL)
	app.Flag("kubeproxy.poll-interval", "How often kube-proxy's metrics and health endpoints are polled (never during a scrape).").
		Default("5s").DurationVar(&c.PollInterval)
	app.Flag("kubeproxy.timeout", "Timeout of each request to kube-proxy.").
		Default("1s").DurationVar(&c.RequestTimeout)
}

func (c *Config) validate() error {
	errs := []error{
		phcollectors.Positive("kubeproxy.log-poll-interval", c.LogPollInterval),
		phcollectors.Positive("kubeproxy.log-rescan-interval", c.LogRescan),
		phcollectors.AtLeast("kubeproxy.log-max-line-bytes", c.LogMaxLineBytes, 256),
		phcollectors.Positive("kubeproxy.poll-interval", c.PollInterval),
		phcollectors.Positive("kubeproxy.timeout", c.RequestTimeout),
	}
	for _, p := range c.LogPaths {
		if _, err := filepath.Match(p, ""); err != nil {
			errs = append(errs, fmt.Errorf("--kubeproxy.log-path %q: %w", p, err))
		}
	}
	if _, err := url.Parse(c.MetricsURL); err != nil || c.MetricsURL == "" {
		errs = append(errs, fmt.Errorf("--kubeproxy.metrics-url %q is not a URL", c.MetricsURL))
	}
	if _, err := url.Parse(c.HealthURL); err != nil {
		errs = append(errs, fmt.Errorf("--kubeproxy.health-url %q: %w", c.HealthURL, err))
	}
	return errors.Join(errs...)
}

// Collector is the kube-proxy collector.
type Collector struct {
	cfg    Config
	logger *slog.Logger
	prober *prober
	now    func() time.Time
	syncs  syncWatch // the poller's own: which of kube-proxy's syncs may have changed rules

	mu sync.Mutex
	// failures follows kube-proxy's failed syncs; the poller writes it, Status reads it.
	failures   failureWatch
	logs       followStats
	logsRead   bool // the follower has polled at least once
	probe      *probeResult
	upNote     string
	healthNote string
	scanNote   string
	// version is the version kube-proxy last reported while it answered ("" for none); it
	// stays while kube-proxy does not answer. versionSeen: a poll has answered.
	version     string
	versionSeen bool
}

// New builds the collector; it opens and asks nothing until Run.
func New(cfg Config, logger *slog.Logger) (*Collector, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	c := &Collector{
		cfg:    cfg,
		logger: logger,
		prober: newProber(cfg.MetricsURL, cfg.HealthURL, cfg.RequestTimeout),
		now:    time.Now,
	}
	if cfg.Now != nil {
		c.now = cfg.Now
	}
	return c, nil
}

var _ phcollectors.Runner = (*Collector)(nil)

// Run follows the logs and polls kube-proxy until ctx is done.
func (c *Collector) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() { c.runFollower(ctx) })
	wg.Go(func() { periodic.Every(ctx, c.cfg.PollInterval, func() { c.pollOnce(ctx) }) })
	wg.Wait()
}

func (c *Collector) newFollower() *follower {
	fl := newFollower(c.cfg.LogPaths, c.cfg.LogMaxLineBytes, c.cfg.LogRescan, c.logger)
	fl.now = c.now
	fl.publish = func(s followStats) {
		c.mu.Lock()
		c.logs, c.logsRead = s, true
		c.mu.Unlock()
	}
	return fl
}

func (c *Collector) runFollower(ctx context.Context) {
	fl := c.newFollower()
	defer fl.close()
	periodic.Every(ctx, c.cfg.LogPollInterval, fl.poll)
}

// pollOnce asks kube-proxy once and publishes the answer.
func (c *Collector) pollOnce(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 2*c.cfg.RequestTimeout+time.Second)
	defer cancel()
	res := c.prober.probe(ctx, c.now())
	if ctx.Err() != nil && errors.Is(context.Cause(ctx), context.Canceled) {
		return // shutting down
	}
	c.note(&res)
	c.mu.Lock()
	prev := c.probe
	c.probe = &res
	c.failures.observe(&res)
	versionChanged := res.up && (!c.versionSeen || res.version != c.version)
	if res.up {
		c.version, c.versionSeen = res.version, true
	}
	c.mu.Unlock()
	if versionChanged {
		v := c.noteVersion(res.version)
		if c.cfg.OnVersion != nil {
			c.cfg.OnVersion(v)
		}
	}
	// A sync of any IP family: each family's proxier syncs only for its own changes.
	newSync := !res.newestSync.IsZero() && prev != nil && !prev.newestSync.IsZero() && !res.newestSync.Equal(prev.newestSync)
	if c.syncs.observe(&res, newSync) && c.cfg.OnSync != nil {
		c.cfg.OnSync()
	}
}

// note logs once, and again on a change, whether kube-proxy answers and what it says.
func (c *Collector) note(res *probeResult) {
	var up, health string
	switch {
	case !res.up:
		up = "kube-proxy's metrics endpoint does not answer: proxyhealth_kubeproxy_up is 0 (kube-proxy absent, replaced, or on another address: see --kubeproxy.metrics-url)"
	default:
		up = "kube-proxy's metrics endpoint answers"
	}
	switch {
	case c.cfg.HealthURL == "":
	case res.healthy:
		health = "kube-proxy says it is healthy on " + res.healthPath
	case !res.healthAnswered:
		health = "kube-proxy's health endpoint does not answer: proxyhealth_kubeproxy_healthy is 0 (see --kubeproxy.health-url)"
	default:
		health = "kube-proxy is not healthy on " + res.healthPath
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if up != c.upNote {
		if res.up {
			c.logger.Info(up, "url", c.cfg.MetricsURL)
		} else {
			c.logger.Info(up, "url", c.cfg.MetricsURL, "reason", res.upReason)
		}
		c.upNote = up
	}
	if health != c.healthNote {
		if res.healthy || health == "" {
			c.logger.Info(health)
		} else {
			c.logger.Info(health, "reason", res.healthReason)
		}
		c.healthNote = health
	}
	if scan := scanNote(res); scan != c.scanNote {
		switch {
		case scan != "":
			c.logger.Warn(scan, "url", c.cfg.MetricsURL, "lines", res.scan.lines, "long_lines", res.scan.longLines,
				"long_lines_read", res.scan.longLinesRead, "ip_family_samples_left_out", res.scan.droppedFamilies)
		case res.up:
			c.logger.Info("kube-proxy's metrics are read whole again", "url", c.cfg.MetricsURL)
		}
		c.scanNote = scan
	}
}

// noteVersion logs kube-proxy's version, which changed (polls are sequential), and says
// when proxyhealth is not tested with it; it returns the version parsed.
func (c *Collector) noteVersion(reported string) proxyversion.Version {
	v, ok := proxyversion.Parse(reported)
	switch {
	case reported == "":
		c.logger.Warn("kube-proxy reports no version (no kubernetes_build_info in its metrics): what it programs is computed as the newest tested version does",
			"tested", proxyversion.TestedRange(), "as", proxyversion.NewestTested.String())
	case !ok:
		c.logger.Warn("kube-proxy's version is not known (a build without version information?): what it programs is computed as the newest tested version does",
			"version", reported, "tested", proxyversion.TestedRange(), "as", proxyversion.NewestTested.String())
	case !v.Tested():
		c.logger.Warn("kube-proxy's version is outside the versions proxyhealth is tested with: drift may be misjudged where kube-proxy changed how it picks endpoints",
			"version", reported, "tested", proxyversion.TestedRange())
	default:
		c.logger.Info("kube-proxy's version", "version", reported)
	}
	return v
}

// scanNote says what a poll could not read of kube-proxy's metrics, if anything.
func scanNote(res *probeResult) string {
	if !res.up {
		return ""
	}
	var parts []string
	if res.scan.truncated {
		parts = append(parts, fmt.Sprintf("kube-proxy's metrics go on past %d MiB: the rest is not read", maxMetricsBodyBytes>>20))
	}
	if res.scan.longLinesRead > 0 {
		parts = append(parts, fmt.Sprintf("lines of the kube-proxy metrics read here are longer than %d KiB and were skipped", metricsLineBytes>>10))
	} else if res.scan.longLines > 0 {
		parts = append(parts, fmt.Sprintf("lines of kube-proxy's metrics longer than %d KiB were skipped (none of the metrics read here)", metricsLineBytes>>10))
	}
	if res.scan.droppedFamilies > 0 {
		parts = append(parts, fmt.Sprintf("kube-proxy's sync timestamps have more than %d ip_family values: the others are left out", maxIPFamilies))
	}
	return strings.Join(parts, "; ")
}

var (
	listErrorsDesc = metricdesc.New("kubeproxy", "list_errors_total",
		"Reflector (list/watch) failures in kube-proxy's log since the exporter started, per resource (services, endpoints, endpointslices, nodes, servicecidrs, other) and verb (list or watch, from the inner error: a \"Failed to watch\" whose error says \"failed to list\" is a list failure). Lines written before the exporter started are not counted.", "resource", "verb")
	lastListErrorDesc = metricdesc.New("kubeproxy", "last_list_error_timestamp_seconds",
		"Time of the last reflector failure read from kube-proxy's log (from the line's CRI or klog time when readable, else when it was read); absent until one is read.")
	logLinesDesc = metricdesc.New("kubeproxy", "log_lines_total",
		"Lines read from kube-proxy's log files.")
	logSkippedDesc = metricdesc.New("kubeproxy", "log_lines_skipped_total",
		"kube-proxy log lines (or joined CRI partial records) longer than --kubeproxy.log-max-line-bytes, skipped unread.")
	logFilesDesc = metricdesc.New("kubeproxy", "log_files_followed",
		"kube-proxy log files followed now (matched by --kubeproxy.log-path); 0 when none is found, which is not a failure.")
	upDesc = metricdesc.New("kubeproxy", "up",
		"1 when kube-proxy's metrics endpoint (--kubeproxy.metrics-url) answered the last poll with its metrics, 0 when it did not (kube-proxy absent, down, or on another address).")
	healthyDesc = metricdesc.New("kubeproxy", "healthy",
		"kube-proxy's own verdict on its health: 1 when --kubeproxy.health-url (/livez) answered 200 at the last poll, or /healthz on versions without /livez. /healthz also fails while the node is being deleted, /livez does not. kube-proxy stays healthy while its API watches fail (incident 3).")
	lastSyncAgeDesc = metricdesc.New("kubeproxy", "last_sync_age_seconds",
		"Now minus kube-proxy's kubeproxy_sync_proxy_rules_last_timestamp_seconds (its last applied rules sync; the oldest IP family). A quiet node syncs only hourly, so an old sync alone is no fault.")
	syncPendingDesc = metricdesc.New("kubeproxy", "sync_pending_seconds",
		"How long a queued change has waited unapplied: now minus kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds when that is ahead of its last applied sync, else 0. Growing means kube-proxy is stuck.")
	endpointsPendingDesc = metricdesc.New("kubeproxy", "endpoint_changes_pending",
		"Endpoint changes kube-proxy has received but not yet applied (kubeproxy_sync_proxy_rules_endpoint_changes_pending).")
	servicesPendingDesc = metricdesc.New("kubeproxy", "service_changes_pending",
		"Service changes kube-proxy has received but not yet applied (kubeproxy_sync_proxy_rules_service_changes_pending).")
	restoreFailuresDesc = metricdesc.New("kubeproxy", "sync_failures_total",
		"Rule syncs kube-proxy failed to apply: iptables-restore failures (kubeproxy_sync_proxy_rules_iptables_restore_failures_total) plus nftables sync failures (kubeproxy_sync_proxy_rules_nftables_sync_failures_total), over IP families; resets when kube-proxy restarts.")
	syncFailingDesc = metricdesc.New("kubeproxy", "sync_failing_seconds",
		"How long kube-proxy's rule syncs have been failing: now minus the first failure seen with no sync of the same IP family applied since (kube-proxy's start when that family has applied none since it started); 0 while they are not failing. kube-proxy retries a failed sync every sync period and stays healthy meanwhile; a restart does not mend a cause on the node, such as a kernel module it lacks.")
	buildInfoDesc = metricdesc.New("kubeproxy", "build_info",
		"1, labelled with the version kube-proxy reports (the git_version of its kubernetes_build_info) at the last poll it answered, kept while it does not answer; absent when it reports none. proxyhealth is tested with kube-proxy v1.34 to v1.37.", "version")
	invalidDroppedDesc = metricdesc.New("kubeproxy", "invalid_dropped_packets_total",
		"Packets kube-proxy's conntrack INVALID drop rule dropped (kubeproxy_iptables_ct_state_invalid_dropped_packets_total, iptables mode with nfacct); absent when kube-proxy does not export it.")
)

// Describe sends every descriptor Update may use.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{listErrorsDesc, lastListErrorDesc, logLinesDesc, logSkippedDesc, logFilesDesc,
		upDesc, healthyDesc, lastSyncAgeDesc, syncPendingDesc, endpointsPendingDesc, servicesPendingDesc,
		restoreFailuresDesc, syncFailingDesc, invalidDroppedDesc, buildInfoDesc} {
		ch <- d
	}
}

// Update publishes the follower's counts and the last poll of kube-proxy. kube-proxy not
// answering is a state (proxyhealth_kubeproxy_up 0), not a failure; an unreadable log file is.
func (c *Collector) Update(ch chan<- prometheus.Metric) error {
	c.mu.Lock()
	logs, logsRead, res, version := c.logs, c.logsRead, c.probe, c.version
	failingRuns, failing := c.failures.failing()
	failingSince := failingRuns.since
	c.mu.Unlock()
	now := c.now()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
	}

	for r := range numResources {
		for v := range numVerbs {
			counter(listErrorsDesc, float64(logs.errors[r][v]), resourceNames[r], verbNames[v])
		}
	}
	if !logs.lastError.IsZero() {
		gauge(lastListErrorDesc, float64(logs.lastError.UnixNano())/1e9)
	}
	counter(logLinesDesc, float64(logs.lines))
	counter(logSkippedDesc, float64(logs.skipped))
	if logsRead {
		gauge(logFilesDesc, float64(len(logs.files)))
	}

	if res != nil {
		gauge(upDesc, boolFloat(res.up))
		if c.cfg.HealthURL != "" {
			gauge(healthyDesc, boolFloat(res.healthy))
		}
		if res.up {
			if res.hasLastSync {
				gauge(lastSyncAgeDesc, max(0, now.Sub(res.lastSync).Seconds()))
			}
			if res.hasLastSync || !res.pendingSince.IsZero() {
				pending := 0.0
				if !res.pendingSince.IsZero() {
					pending = max(0, now.Sub(res.pendingSince).Seconds())
				}
				gauge(syncPendingDesc, pending)
			}
			if res.hasEndpointsPending {
				gauge(endpointsPendingDesc, res.endpointsPending)
			}
			if res.hasServicesPending {
				gauge(servicesPendingDesc, res.servicesPending)
			}
			counter(restoreFailuresDesc, res.restoreFailures)
			failingFor := 0.0
			if failing {
				failingFor = max(0, now.Sub(failingSince).Seconds())
			}
			gauge(syncFailingDesc, failingFor)
			if res.hasInvalidDropped {
				counter(invalidDroppedDesc, res.invalidDropped)
			}
		}
		if version != "" {
			gauge(buildInfoDesc, 1, version)
		}
	}
	return logs.err
}

func boolFloat(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
