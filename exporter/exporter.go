// Package exporter wires proxyhealth together: flags, logging, the collectors, the registry and
// the HTTP server, following the Prometheus exporter conventions (exporter-toolkit web config,
// promslog, --collector.<name> switches).
package exporter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	versioncollector "github.com/prometheus/client_golang/prometheus/collectors/version"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/common/promslog"
	promslogflag "github.com/prometheus/common/promslog/flag"
	"github.com/prometheus/common/version"
	"github.com/prometheus/exporter-toolkit/web"
	webflag "github.com/prometheus/exporter-toolkit/web/kingpinflag"

	phcollectors "github.com/proxyhealth/proxyhealth/collectors"
	"github.com/proxyhealth/proxyhealth/internal/capability"
)

// DefaultListenAddress is proxyhealth's port in the Prometheus default port allocations style.
const DefaultListenAddress = ":9869"

// Main parses args, runs the exporter until SIGINT/SIGTERM and returns the process exit code.
func Main(args []string) int {
	app := kingpin.New("proxyhealth", "Prometheus exporter that tells whether Service traffic on this node is silently breaking, and why.")
	var (
		telemetryPath = app.Flag("web.telemetry-path", "Path under which to expose metrics.").Default("/metrics").String()
		maxRequests   = app.Flag("web.max-requests", "Maximum number of parallel scrape requests. 0 disables the limit.").Default("40").Int()
		exporterOwn   = app.Flag("web.disable-exporter-metrics", "Exclude the exporter's own process and Go runtime metrics.").Bool()
		webConfig     = webflag.AddFlags(app, DefaultListenAddress)
		paths         = addPathFlags(app)
	)
	regs, api, host := registrations(app, paths)
	promslogConfig := &promslog.Config{}
	promslogflag.AddFlags(app, promslogConfig)
	app.Version(version.Print("proxyhealth"))
	app.HelpFlag.Short('h')
	if _, err := app.Parse(args); err != nil {
		fmt.Fprintf(os.Stderr, "proxyhealth: %v\n", err)
		return 2
	}
	logger := promslog.New(promslogConfig)
	logger.Info("starting proxyhealth", "version", version.Info(), "build_context", version.BuildContext())
	logger.Info("capabilities", capability.LogAttrs()...)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	api.logger, host.logger = logger, logger
	built := make(map[string]phcollectors.Collector)
	for _, r := range regs {
		if !*r.enabled {
			logger.Info("collector disabled", "collector", r.name)
			continue
		}
		c, err := r.build(logger.With("collector", r.name))
		if err != nil {
			// A collector that cannot even be built is a configuration error (a bad flag value),
			// not a missing node feature: those are reported by Update.
			logger.Error("cannot build collector", "collector", r.name, "err", err)
			return 1
		}
		built[r.name] = c
		if runner, ok := c.(phcollectors.Runner); ok {
			go runner.Run(ctx)
		}
		logger.Info("collector enabled", "collector", r.name)
	}
	if api.view != nil {
		go api.view.Run(ctx)
	}
	set := newCollectorSet(built, logger)

	registry := prometheus.NewRegistry()
	registry.MustRegister(versioncollector.NewCollector("proxyhealth"), set)
	if host.source != nil {
		go host.source.Run(ctx)
		registry.MustRegister(host.source)
	}
	if !*exporterOwn {
		registry.MustRegister(
			collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
			collectors.NewGoCollector(),
		)
	}

	// One collection shortly after start-up (background work has had its first try by then),
	// so that what this node cannot be checked for is in the log before the first scrape.
	go func() {
		select {
		case <-ctx.Done():
		case <-time.After(2 * time.Second):
			probeOnce(set)
		}
	}()

	mux := http.NewServeMux()
	mux.Handle(*telemetryPath, promhttp.HandlerFor(registry, promhttp.HandlerOpts{
		ErrorLog:            slog.NewLogLogger(logger.Handler(), slog.LevelError),
		ErrorHandling:       promhttp.ContinueOnError,
		MaxRequestsInFlight: *maxRequests,
		Registry:            registry,
	}))
	// Profiles, as the landing page links them; behind the same web config (TLS, auth).
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	if *telemetryPath != "/" {
		mux.Handle("/", landingPage(*telemetryPath, set))
	}

	server := &http.Server{Handler: mux}
	errc := make(chan error, 1)
	go func() { errc <- web.ListenAndServe(server, webConfig, logger) }()
	select {
	case err := <-errc:
		logger.Error("HTTP server stopped", "err", err)
		return 1
	case <-ctx.Done():
		logger.Info("shutting down")
		if err := server.Shutdown(context.Background()); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error("HTTP server shutdown", "err", err)
		}
		return 0
	}
}

func probeOnce(set *collectorSet) {
	ch := make(chan prometheus.Metric)
	done := make(chan struct{})
	go func() {
		for range ch {
		}
		close(done)
	}()
	set.Collect(ch)
	close(ch)
	<-done
}
