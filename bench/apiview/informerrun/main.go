// Command informerrun is the anchor viewrun is compared with: a client-go informer pair on
// Services and EndpointSlices (a shared informer factory from the clientset, no selectors,
// client-go's defaults: protobuf, streamed lists where the server offers them), as a program
// that watches the API the usual way holds them. It reports the same figures as viewrun
// (bench/apiview/internal/memrun); a service port is a Service's port, an endpoint a slice's
// endpoint.
//
// It prints one JSON object on stdout and logs to stderr.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/proxyhealth/proxyhealth/bench/apiview/internal/memrun"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "informerrun: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		kubeconfig       string
		ports, endpoints int
		opts             memrun.Options
	)
	flag.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig of the API server")
	flag.String("node-name", "", "ignored: the informers hold every object, as viewrun's flags are passed alike")
	flag.IntVar(&ports, "ports", 0, "service ports the informers must hold before they count as synced (the Services' ports)")
	flag.IntVar(&endpoints, "endpoints", 0, "endpoints the slices must hold before they count as synced")
	flag.DurationVar(&opts.Settle, "settle", 5*time.Second, "time after sync before the settled figures are read")
	flag.DurationVar(&opts.Timeout, "timeout", 10*time.Minute, "give up after this long")
	flag.StringVar(&opts.CPUProfile, "cpuprofile", "", "write a CPU profile of the start until sync to this file")
	flag.Parse()
	if kubeconfig == "" || ports < 1 {
		return fmt.Errorf("--kubeconfig and --ports are required")
	}
	var services, slices cache.SharedIndexInformer
	res, err := memrun.Measure(opts, memrun.Watcher{
		Start: func(ctx context.Context) error {
			cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
			if err != nil {
				return fmt.Errorf("reading %s: %w", kubeconfig, err)
			}
			client, err := kubernetes.NewForConfig(cfg)
			if err != nil {
				return fmt.Errorf("building the clientset: %w", err)
			}
			factory := informers.NewSharedInformerFactory(client, 0)
			services = factory.Core().V1().Services().Informer()
			slices = factory.Discovery().V1().EndpointSlices().Informer()
			factory.Start(ctx.Done())
			return nil
		},
		Synced: func() (bool, int, int) {
			if !services.HasSynced() || !slices.HasSynced() {
				return false, 0, 0
			}
			p, n := count(services.GetStore(), slices.GetStore())
			return p >= ports && n >= endpoints, p, n
		},
		Why: func() string {
			return fmt.Sprintf("services synced %v, slices synced %v", services.HasSynced(), slices.HasSynced())
		},
	})
	if err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(res)
}

// count returns the ClusterIP Services' ports and the slices' endpoints in the stores.
func count(services, slices cache.Store) (ports, endpoints int) {
	for _, o := range services.List() {
		if s, ok := o.(*corev1.Service); ok && s.Spec.ClusterIP != "" && s.Spec.ClusterIP != corev1.ClusterIPNone {
			ports += len(s.Spec.Ports)
		}
	}
	for _, o := range slices.List() {
		if s, ok := o.(*discoveryv1.EndpointSlice); ok {
			endpoints += len(s.Endpoints)
		}
	}
	return ports, endpoints
}
