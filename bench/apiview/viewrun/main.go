// Command viewrun runs proxyhealth's API view (internal/cluster) alone against an API server
// and reports what it cost: peak resident memory (VmHWM), the Go heap, and the time until the
// view held every expected service port (bench/apiview/internal/memrun). bench/apiview starts
// it once per build being compared; it uses only the package's long-standing exported API
// (New, Run, Snapshot, LastError) so that the same file builds against older trees of the
// repository too.
//
// It prints one JSON object on stdout and logs to stderr.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/proxyhealth/proxyhealth/bench/apiview/internal/memrun"
	"github.com/proxyhealth/proxyhealth/internal/cluster"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "viewrun: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		kubeconfig, nodeName string
		ports, endpoints     int
		opts                 memrun.Options
		verbose              bool
	)
	flag.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig of the API server")
	flag.StringVar(&nodeName, "node-name", "", "this node's name")
	flag.IntVar(&ports, "ports", 0, "service ports the view must hold before it counts as synced")
	flag.IntVar(&endpoints, "endpoints", 0, "cluster endpoints the view must hold (all ports together) before it counts as synced")
	flag.DurationVar(&opts.Settle, "settle", 5*time.Second, "time after sync before the settled figures are read")
	flag.DurationVar(&opts.Timeout, "timeout", 10*time.Minute, "give up after this long")
	flag.BoolVar(&verbose, "v", false, "log the view's own log lines to stderr")
	flag.StringVar(&opts.CPUProfile, "cpuprofile", "", "write a CPU profile of the start until sync to this file")
	flag.Parse()
	if kubeconfig == "" || nodeName == "" || ports < 1 {
		return fmt.Errorf("--kubeconfig, --node-name and --ports are required")
	}
	out := io.Discard
	if verbose {
		out = os.Stderr
	}
	var (
		view    *cluster.Cluster
		start   time.Time
		freshAt time.Duration
	)
	noteFresh := func() {
		if freshAt == 0 && view.Snapshot().Fresh {
			freshAt = time.Since(start)
		}
	}
	res, err := memrun.Measure(opts, memrun.Watcher{
		Start: func(ctx context.Context) error {
			start = time.Now()
			var err error
			view, err = cluster.New(cluster.Config{
				Kubeconfig:    kubeconfig,
				NodeName:      nodeName,
				FreshWithin:   60 * time.Second,
				ProbeInterval: 15 * time.Second,
			}, slog.New(slog.NewTextHandler(out, nil)))
			if err != nil {
				return err
			}
			go view.Run(ctx)
			return nil
		},
		Synced: func() (bool, int, int) {
			noteFresh()
			s := view.Snapshot()
			n := 0
			for _, p := range s.Ports {
				n += len(p.ClusterEndpoints)
			}
			return s.Synced && len(s.Ports) >= ports && n >= endpoints, len(s.Ports), n
		},
		Settled: func(deadline time.Time) {
			for noteFresh(); freshAt == 0 && time.Now().Before(deadline); noteFresh() {
				time.Sleep(20 * time.Millisecond)
			}
		},
		Why: func() string {
			return fmt.Sprintf("synced %v, last error %v", view.Snapshot().Synced, view.LastError())
		},
	})
	if err != nil {
		return err
	}
	res.FreshSeconds = freshAt.Seconds()
	return json.NewEncoder(os.Stdout).Encode(res)
}
