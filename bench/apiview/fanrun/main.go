// Command fanrun runs --count watchers of the Services and EndpointSlices of one API server in
// one process, each on a connection of its own as each node's would be: proxyhealth's API
// views (--kind view) or plain client-go informers on both resources (--kind informer).
// bench/apiview fanout starts it to measure what the watchers cost the API server. It prints
// one JSON line once every watcher is synced, then runs until it is signalled.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/proxyhealth/proxyhealth/internal/cluster"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "fanrun: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		kubeconfig, nodeName, kind string
		count, ports               int
		timeout                    time.Duration
	)
	flag.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig of the API server")
	flag.StringVar(&nodeName, "node-name", "", "the views' node")
	flag.StringVar(&kind, "kind", "view", "view: proxyhealth's API view; informer: client-go informers on Services and EndpointSlices")
	flag.IntVar(&count, "count", 1, "watchers, each on its own connection")
	flag.IntVar(&ports, "ports", 1, "service ports a view must hold to count as synced")
	flag.DurationVar(&timeout, "timeout", 15*time.Minute, "give up syncing after this long")
	flag.Parse()
	if kubeconfig == "" || nodeName == "" || count < 1 {
		return fmt.Errorf("--kubeconfig, --node-name and a positive --count are required")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	syncCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	start := time.Now()
	var wg sync.WaitGroup
	defer wg.Wait()
	var err error
	switch kind {
	case "view":
		err = startViews(ctx, syncCtx, &wg, kubeconfig, nodeName, count, ports)
	case "informer":
		err = startInformers(ctx, syncCtx, &wg, kubeconfig, count)
	default:
		err = fmt.Errorf("--kind %q: want view or informer", kind)
	}
	if err != nil {
		stop()
		return err
	}
	if err := json.NewEncoder(os.Stdout).Encode(map[string]float64{"sync_seconds": time.Since(start).Seconds()}); err != nil {
		return err
	}
	<-ctx.Done()
	return nil
}

// startViews starts count API views and returns once each holds ports service ports.
func startViews(ctx, syncCtx context.Context, wg *sync.WaitGroup, kubeconfig, nodeName string, count, ports int) error {
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	views := make([]*cluster.Cluster, count)
	for i := range views {
		v, err := cluster.New(cluster.Config{Kubeconfig: kubeconfig, NodeName: nodeName, FreshWithin: time.Minute, ProbeInterval: 15 * time.Second}, logger)
		if err != nil {
			return err
		}
		views[i] = v
		wg.Go(func() { v.Run(ctx) })
	}
	for i, v := range views {
		for {
			s := v.Snapshot()
			if s.Synced && len(s.Ports) >= ports {
				break
			}
			select {
			case <-syncCtx.Done():
				return fmt.Errorf("view %d not synced: %d ports, last error %v", i, len(s.Ports), v.LastError())
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	return nil
}

// startInformers starts count informer factories, each with informers on Services and
// EndpointSlices (no selectors, client-go's default content type), and returns once all have
// synced. Each has a transport of its own: client-go would otherwise give clients of equal TLS
// settings one shared transport, hence one connection, which no two nodes share.
func startInformers(ctx, syncCtx context.Context, wg *sync.WaitGroup, kubeconfig string, count int) error {
	var synced []cache.InformerSynced
	for range count {
		cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return err
		}
		cfg.Proxy = http.ProxyFromEnvironment // a config with a Proxy function gets its own transport
		client, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return err
		}
		factory := informers.NewSharedInformerFactory(client, 0)
		synced = append(synced,
			factory.Core().V1().Services().Informer().HasSynced,
			factory.Discovery().V1().EndpointSlices().Informer().HasSynced)
		factory.Start(ctx.Done())
		wg.Go(func() { <-ctx.Done(); factory.Shutdown() })
	}
	if !cache.WaitForCacheSync(syncCtx.Done(), synced...) {
		return fmt.Errorf("informers not synced")
	}
	return nil
}
