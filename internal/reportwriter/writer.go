// Package reportwriter keeps a node's report (internal/nodereport) in the API: the ConfigMap
// `kubectl proxyhealth` reads in place of each exporter's /status, so that the plugin needs no
// proxy right. Writes are bounded: one when the verdict's story changes (the verdict, its
// findings' causes, severities and Service ports, the causes not checked), else one per
// heartbeat; never two within the minimum interval; each at most nodereport.MaxBytes.
package reportwriter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	"github.com/proxyhealth/proxyhealth/internal/metricdesc"
	"github.com/proxyhealth/proxyhealth/internal/nodereport"
	"github.com/proxyhealth/proxyhealth/internal/periodic"
	"github.com/proxyhealth/proxyhealth/internal/verdict"
)

// Config is the writer's settings.
type Config struct {
	// NodeName is the node reported on; Namespace where its report is written.
	NodeName, Namespace string
	// MinInterval is the least time between two writes (or tries) of the report: the bound on
	// what one node writes, however often its verdict changes.
	MinInterval time.Duration
	// Heartbeat: the report is rewritten at least this often (its counts and times brought
	// up to date, and its age telling readers the exporter runs), and no more often while its
	// story stays the same.
	Heartbeat time.Duration
	// MaxBytes bounds the report (default nodereport.MaxBytes).
	MaxBytes int
}

// Writer keeps one node's report. Write is called from one goroutine; the metrics may be
// collected concurrently.
type Writer struct {
	cfg    Config
	api    API
	logger *slog.Logger
	now    func() time.Time

	nodeUID   types.UID
	story     *story // the story of the report last written; nil before the first
	lastWrite time.Time
	lastTry   time.Time
	failing   string // the last failure logged, "" while writes succeed

	writes *prometheus.CounterVec
	bytes  prometheus.Gauge
}

// New returns a writer for cfg that talks to api (NewAPI).
func New(api API, cfg Config, logger *slog.Logger) (*Writer, error) {
	switch {
	case cfg.NodeName == "":
		return nil, errors.New("no node name")
	case cfg.Namespace == "":
		return nil, errors.New("no namespace to write the report in")
	case cfg.MinInterval <= 0:
		return nil, errors.New("the minimum interval must be positive")
	case cfg.Heartbeat < cfg.MinInterval:
		return nil, fmt.Errorf("the heartbeat (%v) must not be shorter than the minimum interval (%v)", cfg.Heartbeat, cfg.MinInterval)
	}
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = nodereport.MaxBytes
	}
	w := &Writer{
		cfg: cfg, api: api, logger: logger, now: time.Now,
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: metricdesc.Namespace, Subsystem: "node_report", Name: "writes_total",
			Help: "Writes of this node's report ConfigMap (--node-report), by result (success, error).",
		}, []string{"result"}),
		bytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: metricdesc.Namespace, Subsystem: "node_report", Name: "bytes",
			Help: "Size of the report last written (its status.json, --node-report); 0 before the first.",
		}),
	}
	for _, r := range []string{"success", "error"} {
		w.writes.WithLabelValues(r)
	}
	return w, nil
}

// Describe implements prometheus.Collector.
func (w *Writer) Describe(ch chan<- *prometheus.Desc) {
	w.writes.Describe(ch)
	w.bytes.Describe(ch)
}

// Collect implements prometheus.Collector.
func (w *Writer) Collect(ch chan<- prometheus.Metric) {
	w.writes.Collect(ch)
	w.bytes.Collect(ch)
}

// Run writes report() as due, looking every interval, until ctx is done; each round's API
// calls get timeout.
func (w *Writer) Run(ctx context.Context, interval, timeout time.Duration, report func() verdict.Report) {
	periodic.Every(ctx, interval, func() {
		rctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		w.Write(rctx, report())
	})
}

// Write brings the report up to rep when due: at once when its story changed (and the last
// try is MinInterval old), at the heartbeat otherwise. Failures are logged once each, counted,
// and tried again after MinInterval.
func (w *Writer) Write(ctx context.Context, rep verdict.Report) {
	now := w.now()
	s := storyOf(rep)
	due := w.story == nil || !s.equal(*w.story) || now.Sub(w.lastWrite) >= w.cfg.Heartbeat
	if !due || (!w.lastTry.IsZero() && now.Sub(w.lastTry) < w.cfg.MinInterval) {
		return
	}
	w.lastTry = now
	n, err := w.write(ctx, rep)
	if err != nil {
		w.writes.WithLabelValues("error").Inc()
		if msg := err.Error(); msg != w.failing {
			w.logger.Error("cannot write the node's report; the exporter keeps serving, and retries", "node", w.cfg.NodeName,
				"namespace", w.cfg.Namespace, "retry_after", w.cfg.MinInterval, "err", err)
			w.failing = msg
		}
		return
	}
	w.writes.WithLabelValues("success").Inc()
	w.bytes.Set(float64(n))
	if w.failing != "" {
		w.logger.Info("the node's report is written again", "node", w.cfg.NodeName, "namespace", w.cfg.Namespace)
		w.failing = ""
	}
	if w.story == nil || w.story.verdict != s.verdict {
		w.logger.Info("node report", "node", w.cfg.NodeName, "object", w.cfg.Namespace+"/"+nodereport.Name(w.cfg.NodeName), "verdict", s.verdict, "bytes", n)
	}
	w.story, w.lastWrite = &s, now
}

// write replaces the report's ConfigMap with rep, creating it when missing, and returns the
// report's size. The whole object is written (an update without resourceVersion): the node's
// exporter is its only writer.
func (w *Writer) write(ctx context.Context, rep verdict.Report) (int, error) {
	if w.nodeUID == "" {
		node, err := w.api.GetNode(ctx, w.cfg.NodeName)
		if err != nil {
			return 0, fmt.Errorf("reading node %s for the report's owner: %w", w.cfg.NodeName, err)
		}
		w.nodeUID = node.UID
	}
	b, err := nodereport.Encode(rep, w.cfg.MaxBytes)
	if err != nil {
		return 0, err
	}
	cm := nodereport.Object(w.cfg.Namespace, b, w.cfg.NodeName, w.nodeUID, w.cfg.Heartbeat)
	err = w.api.UpdateConfigMap(ctx, cm)
	if apierrors.IsNotFound(err) {
		err = w.api.CreateConfigMap(ctx, cm)
	}
	if err != nil {
		return 0, fmt.Errorf("writing ConfigMap %s/%s: %w", cm.Namespace, cm.Name, err)
	}
	return len(b), nil
}

// story is what a report tells, its wording and counts aside: a change of it is written at
// once, anything else waits for the heartbeat.
type story struct {
	verdict   verdict.Verdict
	findings  []string // cause, severity and Service port of each finding, in order
	unchecked []verdict.Cause
}

func storyOf(rep verdict.Report) story {
	s := story{verdict: verdict.Judge(rep.Findings, rep.NotChecked), unchecked: rep.UncheckedCauses()}
	for _, f := range rep.Findings {
		k := string(f.Cause) + " " + string(f.Severity)
		if f.Service != nil {
			k += " " + f.Service.String()
		}
		s.findings = append(s.findings, k)
	}
	return s
}

func (s story) equal(o story) bool {
	return s.verdict == o.verdict && slices.Equal(s.findings, o.findings) && slices.Equal(s.unchecked, o.unchecked)
}
