//go:build linux

// Command soak runs proxyhealth for a long time in a network namespace of its own shaped like a
// node, injects faults at random, and samples the exporter's resident memory, goroutines, open
// file descriptors, threads and children over time. After each fault it waits for the exporter
// to come back clean (every collector succeeding, kube-proxy up, the API view fresh, no line of
// kube-proxy's log lost, and goroutines, fds and children back near the baseline) and reports
// how long that took. It must run as root; it is run by hand (see README.md), and at smoke size
// by nothing else.
//
// Subcommands: run (the default) and storm (a conntrack event storm, run inside the namespace).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/proxyhealth/proxyhealth/bench/internal/benchrun"
)

func main() {
	args := os.Args[1:]
	if len(args) > 0 && args[0] == "storm" {
		if err := runStorm(args[1:]); err != nil {
			fmt.Fprintf(os.Stderr, "soak storm: %v\n", err)
			os.Exit(1)
		}
		return
	}
	if len(args) > 0 && args[0] == "run" {
		args = args[1:]
	}
	os.Exit(runMain(args))
}

// config is the run's settings.
type config struct {
	duration    time.Duration
	faultEvery  time.Duration // mean gap between two faults
	faultLength time.Duration // how long a fault lasts
	settle      time.Duration // longest wait for the exporter to come back clean
	sampleEvery time.Duration
	seed        int64
	services    int
	kube        string
	exporter    string
	benchrun.Flags
}

func runMain(args []string) int {
	fs := flag.NewFlagSet("soak", flag.ContinueOnError)
	var cfg config
	smoke := fs.Bool("smoke", false, "a short run (about two minutes) that proves the harness: every fault once")
	fs.DurationVar(&cfg.duration, "duration", time.Hour, "how long faults are injected")
	fs.DurationVar(&cfg.faultEvery, "fault-every", 40*time.Second, "mean quiet time between two faults (uniform in [0.5x, 1.5x])")
	fs.DurationVar(&cfg.faultLength, "fault-length", 20*time.Second, "how long each fault lasts")
	fs.DurationVar(&cfg.settle, "settle", 90*time.Second, "longest wait after a fault for the exporter to come back clean")
	fs.DurationVar(&cfg.sampleEvery, "sample-every", 5*time.Second, "how often the exporter's memory, goroutines and fds are sampled")
	fs.Int64Var(&cfg.seed, "seed", 0, "random seed (0: from the clock; the report prints it)")
	fs.IntVar(&cfg.services, "services", 500, "kube-proxy shaped Services (5 endpoints each) in the namespace's iptables-nft rules")
	fs.StringVar(&cfg.kube, "kube", "auto", "etcd and kube-apiserver for the API black-hole fault: on, off, or auto (on when the binaries exist)")
	fs.StringVar(&cfg.exporter, "exporter", "", "proxyhealth binary (default: built from the repository)")
	cfg.Register(fs, "process logs")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *smoke {
		cfg.duration, cfg.faultEvery, cfg.faultLength, cfg.services = 0, 2*time.Second, 12*time.Second, 50
		cfg.sampleEvery = 2 * time.Second
	}
	switch {
	case cfg.duration < 0, cfg.faultEvery <= 0, cfg.faultLength <= 0, cfg.settle <= 0, cfg.sampleEvery <= 0:
		fmt.Fprintln(os.Stderr, "soak: durations must be positive")
		return 2
	case cfg.services < 1 || cfg.services > 60000:
		fmt.Fprintln(os.Stderr, "soak: --services must be in [1, 60000]")
		return 2
	case cfg.kube != "auto" && cfg.kube != "on" && cfg.kube != "off":
		fmt.Fprintln(os.Stderr, "soak: --kube must be on, off or auto")
		return 2
	}
	if cfg.seed == 0 {
		cfg.seed = time.Now().UnixNano()
	}
	var rep *report
	code := benchrun.Main(benchrun.Program{Name: "soak", WhyRoot: "it creates a network namespace", Stopping: "stopping after the current step"}, cfg.Out, func(ctx context.Context) (string, error) {
		var err error
		rep, err = soak(ctx, cfg, *smoke, append([]string{"go run ./bench/soak"}, args...))
		return rep.render(), err
	})
	if code != 0 {
		return code
	}
	if rep != nil && !rep.clean() {
		fmt.Fprintln(os.Stderr, "soak: the exporter did not come back clean after every fault")
		return 1
	}
	return 0
}
