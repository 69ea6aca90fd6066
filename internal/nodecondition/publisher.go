package nodecondition

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/proxyhealth/proxyhealth/internal/metricdesc"
	"github.com/proxyhealth/proxyhealth/internal/periodic"
	"github.com/proxyhealth/proxyhealth/internal/verdict"
)

// Config is the publisher's settings.
type Config struct {
	// NodeName is the Node whose condition is set.
	NodeName string
	// HeartbeatInterval: the condition is patched at least this often (its
	// lastHeartbeatTime), and no more often while only its wording changes (a count, a
	// duration). A change of status, reason or of the critical findings is patched at once.
	HeartbeatInterval time.Duration
	// EventInterval is the least time between two Events of one reason on one object: a
	// finding that comes and goes is told once per interval.
	EventInterval time.Duration
	// RetryInterval is the least time between two tries after a failed patch (default 30s).
	RetryInterval time.Duration
	// Component names the Events' source (default "proxyhealth").
	Component string
}

// The global bound on Events from one node, over every object and reason: client-go's event
// spam filter's burst, refilled one every 10 seconds.
const (
	eventBurst  = 25
	eventRefill = 10 * time.Second
	// eventKeys bounds how many (object, reason) pairs the per-object limit remembers.
	eventKeys = 4096
	// nodeEventNamespace is where Events on a Node (cluster-scoped) are written, as the
	// kubelet and client-go's recorder do.
	nodeEventNamespace = metav1.NamespaceDefault
)

// Publisher keeps the ProxyHealthy condition of one Node and emits its Events. Publish is
// called from one goroutine; the metrics may be collected concurrently.
type Publisher struct {
	cfg    Config
	api    API
	logger *slog.Logger
	now    func() time.Time
	events *eventLimiter

	read bool // the Node's condition as found at start-up was read
	// toldReason is the reason of a False condition found at start-up: its findings were told
	// by the exporter that ran before (a restart, a rollout), and are not told again.
	toldReason string
	published  *state // the condition as last patched, or as found; nil when unknown
	transition time.Time
	lastPatch  time.Time // last successful patch (or the heartbeat found at start-up)
	lastTry    time.Time
	failing    string                  // the last patch failure logged, "" while patches succeed
	eventErr   string                  // the last Event failure logged
	critical   map[findingKey]struct{} // the critical findings of the previous report

	patches   *prometheus.CounterVec
	sent      *prometheus.CounterVec
	succeeded prometheus.Gauge
	tried     atomic.Bool // succeeded is served once a patch was tried
}

// New returns a publisher for cfg.NodeName that talks to api (NewAPI).
func New(api API, cfg Config, logger *slog.Logger) (*Publisher, error) {
	switch {
	case cfg.NodeName == "":
		return nil, errors.New("no node name")
	case cfg.HeartbeatInterval <= 0:
		return nil, errors.New("the heartbeat interval must be positive")
	case cfg.EventInterval < 0:
		return nil, errors.New("the event interval must not be negative")
	}
	if cfg.RetryInterval <= 0 {
		cfg.RetryInterval = 30 * time.Second
	}
	if cfg.Component == "" {
		cfg.Component = "proxyhealth"
	}
	p := &Publisher{
		cfg: cfg, api: api, logger: logger, now: time.Now,
		critical: map[findingKey]struct{}{},
		patches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: metricdesc.Namespace, Subsystem: "node_condition", Name: "patches_total",
			Help: "Patches of this node's ProxyHealthy condition (--node-conditions), by result (success, error).",
		}, []string{"result"}),
		sent: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: metricdesc.Namespace, Subsystem: "node", Name: "events_total",
			Help: "Events for new critical findings and recoveries (--node-conditions), by result: sent, suppressed (rate-limited), error.",
		}, []string{"result"}),
		succeeded: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: metricdesc.Namespace, Subsystem: "node_condition", Name: "last_patch_success",
			Help: "1 if the last patch of this node's ProxyHealthy condition (--node-conditions) succeeded, 0 if it failed (the log says why once); absent before the first.",
		}),
	}
	p.events = newEventLimiter(cfg.EventInterval, func() time.Time { return p.now() })
	for _, r := range []string{"success", "error"} {
		p.patches.WithLabelValues(r)
	}
	for _, r := range []string{"sent", "suppressed", "error"} {
		p.sent.WithLabelValues(r)
	}
	return p, nil
}

// Describe implements prometheus.Collector.
func (p *Publisher) Describe(ch chan<- *prometheus.Desc) {
	p.patches.Describe(ch)
	p.sent.Describe(ch)
	p.succeeded.Describe(ch)
}

// Collect implements prometheus.Collector.
func (p *Publisher) Collect(ch chan<- prometheus.Metric) {
	p.patches.Collect(ch)
	p.sent.Collect(ch)
	if p.tried.Load() {
		p.succeeded.Collect(ch)
	}
}

// Run publishes report() every interval until ctx is done; each round's API calls get timeout.
func (p *Publisher) Run(ctx context.Context, interval, timeout time.Duration, report func() verdict.Report) {
	periodic.Every(ctx, interval, func() {
		rctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		p.Publish(rctx, report())
	})
}

// Publish brings the condition and the Events up to rep. Failures are logged (once each) and
// counted; the next call tries again.
func (p *Publisher) Publish(ctx context.Context, rep verdict.Report) {
	if !p.read && p.published == nil {
		p.readCondition(ctx)
	}
	want := conditionOf(rep)
	p.emitEvents(ctx, rep, want)
	p.patchCondition(ctx, want)
}

// readCondition takes the condition as the Node has it, so that a restarted exporter keeps
// its lastTransitionTime and heartbeat.
func (p *Publisher) readCondition(ctx context.Context) {
	node, err := p.api.GetNode(ctx, p.cfg.NodeName)
	if err != nil {
		p.logger.Debug("reading the node's ProxyHealthy condition", "node", p.cfg.NodeName, "err", err)
		return
	}
	p.read = true
	for _, c := range node.Status.Conditions {
		if c.Type == ConditionType {
			p.published = &state{status: c.Status, reason: c.Reason, message: c.Message}
			p.transition, p.lastPatch = c.LastTransitionTime.Time, c.LastHeartbeatTime.Time
			if c.Status == corev1.ConditionFalse {
				p.toldReason = c.Reason
			}
			return
		}
	}
}

func (p *Publisher) patchCondition(ctx context.Context, want state) {
	now := p.now()
	due := p.published == nil || !want.sameStory(*p.published) || now.Sub(p.lastPatch) >= p.cfg.HeartbeatInterval
	if !due || (p.failing != "" && now.Sub(p.lastTry) < p.cfg.RetryInterval) {
		return
	}
	p.lastTry = now
	transition := p.transition
	if p.published == nil || p.published.status != want.status || transition.IsZero() {
		transition = now
	}
	cond := corev1.NodeCondition{
		Type:               ConditionType,
		Status:             want.status,
		Reason:             want.reason,
		Message:            want.message,
		LastHeartbeatTime:  metav1.NewTime(now),
		LastTransitionTime: metav1.NewTime(transition),
	}
	err := p.patch(ctx, cond)
	p.tried.Store(true)
	if err != nil {
		p.patches.WithLabelValues("error").Inc()
		p.succeeded.Set(0)
		if msg := err.Error(); msg != p.failing {
			p.logger.Error("cannot set the node's ProxyHealthy condition; the exporter keeps serving, and retries", "node", p.cfg.NodeName,
				"retry_every", p.cfg.RetryInterval, "err", err)
			p.failing = msg
		}
		return
	}
	p.patches.WithLabelValues("success").Inc()
	p.succeeded.Set(1)
	if p.failing != "" {
		p.logger.Info("the node's ProxyHealthy condition is set again", "node", p.cfg.NodeName)
		p.failing = ""
	}
	if p.published == nil || p.published.status != want.status || p.published.reason != want.reason {
		p.logger.Info("node condition", "node", p.cfg.NodeName, "type", ConditionType, "status", want.status, "reason", want.reason, "message", want.message)
	}
	p.published, p.transition, p.lastPatch = &want, transition, now
}

// patch sets cond among the Node's conditions with a strategic merge patch of its status: the
// conditions list merges by type, so the kubelet's and other agents' conditions stay as they
// are (node-problem-detector does the same).
func (p *Publisher) patch(ctx context.Context, cond corev1.NodeCondition) error {
	body, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.NodeCondition{cond}}})
	if err != nil {
		return fmt.Errorf("encoding the patch: %w", err)
	}
	if err := p.api.PatchNodeStatus(ctx, p.cfg.NodeName, body); err != nil {
		return fmt.Errorf("patching node %s's status: %w", p.cfg.NodeName, err)
	}
	return nil
}

// emitEvents sends a Warning Event on the Node for each critical finding that was not in the
// previous report, one on the Service too for stale rules, and a Normal Event on the Node when
// the last critical finding clears.
func (p *Publisher) emitEvents(ctx context.Context, rep verdict.Report, want state) {
	current := make(map[findingKey]struct{}, len(want.critical))
	for _, f := range rep.Findings {
		if f.Severity != verdict.Critical {
			continue
		}
		k := keyOf(f)
		current[k] = struct{}{}
		reason, msg := Reason(f.Cause), truncate(f.Summary, maxMessage)
		if _, seen := p.critical[k]; seen || reason == p.toldReason {
			continue
		}
		p.event(ctx, p.nodeRef(), k.service, corev1.EventTypeWarning, reason, msg)
		if f.Cause == verdict.StaleRules && f.Service != nil {
			p.event(ctx, p.serviceRef(ctx, f.Service.Namespace, f.Service.Name), k.service, corev1.EventTypeWarning, reason,
				truncate(fmt.Sprintf("On node %s: %s", p.cfg.NodeName, f.Summary), maxMessage))
		}
	}
	if (len(p.critical) > 0 || p.toldReason != "") && len(current) == 0 {
		p.event(ctx, p.nodeRef(), "", corev1.EventTypeNormal, ReasonHealthy, "No critical finding any more: "+want.message)
	}
	p.critical, p.toldReason = current, ""
}

// nodeRef refers to the Node as the kubelet does (its UID is its name), which is what
// `kubectl describe node` searches Events by.
func (p *Publisher) nodeRef() corev1.ObjectReference {
	return corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: p.cfg.NodeName, UID: types.UID(p.cfg.NodeName)}
}

// serviceRef refers to a Service with its UID, which `kubectl describe service` searches Events
// by; without it (the Service could not be read) the Event is still listed by kubectl get events.
func (p *Publisher) serviceRef(ctx context.Context, namespace, name string) corev1.ObjectReference {
	ref := corev1.ObjectReference{Kind: "Service", APIVersion: "v1", Namespace: namespace, Name: name}
	svc, err := p.api.GetService(ctx, namespace, name)
	if err != nil {
		p.logger.Debug("reading the Service for its Event's UID", "service", namespace+"/"+name, "err", err)
		return ref
	}
	ref.UID, ref.ResourceVersion = svc.UID, svc.ResourceVersion
	return ref
}

// event creates an Event on ref unless the limiter holds it back; about names the Service port
// the finding concerns ("" for a node-wide one), so that each port's finding is told once per
// interval on the Node.
func (p *Publisher) event(ctx context.Context, ref corev1.ObjectReference, about, eventType, reason, message string) {
	namespace := ref.Namespace
	if namespace == "" {
		namespace = nodeEventNamespace
	}
	if !p.events.allow(ref.Kind + "/" + ref.Namespace + "/" + ref.Name + "/" + reason + "/" + about) {
		p.sent.WithLabelValues("suppressed").Inc()
		p.logger.Debug("event suppressed by the rate limit", "object", ref.Kind+" "+ref.Namespace+"/"+ref.Name, "reason", reason)
		return
	}
	now := metav1.NewTime(p.now())
	ev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{
			// As client-go's recorder names them: unique per object and time.
			Name:      fmt.Sprintf("%s.%x", ref.Name, now.UnixNano()),
			Namespace: namespace,
		},
		InvolvedObject:      ref,
		Reason:              reason,
		Message:             message,
		Type:                eventType,
		Source:              corev1.EventSource{Component: p.cfg.Component, Host: p.cfg.NodeName},
		FirstTimestamp:      now,
		LastTimestamp:       now,
		Count:               1,
		ReportingController: p.cfg.Component,
		ReportingInstance:   p.cfg.Component + "-" + p.cfg.NodeName,
	}
	if err := p.api.CreateEvent(ctx, ev); err != nil {
		p.sent.WithLabelValues("error").Inc()
		if msg := err.Error(); msg != p.eventErr {
			p.logger.Error("cannot create an Event; the exporter keeps serving", "object", ref.Kind+" "+ref.Namespace+"/"+ref.Name, "reason", reason, "err", err)
			p.eventErr = msg
		}
		return
	}
	p.sent.WithLabelValues("sent").Inc()
	p.eventErr = ""
}
