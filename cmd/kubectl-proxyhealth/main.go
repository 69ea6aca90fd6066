// Command kubectl-proxyhealth is a kubectl plugin (`kubectl proxyhealth` once it is on PATH):
// from an engineer's machine it reads every proxyhealth exporter's verdict (GET /status)
// through the API server's pod proxy and prints one line per node: its verdict, its causes and
// its worst Service. With --service it shows which nodes have stale rules for that Service.
//
// It needs, in the API: list pods (in the exporters' namespace, or everywhere), get pods/proxy,
// and, for exporters with --web.kubernetes-auth, create on the viewer ServiceAccount's token
// (deploy/components/kubectl-plugin, or the chart's kubectlPlugin.clusterRole): the API server's
// pod proxy lets no Authorization header through, so the plugin sends a short-lived token of
// the viewer ServiceAccount in X-Proxyhealth-Token, which the exporter reviews as any other.
package main

import (
	"context"
	"encoding/json"
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
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/proxyhealth/proxyhealth/internal/buildinfo"
	"github.com/proxyhealth/proxyhealth/internal/podproxy"
)

// defaultSelector matches the exporter pods of the Helm chart and of deploy/.
const defaultSelector = "app.kubernetes.io/name=proxyhealth"

const usage = `kubectl proxyhealth: the proxyhealth verdict of every node, read from each exporter's /status
through the API server's pod proxy.

Usage:
  kubectl proxyhealth [flags]                          one line per node: verdict, causes, worst Service
  kubectl proxyhealth --service=NAMESPACE/NAME [flags] the nodes with stale rules for that Service

Exit code, the worst node's verdict: 0 every node healthy; 1 only warnings; 2 a critical
finding on some node (with --service: stale rules for it on some node); 3 unknown: it could not
run, found no exporter, could not read some node, or some node could not check a cause (with
--service, could not judge stale rules for it).

Flags:
`

// options are the plugin's own flags.
type options struct {
	selector string
	port     string
	scheme   string
	service  string
	output   string
	timeout  time.Duration
	parallel int
	// maxStatusBytes bounds each exporter's answer read through the pod proxy.
	maxStatusBytes int64
	// viewer and audience: the ServiceAccount whose token is sent to the exporters ("" for
	// none), and the token's audience.
	viewer, audience string
	clientConfig     clientcmd.ClientConfig
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
	fs.StringVar(&o.port, "port", "metrics", "The exporters' port: a number, or the name of a container port.")
	fs.StringVar(&o.scheme, "scheme", "http", "http, or https when the exporters serve TLS (--web.config.file); the API server does not verify their certificates.")
	fs.StringVar(&o.service, "service", "", "NAMESPACE/NAME: show which nodes have stale rules for this Service, per port.")
	fs.StringVarP(&o.output, "output", "o", "text", "Output format: text or json.")
	fs.DurationVar(&o.timeout, "timeout", 15*time.Second, "Limit on reading one exporter's /status, and on listing the exporter pods.")
	fs.IntVar(&o.parallel, "parallel", 16, "Exporters read at once.")
	fs.Int64Var(&o.maxStatusBytes, "max-status-bytes", defaultMaxStatusBytes, "Largest answer read from one exporter (bytes); a larger one is not read, and the node is reported unknown with the reason.")
	fs.StringVar(&o.viewer, "viewer-serviceaccount", "proxyhealth-viewer", "The ServiceAccount, in each exporter's namespace, whose short-lived token is sent to exporters with --web.kubernetes-auth (in the X-Proxyhealth-Token header; the pod proxy passes no Authorization). Empty: send none.")
	fs.StringVar(&o.audience, "token-audience", "proxyhealth", "The audience of that token: one the exporters' --web.kubernetes-auth.audience accepts. Empty: the API server's own.")
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
	case o.scheme != "http" && o.scheme != "https":
		return nil, fmt.Errorf("--scheme %q: want http or https", o.scheme)
	case o.timeout <= 0:
		return nil, errors.New("--timeout must be positive")
	case o.parallel <= 0:
		return nil, errors.New("--parallel must be positive")
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
	core, err := corev1client.NewForConfig(cfg)
	if err != nil {
		return exitCannotRun, fmt.Errorf("the API client: %w", err)
	}
	namespace := o.namespace
	// Bounded like each read: kubectl's --request-timeout is 0 (none) unless given, and an API
	// server that never answers must not hang the plugin.
	listCtx, cancel := context.WithTimeout(ctx, o.timeout)
	pods, err := core.Pods(namespace).List(listCtx, metav1.ListOptions{LabelSelector: o.selector})
	cancel()
	if err != nil {
		return exitCannotRun, fmt.Errorf("listing the exporter pods (%s): %w", where(namespace, o.selector), err)
	}
	if len(pods.Items) == 0 {
		return exitCannotRun, fmt.Errorf("no exporter pods found (%s); set --namespace or --selector", where(namespace, o.selector))
	}
	// The exporters' answers are read through a client of their own whose responses are cut
	// at --max-status-bytes; the pod list and the TokenRequests are the API server's.
	proxyCfg := rest.CopyConfig(cfg)
	proxyCfg.Wrap(boundBodies(o.maxStatusBytes))
	proxyCore, err := corev1client.NewForConfig(proxyCfg)
	if err != nil {
		return exitCannotRun, fmt.Errorf("the API client: %w", err)
	}
	nodes := readAll(ctx, pods.Items, o.proxyReader(proxyCore, newViewerTokens(core, o.viewer, o.audience, o.timeout)), o.parallel, o.timeout)
	sortNodes(nodes)

	if o.service != "" {
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

func where(namespace, selector string) string {
	if namespace == "" {
		return "selector " + selector + " in all namespaces"
	}
	return "selector " + selector + " in namespace " + namespace
}

// proxyReader reads /status through the API server's pod proxy:
// GET /api/v1/namespaces/NS/pods/[https:]NAME:PORT/proxy/status. It asks for the namespace's
// viewer token only when an exporter answers 401 (one with --web.kubernetes-auth), then reads
// that node again with it; later reads in the namespace send it at once.
func (o *options) proxyReader(core corev1client.CoreV1Interface, tokens *viewerTokens) statusReader {
	return func(ctx context.Context, pod *corev1.Pod) ([]byte, error) {
		port, err := podPort(pod, o.port)
		if err != nil {
			return nil, err
		}
		scheme := ""
		if o.scheme == "https" {
			scheme = "https"
		}
		// client-go logs a body it could not read whole; the error returned says it.
		ctx = klog.NewContext(ctx, logr.Discard())
		get := func(token string) ([]byte, error) {
			// As Pods().ProxyGet, with the header.
			req := core.RESTClient().Get().Namespace(pod.Namespace).Resource("pods").SubResource("proxy").
				Name(utilnet.JoinSchemeNamePort(scheme, pod.Name, port)).Suffix("status")
			if token != "" {
				req.SetHeader(podproxy.TokenHeader, token)
			}
			return req.DoRaw(ctx)
		}
		// Failing to get a token matters only when the exporter asks for one.
		token, _, tokenErr := tokens.cached(pod.Namespace)
		body, err := get(token)
		if apierrors.IsUnauthorized(err) && token == "" && tokenErr == nil {
			token, tokenErr = tokens.get(ctx, pod.Namespace)
			if token != "" {
				body, err = get(token)
			}
		}
		if tooLarge := (*answerTooLargeError)(nil); errors.As(err, &tooLarge) {
			return nil, fmt.Errorf("GET /status through the pod proxy: %w", tooLarge)
		}
		if err != nil {
			msg := err.Error()
			if detail := proxyErrorDetail(err, body); detail != "" {
				msg = detail
			}
			if apierrors.IsUnauthorized(err) {
				switch {
				case tokenErr != nil:
					msg += "; " + tokenErr.Error()
				case token != "":
					msg += fmt.Sprintf("; the exporter rejected the token of ServiceAccount %s/%s for audience %q (is it one of the exporter's --web.kubernetes-auth.audience?)",
						pod.Namespace, tokens.name, tokens.audience)
				}
			}
			return nil, fmt.Errorf("GET /status through the pod proxy: %s", msg)
		}
		return body, nil
	}
}

// proxyErrorDetail digs out why the pod proxy failed (the pod unreachable: "error trying to
// reach service: dial tcp ...: connection refused"), which client-go's error leaves in the
// response body (a Status, or text) or the status's causes rather than in its message; "" when
// there is nothing more than the message.
func proxyErrorDetail(err error, body []byte) string {
	var st metav1.Status
	text := strings.TrimSpace(string(body))
	if json.Unmarshal(body, &st) == nil && st.Kind == "Status" {
		text = st.Message
	}
	if text == "" {
		if status, ok := err.(apierrors.APIStatus); ok && status.Status().Details != nil {
			for _, c := range status.Status().Details.Causes {
				if m := strings.TrimSpace(c.Message); m != "" && m != "unknown" {
					text = m
					break
				}
			}
		}
	}
	if text == "" || strings.Contains(err.Error(), text) {
		return ""
	}
	if status, ok := err.(apierrors.APIStatus); ok && status.Status().Code != 0 {
		return fmt.Sprintf("HTTP %d: %s", status.Status().Code, text)
	}
	return text
}
