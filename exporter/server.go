package exporter

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/pprof"
	"strings"
	"time"

	"github.com/alecthomas/kingpin/v2"
)

// serverFlags are the HTTP server's settings beyond exporter-toolkit's.
type serverFlags struct {
	telemetryPath   string
	maxRequests     int
	exporterOwn     bool
	enablePprof     bool
	shutdownTimeout time.Duration
}

func (f *serverFlags) addFlags(app *kingpin.Application) {
	app.Flag("web.telemetry-path", "Path under which to expose metrics.").Default("/metrics").StringVar(&f.telemetryPath)
	app.Flag("web.max-requests", "Maximum number of parallel scrape requests. 0 disables the limit.").Default("40").IntVar(&f.maxRequests)
	app.Flag("web.disable-exporter-metrics", "Exclude the exporter's own process and Go runtime metrics.").BoolVar(&f.exporterOwn)
	app.Flag("web.enable-pprof", "Serve Go's profiler under /debug/pprof/ (behind the web config's TLS and auth). Off by default: a profile or trace costs CPU on the node, and the command line it shows may hold secrets.").BoolVar(&f.enablePprof)
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
