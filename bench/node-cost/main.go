//go:build linux

// Command node-cost measures what the whole exporter costs a node, as a process tree (its
// children such as iptables-save and nft included), next to a real kube-proxy in each proxy
// mode on the same "node", and how soon it reports kube-proxy's rules drifting from the API.
// It must run as root, with cgroup v1. See README.md.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/proxyhealth/proxyhealth/bench/internal/benchns"
	"github.com/proxyhealth/proxyhealth/bench/internal/benchrun"
	"github.com/proxyhealth/proxyhealth/bench/internal/nsproc"
)

func main() { os.Exit(runNodeCost(os.Args[1:])) }

// nsPrefix marks the benchmark's namespaces (ph-bench-rd-nc-cp-*, ph-bench-rd-nc-node-*): it
// is bench/rules-drift's, whose subcommand this benchmark was. bench/conntrack-events removes
// every ph-bench-* namespace it finds at its start, so all of them take the same lock
// (/run/ph-bench.lock) and never run at once.
const nsPrefix = "ph-bench-rd-"

// exporterAddr is the exporter's address in the node's namespace.
const exporterAddr = "127.0.0.1:9869"

func newNSName(role string) string { return benchns.NewName(nsPrefix + role + "-") }

// run runs a command with a deadline; its combined output is in the error.
func run(ctx context.Context, stdin []byte, name string, args ...string) (string, error) {
	return nsproc.Output(ctx, 10*time.Minute, stdin, name, args...)
}

var ncModes = []string{"iptables-legacy", "iptables-nft", "nftables"}

// ncDefaultServices is each mode's full size: kube-proxy's iptables mode with the nft backend
// does not finish its first sync of 10,000 x 10 in 15 minutes on a small machine.
var ncDefaultServices = map[string]int{"iptables-legacy": 10000, "iptables-nft": 3000, "nftables": 10000}

type ncConfig struct {
	modes           []string
	services        int // 0: the mode's default
	endpoints       int
	smoke           bool
	workers         int
	idle, churn     time.Duration
	churnScrape     time.Duration
	settle          time.Duration
	rates           []int
	grace           time.Duration // 0: the exporter's default
	exporterArgs    []string
	latencyTimeout  time.Duration
	healTimeout     time.Duration
	kubeProxySyncTO time.Duration
	benchrun.Flags
}

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, " ") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

func runNodeCost(args []string) int {
	fs := flag.NewFlagSet("node-cost", flag.ContinueOnError)
	var cfg ncConfig
	var mode, rates string
	var extra multiFlag
	fs.StringVar(&mode, "mode", "all", "kube-proxy mode: iptables-legacy, iptables-nft, nftables, or all (in that order)")
	fs.IntVar(&cfg.services, "services", 0, "ClusterIP services (one TCP port each); 0: 10000, but 3000 for iptables-nft")
	fs.IntVar(&cfg.endpoints, "endpoints", 10, "endpoints per service")
	fs.BoolVar(&cfg.smoke, "smoke", false, "200 services x 3 endpoints, phases of a few seconds, a 5 s grace period; fails only if the harness breaks")
	cfg.Register(fs, "process logs")
	fs.IntVar(&cfg.workers, "workers", 16, "parallel API clients creating Services and EndpointSlices")
	fs.DurationVar(&cfg.idle, "idle", 60*time.Second, "idle phase")
	fs.DurationVar(&cfg.settle, "settle", 35*time.Second, "start-up lasts until the exporter's netfilter reads have been still this long (more than its --netfilter.legacy-min-read-interval, 30 s)")
	fs.DurationVar(&cfg.churn, "churn", 120*time.Second, "each churn phase")
	fs.StringVar(&rates, "rates", "1,10", "churn phases: endpoint changes a second, comma-separated")
	fs.DurationVar(&cfg.churnScrape, "churn-scrape", 15*time.Second, "scrape interval under churn, for proxyhealth_rules_services_drifted; the shipped PodMonitor scrapes every 30 s and the drift alerts wait 5 min, so a shorter interval only adds scrapes to the exporter's CPU")
	fs.DurationVar(&cfg.grace, "grace-period", 0, "pass --rules.grace-period to the exporter (0: its default, read from its --help)")
	fs.Var(&extra, "exporter-arg", "one more exporter flag (repeatable), e.g. --exporter-arg=--no-collector.conntrack")
	fs.DurationVar(&cfg.latencyTimeout, "latency-timeout", 5*time.Minute, "how long past the grace period to wait for the drift series")
	fs.DurationVar(&cfg.healTimeout, "heal-timeout", 3*time.Minute, "how long to wait for the drift to clear once kube-proxy's connection is healed")
	fs.DurationVar(&cfg.kubeProxySyncTO, "kube-proxy-sync-timeout", 20*time.Minute, "limit on kube-proxy's first sync")
	cfg.LockWaitFlag(fs)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	cfg.exporterArgs = extra
	switch mode {
	case "all":
		cfg.modes = ncModes
	case "iptables-legacy", "iptables-nft", "nftables":
		cfg.modes = []string{mode}
	default:
		fmt.Fprintln(os.Stderr, "--mode must be iptables-legacy, iptables-nft, nftables or all")
		return 2
	}
	for _, r := range strings.Split(rates, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(r))
		if err != nil || n < 1 || n > 1000 {
			fmt.Fprintln(os.Stderr, "--rates must be integers in [1, 1000]")
			return 2
		}
		cfg.rates = append(cfg.rates, n)
	}
	if cfg.smoke {
		cfg.services, cfg.endpoints = 200, 3
		cfg.idle, cfg.churn, cfg.settle = 5*time.Second, 5*time.Second, 3*time.Second
		cfg.churnScrape = min(cfg.churnScrape, time.Second)
		if cfg.grace == 0 {
			cfg.grace = 5 * time.Second
		}
		cfg.latencyTimeout, cfg.healTimeout = min(cfg.latencyTimeout, time.Minute), min(cfg.healTimeout, time.Minute)
	}
	switch {
	case cfg.services < 0 || cfg.services > 60000:
		fmt.Fprintln(os.Stderr, "--services must be in [0, 60000] (ClusterIPs come from one /16)")
		return 2
	case cfg.endpoints < 1 || max(cfg.services, 10000)*cfg.endpoints > 4_000_000:
		fmt.Fprintln(os.Stderr, "--endpoints must be at least 1, and services x endpoints at most 4,000,000")
		return 2
	case cfg.idle <= 0 || cfg.churn <= 0 || cfg.churnScrape <= 0:
		fmt.Fprintln(os.Stderr, "--idle, --churn and --churn-scrape must be positive")
		return 2
	}
	return benchrun.Main(benchrun.Program{Name: "node-cost", WhyRoot: "network namespaces, cgroups", Stopping: "stopping and cleaning up"}, cfg.Out, func(ctx context.Context) (string, error) {
		rep, err := nodeCost(ctx, cfg, append([]string{"go run ./bench/node-cost"}, args...))
		return rep.render(), err
	})
}
