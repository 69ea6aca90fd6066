// Package node is the node-settings collector: the kernel settings and firewall rules that
// decide whether Service traffic breaks silently on this node (docs/design.md, incidents 1 and 2):
// bridge netfilter, and whether a conntrack INVALID drop rule is on the forward path.
// conntrack's own settings are the conntrack collector's.
//
// Sysctls are read on every scrape. The rules come from the exporter's one reader of the node's
// netfilter state (internal/hostrules), which follows them as they change; a scrape only looks
// at its last read.
package node

import (
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"

	"github.com/alecthomas/kingpin/v2"
	"github.com/prometheus/client_golang/prometheus"

	phcollectors "github.com/proxyhealth/proxyhealth/collectors"
	"github.com/proxyhealth/proxyhealth/internal/hostrules"
	"github.com/proxyhealth/proxyhealth/internal/metricdesc"
	"github.com/proxyhealth/proxyhealth/internal/sysctl"
)

// Name is the collector's name (--[no-]collector.node).
const Name = "node"

// Rules is the node's netfilter state as the exporter last read it (*hostrules.Source).
type Rules interface {
	State() *hostrules.State
}

// Config configures the collector.
type Config struct {
	// ProcPath is the procfs mountpoint (the exporter's --path.procfs).
	ProcPath string
	// Rules is the node's netfilter state; nil leaves the INVALID drop rule check out.
	Rules Rules
}

// AddFlags adds the collector's flags to app.
func (c *Config) AddFlags(app *kingpin.Application) {
	// The rules are no longer read by commands on a timer; kept so that existing command
	// lines still parse.
	app.Flag("node.rules-check-interval", "Deprecated and ignored: the rules are followed as they change.").Hidden().Duration()
	app.Flag("node.rules-command-timeout", "Deprecated and ignored: the rules are read in-process.").Hidden().Duration()
}

func (c *Config) validate() error {
	return phcollectors.NotEmpty("path.procfs", c.ProcPath)
}

var (
	bridgeNFCallIptablesDesc = metricdesc.New("", "bridge_nf_call_iptables",
		"net.bridge.bridge-nf-call-iptables, read from <procfs>/sys/net/bridge/bridge-nf-call-iptables: 1 when bridged IPv4 traffic passes iptables, 0 when it does not (replies between pods on the same bridge then escape un-NATed), -1 when the file does not exist (br_netfilter not loaded, same effect as 0).")
	bridgeNFCallIp6tablesDesc = metricdesc.New("", "bridge_nf_call_ip6tables",
		"net.bridge.bridge-nf-call-ip6tables, read from <procfs>/sys/net/bridge/bridge-nf-call-ip6tables: 1 when bridged IPv6 traffic passes ip6tables, 0 when it does not, -1 when the file does not exist (br_netfilter not loaded).")
	invalidDropDesc = metricdesc.New("", "invalid_drop_rule_present",
		"1 when a rule dropping conntrack INVALID packets is reachable from the forward path in any active backend: the filter FORWARD chain of iptables-legacy or iptables-nft, or a native nftables base chain on the forward hook. Followed as the rules change.")
	rulesLastCheckDesc = metricdesc.New("node", "rules_last_check_timestamp_seconds",
		"Unix time when the node's netfilter rules behind proxyhealth_invalid_drop_rule_present were last read.")
)

// Collector is the node-settings collector.
type Collector struct {
	cfg    Config
	logger *slog.Logger

	mu       sync.Mutex
	lastDrop string // the last drop path logged, so that it is logged once
}

// New builds the collector. It does not touch the node: Update reads the sysctls and the
// rules' last read.
func New(cfg Config, logger *slog.Logger) (*Collector, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Collector{cfg: cfg, logger: logger}, nil
}

// Update sends the sysctl gauges and the last rules check result.
func (c *Collector) Update(ch chan<- prometheus.Metric) error {
	var errs []error
	proc := c.cfg.ProcPath

	for _, s := range []struct {
		desc *prometheus.Desc
		path string
	}{
		{bridgeNFCallIptablesDesc, sysctl.BridgeNFCallIptables},
		{bridgeNFCallIp6tablesDesc, sysctl.BridgeNFCallIp6tables},
	} {
		v, exists, err := sysctl.ReadInt(filepath.Join(proc, s.path))
		switch {
		case err != nil:
			errs = append(errs, err)
		case !exists:
			ch <- prometheus.MustNewConstMetric(s.desc, prometheus.GaugeValue, -1)
		default:
			ch <- prometheus.MustNewConstMetric(s.desc, prometheus.GaugeValue, float64(v))
		}
	}

	if err := c.updateDrop(ch); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Describe sends every descriptor Update may use.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{bridgeNFCallIptablesDesc, bridgeNFCallIp6tablesDesc, invalidDropDesc, rulesLastCheckDesc} {
		ch <- d
	}
}

// updateDrop sends what the last read of the rules says about an INVALID drop.
func (c *Collector) updateDrop(ch chan<- prometheus.Metric) error {
	if c.cfg.Rules == nil {
		return nil
	}
	st := c.cfg.Rules.State()
	if st == nil {
		return nil // not read yet
	}
	ch <- prometheus.MustNewConstMetric(rulesLastCheckDesc, prometheus.GaugeValue, float64(st.At.UnixNano())/1e9)
	if s, ok := c.cfg.Rules.(interface{ Stalled() error }); ok {
		if err := s.Stalled(); err != nil {
			return err // an old read is not served as current
		}
	}
	dc := checkDrop(st)
	switch {
	case dc.path != nil:
		ch <- prometheus.MustNewConstMetric(invalidDropDesc, prometheus.GaugeValue, 1)
		c.mu.Lock()
		if found := dc.String(); found != c.lastDrop {
			c.logger.Debug("INVALID drop rule found", "backend", dc.backend, "path", strings.Join(dc.path, " => "))
			c.lastDrop = found
		}
		c.mu.Unlock()
	case dc.readable:
		ch <- prometheus.MustNewConstMetric(invalidDropDesc, prometheus.GaugeValue, 0)
	}
	return dc.err()
}
