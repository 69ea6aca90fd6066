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
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/promslog"
	"github.com/prometheus/common/version"
	"github.com/prometheus/exporter-toolkit/web"

	"github.com/proxyhealth/proxyhealth/exporter/diagnose"
	"github.com/proxyhealth/proxyhealth/internal/capability"
	"github.com/proxyhealth/proxyhealth/internal/kubeauth"
)

// DefaultListenAddress is proxyhealth's port in the Prometheus default port allocations style.
const DefaultListenAddress = ":9869"

// defaultMemProfileRate is Go's runtime.MemProfileRate: one sample every 512 KiB allocated.
const defaultMemProfileRate = 512 * 1024

// allocationSampling is the runtime.MemProfileRate to run with, given whether the profiler is
// served and the rate the process started with.
func allocationSampling(pprof bool, rate int) int {
	switch {
	case !pprof:
		// Nothing reads heap profiles: no sampling, whose records would otherwise grow with
		// every new allocation site for the process's life. (The runtime's 1.4 MiB table of
		// them is made at the first sampled allocation, before main runs; the image sets
		// GODEBUG=memprofilerate=0 to avoid that too.)
		return 0
	case rate == 0:
		// The profiler is asked for in an environment that turned sampling off from the start
		// (the image's GODEBUG): heap profiles need it back, at Go's default rate.
		return defaultMemProfileRate
	}
	return rate
}

// Main parses args, runs the exporter until SIGINT/SIGTERM (or diagnose once) and returns the
// process exit code.
func Main(args []string) int {
	cl := newCommandLine()
	cmd, err := cl.parse(args)
	if err != nil {
		fmt.Fprintf(os.Stderr, "proxyhealth: %v\n", err)
		if diagnose.Wanted(args) {
			return diagnose.ExitCannotDiagnose
		}
		return 2
	}
	if cmd == cl.diagnoseCmd.FullCommand() {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
		defer stop()
		logger := diagnose.Logger(args, cl.promslogConfig)
		return runDiagnose(ctx, *cl.diagnoseCfg, cl.collectors, logger, os.Stdout, os.Stderr)
	}
	if cmd == cl.stateDirCmd.FullCommand() {
		if err := prepareStateDir(cl.collectors.conntrack.InvalidReasonsStateDir, *cl.stateDirOwner); err != nil {
			fmt.Fprintf(os.Stderr, "proxyhealth: %v\n", err)
			return 1
		}
		return 0
	}
	if err := cl.validateServe(); err != nil {
		fmt.Fprintf(os.Stderr, "proxyhealth: %v\n", err)
		return 2
	}
	return cl.serve()
}

// parse parses args into the command line's flags and checks the server's; it returns the
// command chosen.
func (cl *commandLine) parse(args []string) (string, error) {
	cmd, err := cl.app.Parse(args)
	if err != nil {
		return "", nameBadFlag(args, err)
	}
	if err := cl.srv.validate(); err != nil {
		return "", err
	}
	return cmd, nil
}

// validateServe checks the flags only the exporter uses.
func (cl *commandLine) validateServe() error {
	if cl.statusCfg.Window <= 0 {
		return errors.New("--status.window must be positive")
	}
	if err := cl.conditions.validate(); err != nil {
		return err
	}
	return cl.report.validate()
}

// serve runs the exporter until SIGINT/SIGTERM: it builds the collectors, starts their
// background work and serves them.
func (cl *commandLine) serve() int {
	srv := cl.srv
	runtime.MemProfileRate = allocationSampling(srv.enablePprof, runtime.MemProfileRate)
	logger := promslog.New(cl.promslogConfig)
	logger.Info("starting proxyhealth", "version", version.Info(), "build_context", version.BuildContext())
	logger.Info("capabilities", capability.LogAttrs()...)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ignoreSIGHUP(ctx, logger)

	built, auth, err := cl.build(logger)
	if built != nil {
		// Collectors that changed the node (--conntrack.invalid-reasons) put it back on every
		// way out, without waiting for their background work, which the process's end would
		// cut short. Close may be called more than once.
		defer built.Close(logger)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "proxyhealth: %v\n", err)
		return 2
	}
	handler := cl.start(ctx, built, auth, logger)

	server := newServer(handler, logger)
	errc := make(chan error, 1)
	go func() { errc <- web.ListenAndServe(server, cl.webConfig, logger) }()
	select {
	case err := <-errc:
		logger.Error("HTTP server stopped", "err", err)
		return 1
	case <-ctx.Done():
		logger.Info("shutting down", "budget", srv.shutdownTimeout)
		// The node is put back first: the shutdown budget may be all the grace period left.
		built.Close(logger)
		return shutdown(server, srv.shutdownTimeout, logger)
	}
}

// ignoreSIGHUP says and ignores SIGHUP until ctx is done: it would end the process silently,
// and there is nothing to reload (every setting is a flag).
func ignoreSIGHUP(ctx context.Context, logger *slog.Logger) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		defer signal.Stop(hup)
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				logger.Info("SIGHUP ignored: proxyhealth has no configuration to reload (every setting is a flag; restart to change one)")
			}
		}
	}()
}

// build makes the enabled collectors and, with --web.kubernetes-auth, the request checker;
// nothing starts. A collector that cannot be built returns what was built so far (to be
// closed) and the error; a bad flag stops the exporter here, before anything starts.
func (cl *commandLine) build(logger *slog.Logger) (*builtCollectors, *kubeauth.Auth, error) {
	api, host := cl.collectors.api, cl.collectors.host
	api.logger, host.logger = logger, logger
	for _, name := range cl.collectors.disabled() {
		logger.Info("collector disabled", "collector", name)
	}
	built, err := cl.collectors.build(logger)
	if err != nil {
		// A collector that cannot even be built is a configuration error (a bad flag value),
		// not a missing node feature: those are reported by Update.
		return nil, nil, err
	}
	if !cl.srv.kubeAuth.enabled {
		return built, nil, nil
	}
	auth, err := cl.srv.kubeAuth.newKubeAuth(&api.cfg, *cl.webConfig.WebConfigFile, logger.With("component", "kubernetes-auth"))
	if err != nil {
		return built, nil, err
	}
	return built, auth, nil
}

// start starts the collectors' background work, the verdict and, with --node-conditions and
// --node-report, its publication, and returns the handler of every path served.
func (cl *commandLine) start(ctx context.Context, built *builtCollectors, auth *kubeauth.Auth, logger *slog.Logger) http.Handler {
	srv := cl.srv
	for _, c := range built.named() {
		if c.runner != nil {
			go c.runner.Run(ctx)
		}
		logger.Info("collector enabled", "collector", c.name)
	}
	built.startReaders(ctx)
	set := newCollectorSet(built.byName(), logger)
	// The verdict (/status and the landing page) reads the collectors' last results.
	judge := newStatus(sourcesOf(built, cl.collectors.api.cfg.NodeName), cl.statusCfg.Window)
	go judge.run(ctx)

	registry := newRegistry(set, !srv.exporterOwn)
	built.registerReaders(registry)
	if cl.conditions.Enabled {
		if pub := startNodeConditions(ctx, cl.conditions, cl.collectors.api, judge, logger); pub != nil {
			registry.MustRegister(pub)
		}
	}
	if cl.report.Enabled {
		if w := startNodeReport(ctx, cl.report, cl.collectors.api, judge, logger); w != nil {
			registry.MustRegister(w)
		}
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
	mux.Handle(srv.telemetryPath, metricsHandler(registry, logger, srv.maxRequests))
	if srv.enablePprof {
		// Behind the same web config (TLS, auth) as everything else.
		addPprof(mux)
		logger.Warn("the profiler is served under /debug/pprof/ (--web.enable-pprof)")
	}
	mux.Handle("/status", judge)
	mux.Handle("/", landingPage(srv.telemetryPath, srv.enablePprof, set, judge))
	if auth == nil {
		return mux
	}
	// Every path: the landing page and /status show what /metrics does (services, the node's
	// faults), pprof more. The probes are tcpSocket and need no path.
	registry.MustRegister(auth)
	logger.Info("every request needs a Kubernetes bearer token allowed to get its path (--web.kubernetes-auth)",
		"allow_ttl", srv.kubeAuth.allowTTL, "deny_ttl", srv.kubeAuth.denyTTL)
	return auth.Wrap(mux)
}

// nameBadFlag adds the flag to a parse error that does not name it: kingpin passes a value's
// own error on as it is ("time: invalid duration \"soon\""), which names only the value.
func nameBadFlag(args []string, err error) error {
	msg := err.Error()
	for i, a := range args {
		name, value, hasValue := strings.Cut(a, "=")
		if !strings.HasPrefix(name, "--") || strings.Contains(msg, name) {
			continue
		}
		if !hasValue {
			if i+1 >= len(args) {
				continue
			}
			value = args[i+1]
		}
		if strings.Contains(msg, strconv.Quote(value)) {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	return err
}

// shutdown stops the server: new connections are refused at once, requests in flight get
// budget to finish, and whatever is left then is closed.
func shutdown(server *http.Server, budget time.Duration, logger *slog.Logger) int {
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	err := server.Shutdown(ctx)
	switch {
	case err == nil, errors.Is(err, http.ErrServerClosed):
	case errors.Is(err, context.DeadlineExceeded):
		logger.Warn("requests still in flight after the shutdown budget; closing their connections", "budget", budget)
		_ = server.Close()
	default:
		logger.Error("HTTP server shutdown", "err", err)
	}
	return 0
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
