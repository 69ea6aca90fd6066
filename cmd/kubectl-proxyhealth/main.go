// Command kubectl-proxyhealth is a kubectl plugin (`kubectl proxyhealth` once it is on PATH):
// from an engineer's machine it reads every node's report (the ConfigMap each exporter writes
// with --node-report: its verdict as /status gives it, internal/nodereport) and prints one line
// per node: its verdict, its causes and its worst Service. With --service it shows which nodes
// have stale rules for that Service; with --node, one node's findings with their evidence.
//
// It needs, in the API: get and list ConfigMaps and list pods, in the exporters' namespace
// (deploy/components/kubectl-plugin, or the chart's kubectlPlugin.clusterRole). It reaches no
// exporter itself: no proxy right, no token, and scrape auth on the exporters changes nothing.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/common/version"
	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/proxyhealth/proxyhealth/internal/buildinfo"
	"github.com/proxyhealth/proxyhealth/internal/nodereport"
)

// defaultSelector matches the exporter pods of the Helm chart and of deploy/.
const defaultSelector = "app.kubernetes.io/name=proxyhealth"

// listPage is how many objects one list request asks for: each response is bounded
// (boundBodies) by this many reports at --max-status-bytes.
const listPage = 100

const usage = `kubectl proxyhealth: the proxyhealth verdict of every node, read from the reports the
exporters write (--node-report) in their namespace.

Usage:
  kubectl proxyhealth [flags]                          one line per node: verdict, causes, worst Service
  kubectl proxyhealth --node=NODE [flags]              that node's findings with their evidence
  kubectl proxyhealth --service=NAMESPACE/NAME [flags] the nodes with stale rules for that Service

Exit code, the worst node's verdict: 0 every node healthy; 1 only warnings; 2 a critical
finding on some node (with --service: stale rules for it on some node); 3 unknown: it could not
run, found no report, could not read some node's, found one too old (its exporter stopped), or
some node could not check a cause (with --service, could not judge stale rules for it).

Flags:
`

// options are the plugin's own flags.
type options struct {
	selector string
	service  string
	node     string
	output   string
	timeout  time.Duration
	// maxStatusBytes bounds each node's report read.
	maxStatusBytes int64
	clientConfig   clientcmd.ClientConfig
	// namespace is --namespace: only an explicit one narrows the search (the exporters live
	// in a namespace of their own, rarely the context's); "" is every namespace.
	namespace string
	version   bool
}

func main() {
	buildinfo.Set()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	opts, err := parseFlags(args, stderr)
	if errors.Is(err, pflag.ErrHelp) {
		return exitHealthy
	}
	if err != nil {
		fmt.Fprintf(stderr, "kubectl-proxyhealth: %s\n", printable(err.Error()))
		return exitCannotRun
	}
	if opts.version {
		fmt.Fprintln(stdout, version.Print("kubectl-proxyhealth"))
		return exitHealthy
	}
	code, err := opts.run(ctx, stdout)
	if err != nil {
		fmt.Fprintf(stderr, "kubectl-proxyhealth: %s\n", printable(err.Error()))
	}
	return code
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	fs := pflag.NewFlagSet("kubectl-proxyhealth", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	o := &options{}
	fs.StringVarP(&o.selector, "selector", "l", defaultSelector, "Label selector of the exporter pods.")
	fs.StringVar(&o.service, "service", "", "NAMESPACE/NAME: show which nodes have stale rules for this Service, per port.")
	fs.StringVar(&o.node, "node", "", "NODE: show that node's findings with their evidence, what it could not check, and its notes.")
	fs.StringVarP(&o.output, "output", "o", "text", "Output format: text or json.")
	fs.DurationVar(&o.timeout, "timeout", 30*time.Second, "Limit on reading the reports and listing the exporter pods, in all.")
	fs.Int64Var(&o.maxStatusBytes, "max-status-bytes", defaultMaxStatusBytes, "Largest node report read (bytes; the exporters write at most 32 KiB); a larger one is not read, and its node is reported unknown with the reason.")
	fs.BoolVar(&o.version, "version", false, "Print the version and exit.")

	// kubectl's connection flags: --kubeconfig, --context, --namespace/-n, --server, --token,
	// --as, ...
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	fs.StringVar(&rules.ExplicitPath, "kubeconfig", "", "Path to the kubeconfig file to use.")
	overrides := &clientcmd.ConfigOverrides{}
	clientcmd.BindOverrideFlags(overrides, fs, clientcmd.RecommendedConfigOverrideFlags(""))
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q (see --help)", fs.Args())
	}
	switch {
	case o.output != "text" && o.output != "json":
		return nil, fmt.Errorf("--output %q: want text or json", o.output)
	case o.service != "" && o.node != "":
		return nil, errors.New("--service and --node: give one")
	case o.timeout <= 0:
		return nil, errors.New("--timeout must be positive")
	case o.maxStatusBytes <= 0:
		return nil, errors.New("--max-status-bytes must be positive")
	}
	if _, err := labels.Parse(o.selector); err != nil {
		return nil, fmt.Errorf("--selector %q: %w", o.selector, err)
	}
	if o.service != "" {
		if _, _, err := splitService(o.service); err != nil {
			return nil, err
		}
	}
	o.clientConfig = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides)
	o.namespace = overrides.Context.Namespace
	return o, nil
}

func splitService(s string) (namespace, name string, err error) {
	namespace, name, ok := strings.Cut(s, "/")
	if !ok || namespace == "" || name == "" || strings.Contains(name, "/") {
		return "", "", fmt.Errorf("--service %q: want NAMESPACE/NAME", s)
	}
	return namespace, name, nil
}

func (o *options) run(ctx context.Context, stdout io.Writer) (int, error) {
	cfg, err := o.clientConfig.ClientConfig()
	if err != nil {
		return exitCannotRun, fmt.Errorf("kubeconfig: %w", err)
	}
	cfg.UserAgent = "kubectl-proxyhealth"
	// Every response is cut at a page of reports at their bound: what the API server returns
	// is written by the exporters.
	cfg = rest.CopyConfig(cfg)
	cfg.Wrap(boundBodies(listPage * (2*o.maxStatusBytes + 16<<10)))
	core, err := corev1client.NewForConfig(cfg)
	if err != nil {
		return exitCannotRun, fmt.Errorf("the API client: %w", err)
	}
	namespace := o.namespace
	// Bounded: kubectl's --request-timeout is 0 (none) unless given, and an API server that
	// never answers must not hang the plugin.
	lctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	// client-go logs a body it could not read whole; the error returned says it.
	lctx = klog.NewContext(lctx, logr.Discard())
	reports, err := listAll(lctx, core.ConfigMaps(namespace).List, nodereport.Selector)
	if err != nil {
		return exitCannotRun, fmt.Errorf("listing the node reports (%s): %w", where(namespace, nodereport.Selector), err)
	}
	pods, err := listAll(lctx, core.Pods(namespace).List, o.selector)
	if err != nil {
		return exitCannotRun, fmt.Errorf("listing the exporter pods (%s): %w", where(namespace, o.selector), err)
	}
	var cms []corev1.ConfigMap
	for _, l := range reports {
		cms = append(cms, l.Items...)
	}
	var ps []corev1.Pod
	for _, l := range pods {
		ps = append(ps, l.Items...)
	}
	if len(cms) == 0 && len(ps) == 0 {
		return exitCannotRun, fmt.Errorf("no node report (%s) and no exporter pod (selector %s) found; set --namespace or --selector", where(namespace, nodereport.Selector), o.selector)
	}
	nodes := join(cms, ps, int(o.maxStatusBytes), time.Now())
	sortNodes(nodes)

	switch {
	case o.node != "":
		return o.writeNode(stdout, nodes)
	case o.service != "":
		ns, name, _ := splitService(o.service)
		svcNodes, err := forService(nodes, ns, name)
		if err != nil {
			return exitCannotRun, err
		}
		if o.output == "json" {
			err = writeJSON(stdout, serviceJSON{Service: o.service, Nodes: svcNodes})
		} else {
			err = writeServiceText(stdout, o.service, svcNodes)
		}
		if err != nil {
			return exitCannotRun, err
		}
		return serviceExitCode(svcNodes), nil
	}
	if o.output == "json" {
		err = writeFleetJSON(stdout, nodes)
	} else {
		err = writeFleetText(stdout, nodes)
	}
	if err != nil {
		return exitCannotRun, err
	}
	return exitCode(nodes), nil
}

// writeNode prints --node's node: its row and its report whole. Exit code its verdict's.
func (o *options) writeNode(stdout io.Writer, nodes []nodeStatus) (int, error) {
	for _, n := range nodes {
		if n.Node != o.node {
			continue
		}
		var err error
		if o.output == "json" {
			err = writeJSON(stdout, nodeJSONOf(n))
		} else {
			err = writeNodeText(stdout, n)
		}
		if err != nil {
			return exitCannotRun, err
		}
		return n.verdict().ExitCode(), nil
	}
	return exitCannotRun, fmt.Errorf("no report of node %s, and no exporter pod on it", printable(o.node))
}

// listAll lists every page of one kind with selector, listPage at a time.
func listAll[L metav1.ListInterface](ctx context.Context, list func(context.Context, metav1.ListOptions) (L, error), selector string) ([]L, error) {
	var out []L
	opts := metav1.ListOptions{LabelSelector: selector, Limit: listPage}
	for {
		l, err := list(ctx, opts)
		if err != nil {
			return nil, err
		}
		out = append(out, l)
		if opts.Continue = l.GetContinue(); opts.Continue == "" {
			return out, nil
		}
	}
}

func where(namespace, selector string) string {
	if namespace == "" {
		return "selector " + selector + " in all namespaces"
	}
	return "selector " + selector + " in namespace " + namespace
}
