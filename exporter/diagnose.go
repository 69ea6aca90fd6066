package exporter

// `proxyhealth diagnose` through the exporter's collectors: they are built from the same
// flags, and their readings are handed to a diagnose.Diagnosis.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/proxyhealth/proxyhealth/collectors/conntrack"
	"github.com/proxyhealth/proxyhealth/collectors/kubeproxy"
	"github.com/proxyhealth/proxyhealth/collectors/rules"
	"github.com/proxyhealth/proxyhealth/exporter/diagnose"
	"github.com/proxyhealth/proxyhealth/internal/verdict"
)

// maxLogScanBytes bounds how much of each kube-proxy log file diagnose reads.
const maxLogScanBytes = 16 << 20

// runDiagnose builds the collectors the exporter's flags enable, looks at the node once and
// prints the result; it returns the exit code.
func runDiagnose(ctx context.Context, cfg diagnose.Config, flags *collectorFlags, logger *slog.Logger, stdout, stderr io.Writer) int {
	fail := func(err error) int {
		fmt.Fprintf(stderr, "proxyhealth diagnose: cannot diagnose: %v\n", err)
		return diagnose.ExitCannotDiagnose
	}
	if err := cfg.Validate(); err != nil {
		return fail(err)
	}
	flags.api.logger, flags.host.logger = logger, logger
	// The drift check's grace period is the window, and it compares at least every
	// driftCheckInterval; diagnose serves no series.
	flags.rules.CheckInterval, flags.rules.GracePeriod, flags.rules.MaxSeries = driftCheckInterval, cfg.Window, 1
	built, err := flags.build(logger)
	// Collectors that changed the node put it back when diagnose ends, as the exporter's do.
	defer built.Close(logger)
	if err != nil {
		if be, ok := errors.AsType[*buildError](err); ok {
			err = fmt.Errorf("build the %s collector: %w", be.collector, be.err)
		}
		return fail(err)
	}
	d := newDiagnosis(cfg, built, flags.api.cfg.NodeName)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	res, err := d.Run(ctx)
	if err != nil {
		return fail(err)
	}
	if err := res.Write(stdout, cfg.Output); err != nil {
		return fail(err)
	}
	code := diagnose.ExitCode(res.Report)
	if code == diagnose.ExitCannotDiagnose {
		io.WriteString(stderr, diagnose.NotCheckedMessage(res.Report))
	}
	return code
}

// newDiagnosis looks at the node through the collectors built as the exporter would, but
// kube-proxy is asked at the window's ends and its log read back rather than followed.
func newDiagnosis(cfg diagnose.Config, built *builtCollectors, nodeName string) *diagnose.Diagnosis[factSample] {
	src := sourcesOf(built, nodeName)
	kp, kpOn := enabled[*kubeproxy.Collector](built)
	var scanLog func(since time.Time) kubeproxy.LogScan
	if kpOn {
		scanLog = func(since time.Time) kubeproxy.LogScan { return kp.ScanLog(since, maxLogScanBytes) }
	}
	d := &diagnose.Diagnosis[factSample]{
		Config: cfg,
		Sample: src.sample,
		Input:  func(first, last factSample) verdict.Input { return diagnosisInput(src, cfg, first, last, scanLog) },
		Sleep:  diagnose.Sleep,
	}
	d.Start = func(ctx context.Context) {
		built.startReaders(ctx)
		for _, c := range built.named() {
			if c.runner != nil && c.name != kubeproxy.Name { // kube-proxy is asked, not followed
				go c.runner.Run(ctx)
			}
		}
	}
	d.Ready = func(ctx context.Context) { waitReady(ctx, cfg.SyncTimeout, src) }
	if kpOn {
		d.PollKubeProxy = kp.Poll
	}
	if rc, ok := enabled[*rules.Collector](built); ok {
		d.DriftReady = func() time.Time {
			if lc := rc.LastCheck(); lc.Compared && lc.Fresh && lc.Err == nil {
				return lc.At
			}
			return time.Time{}
		}
		settle := min(maxDriftSettle, built.api.ProbeCycle()+driftCheckInterval)
		d.DriftSettled = func(ctx context.Context, from time.Time) error {
			return waitDriftSettled(ctx, rc, from.Add(cfg.Window), settle)
		}
		d.Service = func(namespace, name string) ([]rules.PortEndpoints, error) {
			if built.api == nil || !built.api.Snapshot().Synced {
				return nil, errors.New("--service: the API view has not synced")
			}
			return rules.ServiceEndpoints(built.api.Snapshot(), built.host.State(), namespace, name), nil
		}
	}
	return d
}

// diagnosisInput judges from the readings at the window's ends, with kube-proxy's log read
// back over --log-since from the last one (scanLog, nil when the kubeproxy collector is off).
func diagnosisInput(src *factSources, cfg diagnose.Config, first, last factSample, scanLog func(since time.Time) kubeproxy.LogScan) verdict.Input {
	opts := inputOptions{logSpan: cfg.LogSince}
	if scanLog != nil {
		scan := scanLog(last.at.Add(-cfg.LogSince))
		opts.logScan = &scan
	}
	return src.input([]factSample{first, last}, opts)
}

// waitReady waits, at most timeout, until what the window starts from is there: the node's
// rules read, the API view fresh (when one is configured), the drift check run on it, and the
// conntrack listener subscribed.
func waitReady(ctx context.Context, timeout time.Duration, src *factSources) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		ready := true
		if src.host != nil && src.host.State() == nil {
			ready = false
		}
		if src.api != nil && src.api.Configured() && !src.api.Snapshot().Fresh {
			ready = false
		}
		if src.rules != nil && src.api != nil && src.api.Snapshot().Fresh {
			if lc := src.rules.LastCheck(); lc.At.IsZero() || !lc.Compared {
				ready = false
			}
		}
		if src.conntrack != nil && errors.Is(src.conntrack.Flows().Err, conntrack.ErrNotListening) {
			ready = false
		}
		if ready || diagnose.Sleep(ctx, 100*time.Millisecond) != nil {
			return
		}
	}
}

// driftCheckInterval is how often diagnose's drift check compares at least.
const driftCheckInterval = time.Second

// maxDriftSettle bounds the wait for the drift check at the window's end: with the default
// --api.probe-interval (15s), the next probe of the API view and its timeout take longer.
const maxDriftSettle = 15 * time.Second

// waitDriftSettled waits until the drift check ran at or after until with its API view
// confirmed current, so that every difference it counts lasted the whole window; at most
// within more: the time the view takes to prove itself current, or fail to (the next probe
// of the API and its timeout, then a check), no more than maxDriftSettle.
func waitDriftSettled(ctx context.Context, rc *rules.Collector, until time.Time, within time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	for {
		lc := rc.LastCheck()
		if !lc.At.Before(until) && lc.Compared && !lc.Unconfirmed {
			return nil
		}
		if diagnose.Sleep(ctx, 100*time.Millisecond) != nil {
			if lc.Unconfirmed {
				return errors.New("the API view could not be confirmed current at the end of the window: differences from kube-proxy's rules were not judged")
			}
			return errors.New("the drift check did not run at the end of the window")
		}
	}
}
