package cluster

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Config holds the API view's settings; AddFlags binds them to command-line flags.
type Config struct {
	Kubeconfig    string
	NodeName      string
	FreshWithin   time.Duration
	ProbeInterval time.Duration

	// Not flags; zero means the default. Tests shorten them.
	ProbeTimeout      time.Duration // default 5s, never more than ProbeInterval
	RecomputeInterval time.Duration // least time between two recomputed snapshots, default 250ms
}

// AddFlags registers the API view's flags on app.
func (c *Config) AddFlags(app *kingpin.Application) {
	app.Flag("kubeconfig", "Path to a kubeconfig file for the Kubernetes API. Empty: the in-cluster service account, else $KUBECONFIG.").
		Default("").StringVar(&c.Kubeconfig)
	app.Flag("node-name", "Name of this node's Node object: endpoints on it are local, and its topology.kubernetes.io/zone label selects topology hints. Defaults to $NODE_NAME, then the host name.").
		Envar("NODE_NAME").Default("").StringVar(&c.NodeName)
	app.Flag("api.fresh-within", "The API view counts as fresh (proxyhealth_api_view_fresh, and drift is reported) only while the API server answered within this long.").
		Default("60s").DurationVar(&c.FreshWithin)
	app.Flag("api.probe-interval", "How often a cheap request on the API view's own connection proves it still works when no watch event arrives.").
		Default("15s").DurationVar(&c.ProbeInterval)
}

func (c *Config) setDefaults() error {
	switch {
	case c.FreshWithin <= 0:
		return errors.New("--api.fresh-within must be positive")
	case c.ProbeInterval <= 0:
		return errors.New("--api.probe-interval must be positive")
	}
	if c.ProbeTimeout <= 0 {
		c.ProbeTimeout = 5 * time.Second
	}
	c.ProbeTimeout = min(c.ProbeTimeout, c.ProbeInterval)
	if c.RecomputeInterval <= 0 {
		c.RecomputeInterval = 250 * time.Millisecond
	}
	if c.NodeName == "" {
		// kingpin already read $NODE_NAME; a DaemonSet sets it from spec.nodeName, the
		// host name is right on most other setups.
		host, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("no --node-name or $NODE_NAME, and reading the host name: %w", err)
		}
		c.NodeName = host
	}
	return nil
}

// errNoAPI is wrapped by the error returned when no way to reach the API is configured.
var errNoAPI = errors.New("no Kubernetes API configured")

// RESTConfig is the client configuration for the API server every proxyhealth client is built
// from: --kubeconfig, else the in-cluster service account, else $KUBECONFIG, asking for
// protobuf. It reads files only; nothing contacts the API server. Each call returns a new
// Config, which the caller may change; a typed client of any API group can be built from it
// (NewForConfig) next to the view, which changes only its own copy.
func (c *Config) RESTConfig() (*rest.Config, error) {
	cfg, err := c.loadRestConfig()
	if err != nil {
		return nil, err
	}
	// Protobuf is several times smaller and cheaper to decode than JSON at 100,000
	// endpoints; JSON stays acceptable for the odd response that has no protobuf form.
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	cfg.UserAgent = "proxyhealth"
	// No overall request timeout: it would cut watches short. The probe has its own.
	cfg.Timeout = 0
	return cfg, nil
}

func (c *Config) loadRestConfig() (*rest.Config, error) {
	if c.Kubeconfig != "" {
		cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("loading --kubeconfig %s: %w", c.Kubeconfig, err)
		}
		return cfg, nil
	}
	cfg, inClusterErr := rest.InClusterConfig()
	if inClusterErr == nil {
		return cfg, nil
	}
	path := os.Getenv("KUBECONFIG")
	if path == "" {
		return nil, fmt.Errorf("%w: not running in a cluster (%v), and neither --kubeconfig nor $KUBECONFIG is set", errNoAPI, inClusterErr)
	}
	// $KUBECONFIG may list several files, as for kubectl.
	rules := &clientcmd.ClientConfigLoadingRules{Precedence: clientcmd.NewDefaultClientConfigLoadingRules().Precedence}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("loading $KUBECONFIG %s: %w", path, err)
	}
	return cfg, nil
}
