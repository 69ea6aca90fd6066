//go:build linux

// Command apiview measures proxyhealth's API view (internal/cluster) alone against a real etcd
// and kube-apiserver holding --services ClusterIP Services (one TCP port each) and as many
// EndpointSlices of --endpoints ready endpoints: the peak resident memory (VmHWM) of a small
// process that runs only the view (viewrun), its Go heap after sync, and the time until the
// view held every service port. It builds viewrun from the working tree and from --base (a
// git revision, main by default) and runs them alternately against the same apiserver, so the
// two are compared within one run. It must run as root. See README.md.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/proxyhealth/proxyhealth/bench/internal/benchrun"
	"github.com/proxyhealth/proxyhealth/test/kubelab"
)

type config struct {
	services, endpoints int
	localEvery          int
	reps                int
	workers             int
	smoke               bool
	base                string
	benchrun.Flags
	gogc     string
	godebug  string
	etcdData string
	profiles string
	// watchList is whether kube-apiserver offers streamed lists (its WatchList feature);
	// without, the views and informers list in pages or whole.
	watchList bool
	informers bool
}

// imageGODEBUG is the GODEBUG the exporter's image (Dockerfile) sets: no allocation profile
// from the process's start, whose table costs 1.4 MiB before main runs.
const imageGODEBUG = "memprofilerate=0"

func main() { os.Exit(runMain(os.Args[1:])) }

func runMain(args []string) int {
	if len(args) > 0 && args[0] == "fanout" {
		return runFanout(args[1:])
	}
	fs := flag.NewFlagSet("apiview", flag.ContinueOnError)
	var cfg config
	fs.IntVar(&cfg.services, "services", 10000, "ClusterIP Services, one TCP port and one EndpointSlice each")
	fs.IntVar(&cfg.endpoints, "endpoints", 10, "ready endpoints per EndpointSlice")
	fs.IntVar(&cfg.localEvery, "local-every", 10, "every Nth endpoint is on this node (the others on other nodes)")
	fs.IntVar(&cfg.reps, "reps", 2, "runs of each build, alternating")
	fs.IntVar(&cfg.workers, "workers", 16, "parallel API clients creating the objects")
	fs.BoolVar(&cfg.smoke, "smoke", false, "200 services x 3 endpoints, one run of each build")
	fs.StringVar(&cfg.base, "base", "main", "git revision to compare with (its internal/cluster, this tree's viewrun); empty: only this tree")
	cfg.Register(fs, "process logs, builds")
	cfg.LockWaitFlag(fs)
	fs.StringVar(&cfg.gogc, "gogc", "", "GOGC for viewrun (default: unset, Go's 100, as the exporter runs)")
	fs.StringVar(&cfg.godebug, "godebug", imageGODEBUG, "GODEBUG for viewrun (default: what the exporter's image sets; empty: unset)")
	fs.StringVar(&cfg.profiles, "profiles", "", "write each run's CPU profile until sync into this directory (viewrun-<build>-<run>.pprof, build 0 being --base when given)")
	fs.BoolVar(&cfg.watchList, "watch-list", true, "kube-apiserver streams lists (sendInitialEvents); false starts it with --feature-gates=WatchList=false, so that lists are paged")
	fs.BoolVar(&cfg.informers, "informers", true, "run a client-go informer pair (informerrun) next to the builds, as their anchor")
	fs.StringVar(&cfg.etcdData, "etcd-data", "", "keep etcd's data in this directory (on /dev/shm, say), and reuse it when a run of the same shape loaded it: skips the load")
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
	case cfg.endpoints < 1 || cfg.endpoints > 1000 || cfg.services*cfg.endpoints > 8_000_000:
		fmt.Fprintln(os.Stderr, "--endpoints must be in [1, 1000] (one EndpointSlice each), and services x endpoints at most 8,000,000")
		return 2
	case cfg.localEvery < 1 || cfg.reps < 1 || cfg.workers < 1:
		fmt.Fprintln(os.Stderr, "--local-every, --reps and --workers must be at least 1")
		return 2
	}
	return benchrun.Main(benchrun.Program{Name: "apiview", WhyRoot: "it creates a network namespace", Stopping: "stopping"}, cfg.Out, func(ctx context.Context) (string, error) {
		rep, err := bench(ctx, cfg, append([]string{"go run ./bench/apiview"}, args...))
		return rep.render(), err
	})
}

// setUp starts either apiview run: the benchmark workspace, and the binaries to run.
func setUp(ctx context.Context, cfg *config) (*benchrun.Workspace, kubelab.Binaries, error) {
	ws, err := benchrun.Prepare(ctx, nsPrefix, "ph-bench-av-", &cfg.Flags)
	if err != nil {
		return nil, kubelab.Binaries{}, err
	}
	bins, err := kubelab.FindBinaries(cfg.Repo)
	if err != nil {
		ws.Close()
		return nil, kubelab.Binaries{}, err
	}
	return ws, bins, nil
}

func bench(ctx context.Context, cfg config, argv []string) (*report, error) {
	ws, bins, err := setUp(ctx, &cfg)
	if err != nil {
		return nil, err
	}
	defer ws.Close()
	tmp := ws.Tmp
	rep := &report{
		cfg:     cfg,
		Machine: benchrun.Describe(cfg.Repo, argv),
		Version: bins.Version,
	}

	benchrun.Logf("building viewrun")
	builds := []*build{{Name: "this tree", Rev: rep.Commit}}
	if builds[0].Bin, err = buildViewrun(ctx, cfg.Repo, filepath.Join(tmp, "viewrun-head")); err != nil {
		return rep, err
	}
	if cfg.base != "" {
		b := &build{Name: cfg.base, Rev: benchrun.Git(cfg.Repo, "rev-parse", "--short", cfg.base)}
		if b.Bin, err = buildBase(ctx, cfg, tmp); err != nil {
			return rep, fmt.Errorf("building viewrun against %s: %w", cfg.base, err)
		}
		builds = append([]*build{b}, builds...)
	}
	if cfg.informers {
		b := &build{Name: "informer pair", Rev: "client-go, " + rep.Commit, Informers: true}
		if b.Bin, err = buildCommand(ctx, cfg.Repo, "./bench/apiview/informerrun", filepath.Join(tmp, "informerrun")); err != nil {
			return rep, err
		}
		builds = append(builds, b)
	}
	rep.Builds = builds

	k, err := startKube(ctx, cfg, bins, tmp)
	if k != nil {
		defer k.stop()
		rep.Kube = k.res
	}
	if err != nil {
		return rep, err
	}
	for i := range cfg.reps {
		for j, b := range builds {
			benchrun.Logf("run %d of %s", i+1, b.Name)
			profile := ""
			if cfg.profiles != "" {
				profile = filepath.Join(cfg.profiles, fmt.Sprintf("viewrun-%d-%d.pprof", j, i+1))
			}
			r, err := k.runView(ctx, b.Bin, profile)

			if err != nil {
				return rep, fmt.Errorf("%s: %w", b.Name, err)
			}
			benchrun.Logf("  synced in %.1f s, VmHWM %.1f MiB, live heap %.1f MiB, apiserver %.2f CPU s", r.SyncSeconds, mib(r.HWMKiB), float64(r.LiveHeap)/(1<<20), r.APIServerCPU)
			b.Runs = append(b.Runs, r)
		}
	}
	k.sample()
	return rep, nil
}

// build is one viewrun (or informerrun) binary and its runs.
type build struct {
	Name, Rev string
	Bin       string
	Informers bool // informerrun: the client-go informer pair
	Runs      []viewResult
}

// buildViewrun builds viewrun in src (a repository tree) into out.
func buildViewrun(ctx context.Context, src, out string) (string, error) {
	return buildCommand(ctx, src, "./bench/apiview/viewrun", out)
}

// buildCommand builds the command pkg in src (a repository tree) into out.
func buildCommand(ctx context.Context, src, pkg, out string) (string, error) {
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", out, pkg)
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0") // as the Makefile builds the exporter
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build in %s: %w: %s", src, err, b)
	}
	return out, nil
}

// buildBase exports cfg.base's tree (git archive: no checkout, no worktree), puts this tree's
// viewrun and memrun into it, and builds it there: viewrun uses only the API view's exported API that
// both share, so the difference between the two binaries is the view itself.
func buildBase(ctx context.Context, cfg config, tmp string) (string, error) {
	dir := filepath.Join(tmp, "base")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	archive := exec.CommandContext(ctx, "git", "archive", "--format=tar", cfg.base)
	archive.Dir = cfg.Repo
	tarball, err := archive.Output()
	if err != nil {
		return "", fmt.Errorf("git archive %s: %w", cfg.base, err)
	}
	untar := exec.CommandContext(ctx, "tar", "-x", "-C", dir)
	untar.Stdin = bytes.NewReader(tarball)
	if out, err := untar.CombinedOutput(); err != nil {
		return "", fmt.Errorf("tar: %w: %s", err, out)
	}
	// viewrun and its measuring package as in this tree: the base may predate either.
	for _, d := range []string{"bench/apiview/viewrun", "bench/apiview/internal/memrun"} {
		if err := os.RemoveAll(filepath.Join(dir, d)); err != nil {
			return "", err
		}
		if err := os.CopyFS(filepath.Join(dir, d), os.DirFS(filepath.Join(cfg.Repo, d))); err != nil {
			return "", fmt.Errorf("copying %s into %s's tree: %w", d, cfg.base, err)
		}
	}
	return buildViewrun(ctx, dir, filepath.Join(tmp, "viewrun-base"))
}

func mib(kib int64) float64 { return float64(kib) / 1024 }
