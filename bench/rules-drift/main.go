//go:build linux

// Command rules-drift benchmarks the rules collector's drift check at kube-proxy scale, in one
// run: how long iptables-nft-save and iptables-legacy-save take to dump a kube-proxy-shaped
// nat table of --services x --endpoints (each backend loaded in a network namespace of its
// own), what the exporter's parse and compare cost on top (the rules package's own
// benchmarks, and internal/testsupport/iptables.Parse on the very output just saved), and, against a real
// etcd and kube-apiserver holding the same number of Services and EndpointSlices, the
// exporter's memory next to kube-proxy v1.36's. It must run as root. See README.md; the whole
// exporter's cost next to kube-proxy is bench/node-cost's.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/proxyhealth/proxyhealth/bench/internal/benchrun"
	"github.com/proxyhealth/proxyhealth/test/kubelab"
)

type config struct {
	services, endpoints int
	reps                int
	smoke               bool
	benchrun.Flags
	kube              string // auto, on, off
	workers           int
	kubeProxyIPTables string
	cpuprofile        string
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "measure" {
		if err := runMeasure(os.Args[2:]); err != nil {
			fmt.Fprintf(os.Stderr, "rules-drift measure: %v\n", err)
			os.Exit(1)
		}
		return
	}
	os.Exit(runMain(os.Args[1:]))
}

func runMain(args []string) int {
	fs := flag.NewFlagSet("rules-drift", flag.ContinueOnError)
	var cfg config
	fs.IntVar(&cfg.services, "services", 10000, "ClusterIP services (one TCP port each)")
	fs.IntVar(&cfg.endpoints, "endpoints", 10, "endpoints per service")
	fs.IntVar(&cfg.reps, "reps", 3, "repetitions of each timed save and parse, and -count of the go benchmarks")
	fs.BoolVar(&cfg.smoke, "smoke", false, "200 services x 3 endpoints, one repetition; the API part only if etcd and the kube binaries exist; fails only if the harness breaks")
	cfg.Register(fs, "process logs, saved tables")
	fs.StringVar(&cfg.kube, "kube", "auto", "the API part (etcd, kube-apiserver, exporter and kube-proxy RSS): on, off, or auto (on when the binaries exist)")
	fs.IntVar(&cfg.workers, "workers", 16, "parallel API clients creating Services and EndpointSlices")
	fs.StringVar(&cfg.kubeProxyIPTables, "kube-proxy-iptables", "legacy", "iptables backend kube-proxy writes with (legacy or nft; iptables-nft-restore of 110,000 chains takes over ten minutes on a small machine)")
	fs.StringVar(&cfg.cpuprofile, "cpuprofile", "", "pass -cpuprofile FILE to the go benchmarks (FILE relative to the repository)")
	cfg.LockWaitFlag(fs)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if cfg.smoke {
		cfg.services, cfg.endpoints, cfg.reps = 200, 3, 1
	}
	switch {
	case cfg.services < 1 || cfg.services > 60000:
		fmt.Fprintln(os.Stderr, "--services must be in [1, 60000] (ClusterIPs come from one /16)")
		return 2
	case cfg.endpoints < 1 || cfg.services*cfg.endpoints > 8_000_000:
		fmt.Fprintln(os.Stderr, "--endpoints must be at least 1, and services x endpoints at most 8,000,000")
		return 2
	case cfg.reps < 1:
		fmt.Fprintln(os.Stderr, "--reps must be at least 1")
		return 2
	case cfg.kubeProxyIPTables != "legacy" && cfg.kubeProxyIPTables != "nft":
		fmt.Fprintln(os.Stderr, "--kube-proxy-iptables must be legacy or nft")
		return 2
	case cfg.kube != "auto" && cfg.kube != "on" && cfg.kube != "off":
		fmt.Fprintln(os.Stderr, "--kube must be on, off or auto")
		return 2
	}
	return benchrun.Main(benchrun.Program{Name: "rules-drift", WhyRoot: "it creates network namespaces", Stopping: "stopping"}, cfg.Out, func(ctx context.Context) (string, error) {
		rep, err := bench(ctx, cfg, append([]string{"go run ./bench/rules-drift"}, args...))
		return rep.render(), err
	})
}

// report is everything one run measured.
type report struct {
	cfg config
	benchrun.Machine
	IPTablesVersion    string
	GenLines, GenBytes int
	GenChains          int
	RSSFloorKiB        int64 // rusage maxrss of `true` run the same way as the saves
	Saves              []saveResult
	GoBench            []goBench
	GoBenchCmd         string
	GoBenchScale       string
	Kube               *kubeResult
	KubeSkipped        string
	Errs               []string
}

func bench(ctx context.Context, cfg config, argv []string) (*report, error) {
	ws, err := benchrun.Prepare(ctx, nsPrefix, "ph-bench-rd-", &cfg.Flags)
	if err != nil {
		return nil, err
	}
	defer ws.Close()
	tmp := ws.Tmp

	rep := &report{cfg: cfg, Machine: benchrun.Describe(cfg.Repo, argv)}
	if out, err := run(ctx, nil, "iptables-legacy-save", "--version"); err == nil {
		rep.IPTablesVersion = strings.TrimSpace(out)
	}

	// Part 1: save (and in-process parse) per backend, each in its own namespace.
	benchrun.Logf("generating %d services x %d endpoints", cfg.services, cfg.endpoints)
	rules := natRules(cfg.services, cfg.endpoints)
	rep.GenBytes = len(rules)
	rep.GenLines = bytes.Count(rules, []byte("\n"))
	rep.GenChains = bytes.Count(rules, []byte("\n:"))
	if cfg.KeepTmp {
		_ = os.WriteFile(filepath.Join(tmp, "nat.rules"), rules, 0o644)
	}
	if t, err := runTimed(ctx, "", nil, "true"); err == nil {
		rep.RSSFloorKiB = t.MaxRSSKiB
	}
	for _, b := range backends {
		benchrun.Logf("%s: restore, then %d x %s -t nat", b.Name, cfg.reps, b.Save)
		chunks := [][]byte{rules}
		if b.Name == "nft" {
			chunks = natRulesChunks(cfg.services, cfg.endpoints, 500)
		}
		r, err := measureSave(ctx, b, chunks, cfg.reps)
		if err != nil {
			return rep, fmt.Errorf("%s backend: %w", b.Name, err)
		}
		rep.Saves = append(rep.Saves, r)
	}
	rules = nil

	// Part 2: the rules package's own benchmarks.
	benchrun.Logf("go benchmarks of ./collectors/rules")
	var extra []string
	if cfg.cpuprofile != "" {
		extra = append(extra, "-cpuprofile", cfg.cpuprofile)
	}
	rep.GoBench, rep.GoBenchCmd, err = runGoBench(ctx, cfg.Repo, cfg.smoke, cfg.reps, extra)
	if err != nil {
		return rep, err
	}
	rep.GoBenchScale = "10000 x 10"
	if cfg.smoke {
		rep.GoBenchScale = "200 x 10 (-short)"
	}

	// Part 4: memory against a real API server.
	bins, berr := kubelab.FindBinaries(cfg.Repo)
	switch {
	case cfg.kube == "off":
		rep.KubeSkipped = "--kube=off"
	case berr != nil && cfg.kube == "auto":
		rep.KubeSkipped = berr.Error()
	case berr != nil:
		return rep, berr
	default:
		res, err := runKube(ctx, cfg, bins, tmp)
		rep.Kube = res
		if err != nil {
			return rep, fmt.Errorf("API part: %w", err)
		}
	}
	return rep, nil
}
