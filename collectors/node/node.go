// Package node is the node-settings collector: the kernel settings and firewall rules that
// decide whether Service traffic breaks silently on this node (DESIGN.md, incidents 1 and 2):
// bridge netfilter, conntrack's TCP window liberality and event setting, and whether a conntrack
// INVALID drop rule is on the forward path.
//
// Sysctls are read on every scrape. The rules are read by running iptables-legacy-save,
// iptables-nft-save and nft in a background loop; a scrape only reads the last result. Reading
// never changes the node: iptables-legacy-save is only run when <procfs>/net/ip_tables_names
// lists the legacy filter table, since naming a missing legacy table makes the kernel create it.
package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/prometheus/client_golang/prometheus"
)

// Name is the collector's name (--[no-]collector.node).
const Name = "node"

const namespace = "proxyhealth"

// Config configures the collector.
type Config struct {
	// ProcPath is the procfs mountpoint (the exporter's --path.procfs). Besides the sysctls, the
	// rules check reads net/ip_tables_names there, so it must show the network namespace the
	// commands run in.
	ProcPath string
	// RulesCheckInterval is how often the firewall rules are read.
	RulesCheckInterval time.Duration
	// CommandTimeout bounds each iptables-save or nft run.
	CommandTimeout time.Duration

	// Run runs the rule listing commands; nil means ExecRunner. Tests inject fakes, or a runner
	// that prefixes `ip netns exec <ns>`.
	Run CommandRunner
	// LookPath finds a command; nil means exec.LookPath.
	LookPath func(string) (string, error)
	// ForwardDrop replaces the rules check's reading (Run and LookPath above): it tells, per
	// backend, whether a conntrack INVALID drop is reachable from the forward path. nil reads
	// the node's.
	ForwardDrop func(ctx context.Context) []Backend
	// Now is the clock checks are timed by; nil means time.Now.
	Now func() time.Time
}

// AddFlags adds the collector's flags to app.
func (c *Config) AddFlags(app *kingpin.Application) {
	app.Flag("node.rules-check-interval", "How often the node collector reads the firewall rules (iptables-legacy-save, iptables-nft-save, nft) to find a conntrack INVALID drop on the forward path. Scrapes only read the last result.").
		Default("30s").DurationVar(&c.RulesCheckInterval)
	app.Flag("node.rules-command-timeout", "Timeout for each iptables-save or nft run of the node collector's rules check.").
		Default("10s").DurationVar(&c.CommandTimeout)
}

var (
	bridgeNFCallIptablesDesc = prometheus.NewDesc(
		prometheus.BuildFQName(namespace, "", "bridge_nf_call_iptables"),
		"net.bridge.bridge-nf-call-iptables, read from <procfs>/sys/net/bridge/bridge-nf-call-iptables: 1 when bridged IPv4 traffic passes iptables, 0 when it does not (replies between pods on the same bridge then escape un-NATed), -1 when the file does not exist (br_netfilter not loaded, same effect as 0).",
		nil, nil)
	bridgeNFCallIp6tablesDesc = prometheus.NewDesc(
		prometheus.BuildFQName(namespace, "", "bridge_nf_call_ip6tables"),
		"net.bridge.bridge-nf-call-ip6tables, read from <procfs>/sys/net/bridge/bridge-nf-call-ip6tables: 1 when bridged IPv6 traffic passes ip6tables, 0 when it does not, -1 when the file does not exist (br_netfilter not loaded).",
		nil, nil)
	tcpBeLiberalDesc = prometheus.NewDesc(
		prometheus.BuildFQName(namespace, "conntrack", "tcp_be_liberal"),
		"net.netfilter.nf_conntrack_tcp_be_liberal, read from <procfs>/sys/net/netfilter/nf_conntrack_tcp_be_liberal: 1 when conntrack does not mark out-of-window TCP packets INVALID.",
		nil, nil)
	conntrackEventsDesc = prometheus.NewDesc(
		prometheus.BuildFQName(namespace, "conntrack", "events_setting"),
		"net.netfilter.nf_conntrack_events, read from <procfs>/sys/net/netfilter/nf_conntrack_events: 0 off (the conntrack event listener sees nothing), 1 on, 2 on while a listener exists.",
		nil, nil)
	invalidDropDesc = prometheus.NewDesc(
		prometheus.BuildFQName(namespace, "", "invalid_drop_rule_present"),
		"1 when a rule dropping conntrack INVALID packets is reachable from the forward path in any active backend: the filter FORWARD chain of iptables-legacy-save or iptables-nft-save, or a native nftables base chain on the forward hook (nft -j list ruleset). Read by the background rules check.",
		nil, nil)
	rulesLastCheckDesc = prometheus.NewDesc(
		prometheus.BuildFQName(namespace, "node", "rules_last_check_timestamp_seconds"),
		"Unix time when the node collector's background rules check (iptables-legacy-save, iptables-nft-save, nft) last finished.",
		nil, nil)
)

// Collector is the node-settings collector.
type Collector struct {
	cfg    Config
	logger *slog.Logger
	now    func() time.Time

	mu    sync.Mutex
	rules *rulesResult // nil until the first check finishes
}

// New builds the collector. It does not touch the node: sysctls are read by Update and the
// rules by Run.
func New(cfg Config, logger *slog.Logger) (*Collector, error) {
	if cfg.ProcPath == "" {
		cfg.ProcPath = "/proc"
	}
	if cfg.RulesCheckInterval <= 0 {
		return nil, fmt.Errorf("--node.rules-check-interval must be positive, got %v", cfg.RulesCheckInterval)
	}
	if cfg.CommandTimeout <= 0 {
		return nil, fmt.Errorf("--node.rules-command-timeout must be positive, got %v", cfg.CommandTimeout)
	}
	if cfg.Run == nil {
		cfg.Run = ExecRunner
	}
	if cfg.LookPath == nil {
		cfg.LookPath = exec.LookPath
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	c := &Collector{cfg: cfg, logger: logger, now: time.Now}
	if cfg.Now != nil {
		c.now = cfg.Now
	}
	return c, nil
}

// Run checks the rules at once and then every RulesCheckInterval until ctx is done.
func (c *Collector) Run(ctx context.Context) {
	t := time.NewTicker(c.cfg.RulesCheckInterval)
	defer t.Stop()
	for {
		c.CheckRules(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// CheckRules runs one rules check now and publishes its result for Update.
func (c *Collector) CheckRules(ctx context.Context) {
	var res *rulesResult
	if c.cfg.ForwardDrop != nil {
		res = fromBackends(c.cfg.ForwardDrop(ctx), c.now())
	} else {
		res = checkRules(ctx, c.cfg.ProcPath, c.cfg.Run, c.cfg.LookPath, c.cfg.CommandTimeout, c.now)
	}
	if ctx.Err() != nil {
		return // shutting down: the failures are ours, not the node's
	}
	if backend, path, ok := res.found(); ok {
		c.logger.Debug("INVALID drop rule found", "backend", backend, "path", strings.Join(path, " => "))
	}
	c.mu.Lock()
	c.rules = res
	c.mu.Unlock()
}

// Update sends the sysctl gauges and the last rules check result.
func (c *Collector) Update(ch chan<- prometheus.Metric) error {
	var errs []error
	proc := c.cfg.ProcPath

	for _, s := range []struct {
		desc *prometheus.Desc
		path string
	}{
		{bridgeNFCallIptablesDesc, bridgeNFCallIptablesPath},
		{bridgeNFCallIp6tablesDesc, bridgeNFCallIp6tablesPath},
	} {
		v, exists, err := readSysctl(filepath.Join(proc, s.path))
		switch {
		case err != nil:
			errs = append(errs, err)
		case !exists:
			ch <- prometheus.MustNewConstMetric(s.desc, prometheus.GaugeValue, -1)
		default:
			ch <- prometheus.MustNewConstMetric(s.desc, prometheus.GaugeValue, float64(v))
		}
	}

	var missing []string
	for _, s := range []struct {
		desc *prometheus.Desc
		path string
	}{
		{tcpBeLiberalDesc, tcpBeLiberalPath},
		{conntrackEventsDesc, conntrackEventsPath},
	} {
		v, exists, err := readSysctl(filepath.Join(proc, s.path))
		switch {
		case err != nil:
			errs = append(errs, err)
		case !exists:
			missing = append(missing, filepath.Base(s.path))
		default:
			ch <- prometheus.MustNewConstMetric(s.desc, prometheus.GaugeValue, float64(v))
		}
	}
	if len(missing) > 0 {
		errs = append(errs, fmt.Errorf("conntrack sysctls not found under %s (%s): is nf_conntrack loaded?",
			filepath.Join(proc, netfilterDir), strings.Join(missing, ", ")))
	}

	c.mu.Lock()
	res := c.rules
	c.mu.Unlock()
	if res != nil {
		ch <- prometheus.MustNewConstMetric(rulesLastCheckDesc, prometheus.GaugeValue, float64(res.at.UnixNano())/1e9)
		if _, _, found := res.found(); found {
			ch <- prometheus.MustNewConstMetric(invalidDropDesc, prometheus.GaugeValue, 1)
		} else if res.readable() {
			ch <- prometheus.MustNewConstMetric(invalidDropDesc, prometheus.GaugeValue, 0)
		}
		if err := res.err(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Describe sends every descriptor Update may use.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{bridgeNFCallIptablesDesc, bridgeNFCallIp6tablesDesc, tcpBeLiberalDesc,
		conntrackEventsDesc, invalidDropDesc, rulesLastCheckDesc} {
		ch <- d
	}
}
