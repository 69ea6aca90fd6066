package exporter

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/pprof"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/proxyhealth/proxyhealth/internal/cluster"
	"github.com/proxyhealth/proxyhealth/internal/kubeauth"
)

// serverFlags are the HTTP server's settings beyond exporter-toolkit's.
type serverFlags struct {
	telemetryPath   string
	maxRequests     int
	exporterOwn     bool
	enablePprof     bool
	shutdownTimeout time.Duration
	kubeAuth        kubeAuthFlags
}

// kubeAuthFlags are --web.kubernetes-auth's settings.
type kubeAuthFlags struct {
	enabled           bool
	allowTTL, denyTTL time.Duration
	audiences         []string
}

// apiServerAudience, as a value of --web.kubernetes-auth.audience, stands for the API server's
// own audiences, read from the exporter's own token: those of a Prometheus's ServiceAccount
// token, which differ from cluster to cluster.
const apiServerAudience = "kube-apiserver"

func (f *serverFlags) addFlags(app *kingpin.Application) {
	app.Flag("web.telemetry-path", "Path under which to expose metrics.").Default("/metrics").StringVar(&f.telemetryPath)
	app.Flag("web.max-requests", "Maximum number of parallel scrape requests. 0 disables the limit.").Default("40").IntVar(&f.maxRequests)
	app.Flag("web.disable-exporter-metrics", "Exclude the exporter's own process and Go runtime metrics.").BoolVar(&f.exporterOwn)
	app.Flag("web.enable-pprof", "Serve Go's profiler under /debug/pprof/ (behind the web config's TLS and auth). Off by default: a profile or trace costs CPU on the node, and the command line it shows may hold secrets.").BoolVar(&f.enablePprof)
	app.Flag("web.kubernetes-auth", "Serve only callers with a Kubernetes bearer token (a TokenReview) whose user may get the request's path as a non-resource URL (a SubjectAccessReview), as kube-rbac-proxy does; every path is covered. Needs the API (--kubeconfig or in-cluster) and create on tokenreviews and subjectaccessreviews; cannot be combined with the web config's basic_auth_users.").
		BoolVar(&f.kubeAuth.enabled)
	app.Flag("web.kubernetes-auth.audience", "Accept only tokens for this audience (repeatable): the TokenReview's audiences. "+apiServerAudience+" stands for the API server's own, read from the exporter's own ServiceAccount token (a Prometheus's token is for those). None: the API server's own.").
		StringsVar(&f.kubeAuth.audiences)
	app.Flag("web.kubernetes-auth.allow-ttl", "How long an accepted token and an allowed request are remembered: taking a caller's access away takes effect within it.").
		Default(kubeauth.DefaultAllowTTL.String()).DurationVar(&f.kubeAuth.allowTTL)
	app.Flag("web.kubernetes-auth.deny-ttl", "How long a rejected token and a denied request are remembered: granting access takes effect within it.").
		Default(kubeauth.DefaultDenyTTL.String()).DurationVar(&f.kubeAuth.denyTTL)
	app.Flag("web.shutdown-timeout", "On SIGTERM, how long requests in flight may take to finish before their connections are closed (keep it under the pod's termination grace period).").Default("5s").DurationVar(&f.shutdownTimeout)
}

func (f *serverFlags) validate() error {
	p := f.telemetryPath
	switch {
	case !strings.HasPrefix(p, "/"):
		return fmt.Errorf("--web.telemetry-path must start with /, got %q", p)
	case strings.HasPrefix(p, "/debug/pprof/") || p == "/debug/pprof":
		return fmt.Errorf("--web.telemetry-path %q is under /debug/pprof/, the profiler's", p)
	case p == "/":
		return errors.New("--web.telemetry-path must not be /, the landing page's")
	case p == "/status":
		return errors.New("--web.telemetry-path must not be /status, the verdict's")
	case f.maxRequests < 0:
		return fmt.Errorf("--web.max-requests must not be negative, got %d", f.maxRequests)
	case f.shutdownTimeout <= 0:
		return fmt.Errorf("--web.shutdown-timeout must be positive, got %v", f.shutdownTimeout)
	case f.kubeAuth.allowTTL <= 0:
		return fmt.Errorf("--web.kubernetes-auth.allow-ttl must be positive, got %v", f.kubeAuth.allowTTL)
	case f.kubeAuth.denyTTL <= 0:
		return fmt.Errorf("--web.kubernetes-auth.deny-ttl must be positive, got %v", f.kubeAuth.denyTTL)
	case slices.Contains(f.kubeAuth.audiences, ""):
		return errors.New("--web.kubernetes-auth.audience must not be empty")
	}
	return nil
}

// newKubeAuth builds --web.kubernetes-auth's checks, asking the API server of api's
// configuration with its credentials. It reads files only; nothing contacts the API server.
func (f *kubeAuthFlags) newKubeAuth(api *cluster.Config, webConfigFile string, logger *slog.Logger) (*kubeauth.Auth, error) {
	if err := refuseBasicAuth(webConfigFile); err != nil {
		return nil, err
	}
	cfg, err := api.RESTConfig()
	if err != nil {
		return nil, fmt.Errorf("--web.kubernetes-auth needs the Kubernetes API: %w", err)
	}
	audiences, err := f.resolveAudiences(cfg)
	if err != nil {
		return nil, err
	}
	if len(audiences) > 0 {
		logger.Info("accepting tokens for these audiences only (--web.kubernetes-auth.audience)", "audiences", audiences)
	}
	reviewer, err := kubeauth.NewAPIReviewer(cfg, audiences)
	if err != nil {
		return nil, fmt.Errorf("--web.kubernetes-auth: %w", err)
	}
	auth, err := kubeauth.New(kubeauth.Config{AllowTTL: f.allowTTL, DenyTTL: f.denyTTL, Realm: "proxyhealth"}, reviewer, logger)
	if err != nil {
		return nil, fmt.Errorf("--web.kubernetes-auth: %w", err)
	}
	return auth, nil
}

// resolveAudiences is --web.kubernetes-auth.audience with apiServerAudience replaced by the
// audiences of the exporter's own token, each once.
func (f *kubeAuthFlags) resolveAudiences(cfg *rest.Config) ([]string, error) {
	var out []string
	for _, a := range f.audiences {
		if a != apiServerAudience {
			out = append(out, a)
			continue
		}
		own, err := kubeauth.APIServerAudiences(cfg)
		if err != nil {
			return nil, fmt.Errorf("--web.kubernetes-auth.audience=%s: the API server's audiences: %w; name them instead", apiServerAudience, err)
		}
		out = append(out, own...)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// refuseBasicAuth fails when the web config asks for basic auth: its users and a bearer token
// would both need the one Authorization header, so no request could pass both. TLS, client
// certificates and the other settings of the web config combine with the token check.
func refuseBasicAuth(webConfigFile string) error {
	if webConfigFile == "" {
		return nil
	}
	b, err := os.ReadFile(webConfigFile)
	if err != nil {
		return fmt.Errorf("--web.config.file: %w", err)
	}
	var webConfig struct {
		Users map[string]any `json:"basic_auth_users"`
	}
	if err := yaml.Unmarshal(b, &webConfig); err != nil {
		return fmt.Errorf("--web.config.file %s: %w", webConfigFile, err)
	}
	if len(webConfig.Users) > 0 {
		return fmt.Errorf("--web.kubernetes-auth cannot be combined with basic_auth_users in --web.config.file %s: both need the Authorization header", webConfigFile)
	}
	return nil
}

// newServer is the HTTP server with its limits: a client that sends its headers slowly, or
// never, holds a connection for ReadHeaderTimeout at most; one idle between requests for
// IdleTimeout. No write timeout: a profile runs for as long as it was asked to.
func newServer(handler http.Handler, logger *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		// TLS handshake errors and the like, in the exporter's log format.
		ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
}

// addPprof registers the profiler on mux.
func addPprof(mux *http.ServeMux) {
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
}
