package nodecondition

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/proxyhealth/proxyhealth/internal/verdict"
)

const node = "worker-3"

var (
	backend = verdict.Service{Namespace: "lab", Name: "backend", Port: 80, Protocol: "tcp", PortName: "http"}
	dns     = verdict.Service{Namespace: "kube-system", Name: "kube-dns", Port: 53, Protocol: "udp", PortName: "dns"}
)

func staleFinding(svc verdict.Service, summary string) verdict.Finding {
	return verdict.Finding{Cause: verdict.StaleRules, Severity: verdict.Critical, Service: &svc, Summary: summary}
}

func report(findings ...verdict.Finding) verdict.Report {
	return verdict.Report{Node: node, Verdict: verdict.Judge(findings, nil), Findings: findings}
}

// noAPI is what a node without an API to compare kube-proxy's rules with could not check.
var noAPI = []verdict.NotChecked{{Causes: []verdict.Cause{verdict.StaleRules}, Reason: "no Kubernetes API is configured"}}

// notChecked is report with noAPI not checked.
func notChecked(findings ...verdict.Finding) verdict.Report {
	r := report(findings...)
	r.NotChecked = noAPI
	r.Verdict = verdict.Judge(r.Findings, r.NotChecked)
	return r
}

// fakeAPI is API on client-go's fake clientset.
type fakeAPI struct{ c *fake.Clientset }

func (f fakeAPI) GetNode(ctx context.Context, name string) (*corev1.Node, error) {
	return f.c.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
}

func (f fakeAPI) PatchNodeStatus(ctx context.Context, name string, patch []byte) error {
	_, err := f.c.CoreV1().Nodes().PatchStatus(ctx, name, patch)
	return err
}

func (f fakeAPI) GetService(ctx context.Context, namespace, name string) (*corev1.Service, error) {
	return f.c.CoreV1().Services(namespace).Get(ctx, name, metav1.GetOptions{})
}

func (f fakeAPI) CreateEvent(ctx context.Context, ev *corev1.Event) error {
	_, err := f.c.CoreV1().Events(ev.Namespace).Create(ctx, ev, metav1.CreateOptions{})
	return err
}

func TestReasonsCoverTheVocabulary(t *testing.T) {
	camel := regexp.MustCompile(`^[A-Z][A-Za-z]*$`)
	seen := map[string]bool{}
	for _, c := range verdict.Causes {
		r, ok := Reasons[c]
		if !ok || !camel.MatchString(r) || seen[r] || r == ReasonHealthy || r == ReasonNotChecked {
			t.Errorf("cause %s: reason %q (known %v, valid %v, repeated %v)", c, r, ok, camel.MatchString(r), seen[r])
		}
		seen[r] = true
	}
	if len(Reasons) != len(verdict.Causes) {
		t.Errorf("%d reasons for %d causes", len(Reasons), len(verdict.Causes))
	}
	if Reason(verdict.BridgeNetfilterOff) != "BridgeNetfilterOff" || Reason(verdict.InvalidNotDropped) != "InvalidNotDropped" {
		t.Errorf("reasons: %v", Reasons)
	}
}

func TestConditionOf(t *testing.T) {
	bridge := verdict.Finding{Cause: verdict.BridgeNetfilterOff, Severity: verdict.Critical, Summary: "bridge netfilter is off."}
	invalid := verdict.Finding{Cause: verdict.InvalidNotDropped, Severity: verdict.Warning, Summary: "INVALID not dropped."}
	for _, tc := range []struct {
		name    string
		rep     verdict.Report
		status  corev1.ConditionStatus
		reason  string
		message string
	}{
		{"healthy", report(), corev1.ConditionTrue, "ProxyHealthy", "No critical finding."},
		{"warnings only", report(invalid), corev1.ConditionTrue, "ProxyHealthy", "No critical finding. Warnings: invalid_not_dropped."},
		{"not checked", notChecked(), corev1.ConditionUnknown, "NotChecked",
			"Not known healthy: no critical finding, but could not check stale_rules (no Kubernetes API is configured)."},
		{"not checked, for two reasons", verdict.Report{NotChecked: append(slices.Clone(noAPI), verdict.NotChecked{
			Causes: []verdict.Cause{verdict.InvalidNotDropped, verdict.ConntrackInsertFailing}, Reason: "the counters have been read only once"})},
			corev1.ConditionUnknown, "NotChecked",
			"Not known healthy: no critical finding, but could not check stale_rules (no Kubernetes API is configured); " +
				"invalid_not_dropped, conntrack_insert_failing (the counters have been read only once)."},
		{"warnings, and not checked", notChecked(invalid), corev1.ConditionUnknown, "NotChecked",
			"Not known healthy: no critical finding, but could not check stale_rules (no Kubernetes API is configured). Warnings: invalid_not_dropped."},
		{"critical, and not checked", notChecked(bridge, invalid), corev1.ConditionFalse, "BridgeNetfilterOff", "bridge netfilter is off."},
		{"one critical", report(staleFinding(backend, "kube-proxy's rules for lab/backend differ."), invalid),
			corev1.ConditionFalse, "StaleRules", "kube-proxy's rules for lab/backend differ."},
		{"several critical", report(staleFinding(backend, "rules for lab/backend differ."), staleFinding(dns, "rules for kube-dns differ."), bridge, invalid),
			corev1.ConditionFalse, "StaleRules", "rules for lab/backend differ. (2 more critical: stale_rules, bridge_netfilter_off)"},
		{"bridge", report(bridge), corev1.ConditionFalse, "BridgeNetfilterOff", "bridge netfilter is off."},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := conditionOf(tc.rep)
			if s.status != tc.status || s.reason != tc.reason || s.message != tc.message {
				t.Errorf("got %s %s %q, want %s %s %q", s.status, s.reason, s.message, tc.status, tc.reason, tc.message)
			}
		})
	}
	long := conditionOf(report(staleFinding(backend, strings.Repeat("é", 2000))))
	if len(long.message) > maxMessage || !strings.HasSuffix(long.message, "...") || !strings.HasPrefix(long.message, "éé") {
		t.Errorf("a long summary: %d bytes, %q...", len(long.message), long.message[:10])
	}
}

// lab is a fake API with the Node (the kubelet's Ready condition on it) and lab/backend, and a
// publisher on a clock the test moves.
type lab struct {
	t      *testing.T
	client *fake.Clientset
	p      *Publisher
	now    time.Time
}

func newLab(t *testing.T, cfg Config, objects ...runtime.Object) *lab {
	t.Helper()
	start := time.Date(2026, 11, 25, 2, 41, 0, 0, time.UTC)
	objects = append(objects,
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{
			{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", LastTransitionTime: metav1.NewTime(start.Add(-time.Hour))},
		}}},
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "lab", Name: "backend", UID: "uid-backend"}},
	)
	client := fake.NewClientset(objects...)
	cfg.NodeName = node
	p, err := New(fakeAPI{client}, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	l := &lab{t: t, client: client, p: p, now: start}
	p.now = func() time.Time { return l.now }
	return l
}

func (l *lab) publish(rep verdict.Report) { l.p.Publish(context.Background(), rep) }

func (l *lab) condition() (corev1.NodeCondition, []corev1.NodeCondition) {
	l.t.Helper()
	n, err := l.client.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
	if err != nil {
		l.t.Fatal(err)
	}
	for _, c := range n.Status.Conditions {
		if c.Type == ConditionType {
			return c, n.Status.Conditions
		}
	}
	l.t.Fatalf("no %s condition: %+v", ConditionType, n.Status.Conditions)
	return corev1.NodeCondition{}, nil
}

func (l *lab) events(namespace string) []corev1.Event {
	l.t.Helper()
	list, err := l.client.CoreV1().Events(namespace).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		l.t.Fatal(err)
	}
	return list.Items
}

func (l *lab) patches() int {
	n := 0
	for _, a := range l.client.Actions() {
		if a.GetVerb() == "patch" && a.GetResource().Resource == "nodes" && a.GetSubresource() == "status" {
			n++
		}
	}
	return n
}

func (l *lab) metric(name, result string) float64 {
	switch name {
	case "patches":
		return testutil.ToFloat64(l.p.patches.WithLabelValues(result))
	case "events":
		return testutil.ToFloat64(l.p.sent.WithLabelValues(result))
	}
	l.t.Fatalf("no metric %s", name)
	return 0
}

func TestPublisherIncident(t *testing.T) {
	l := newLab(t, Config{HeartbeatInterval: 5 * time.Minute, EventInterval: 10 * time.Minute})
	start := l.now

	// Healthy: True, and the kubelet's condition untouched.
	l.publish(report())
	c, all := l.condition()
	ready := slices.IndexFunc(all, func(c corev1.NodeCondition) bool { return c.Type == corev1.NodeReady })
	if c.Status != corev1.ConditionTrue || c.Reason != "ProxyHealthy" || !c.LastTransitionTime.Time.Equal(start) || len(all) != 2 ||
		ready < 0 || all[ready].Reason != "KubeletReady" {
		t.Fatalf("healthy: %+v", all)
	}
	l.now = l.now.Add(10 * time.Second)
	l.publish(report())
	if l.patches() != 1 {
		t.Errorf("an unchanged condition was patched again before the heartbeat: %d patches", l.patches())
	}

	// Stale rules: False at once, a new transition, an Event on the Node and on the Service.
	l.now = l.now.Add(10 * time.Second)
	staleAt := l.now
	l.publish(report(staleFinding(backend, "rules for lab/backend:http stale for 2m.")))
	c, _ = l.condition()
	if c.Status != corev1.ConditionFalse || c.Reason != "StaleRules" || c.Message != "rules for lab/backend:http stale for 2m." ||
		!c.LastTransitionTime.Time.Equal(staleAt) || !c.LastHeartbeatTime.Time.Equal(staleAt) {
		t.Fatalf("stale: %+v", c)
	}
	nodeEvents, svcEvents := l.events("default"), l.events("lab")
	if len(nodeEvents) != 1 || len(svcEvents) != 1 {
		t.Fatalf("events: node %d, service %d", len(nodeEvents), len(svcEvents))
	}
	if e := nodeEvents[0]; e.Type != corev1.EventTypeWarning || e.Reason != "StaleRules" || e.InvolvedObject.Kind != "Node" ||
		e.InvolvedObject.Name != node || e.InvolvedObject.UID != node || e.Source.Host != node || e.Source.Component != "proxyhealth" || e.Count != 1 {
		t.Errorf("node event: %+v", e)
	}
	if e := svcEvents[0]; e.Reason != "StaleRules" || e.InvolvedObject.Kind != "Service" || e.InvolvedObject.Name != "backend" ||
		e.InvolvedObject.UID != "uid-backend" || e.Message != "On node worker-3: rules for lab/backend:http stale for 2m." {
		t.Errorf("service event: %+v", e)
	}

	// The same finding, reworded: no patch until the heartbeat, no new Event.
	patches := l.patches()
	for i := range 10 {
		l.now = l.now.Add(10 * time.Second)
		l.publish(report(staleFinding(backend, "rules for lab/backend:http stale for "+time.Duration(i+3).String()+".")))
	}
	if l.patches() != patches {
		t.Errorf("rewording patched the condition %d times before the heartbeat", l.patches()-patches)
	}
	l.now = staleAt.Add(5 * time.Minute)
	l.publish(report(staleFinding(backend, "rules for lab/backend:http stale for 7m.")))
	c, _ = l.condition()
	if l.patches() != patches+1 || !c.LastTransitionTime.Time.Equal(staleAt) || !c.LastHeartbeatTime.Time.Equal(l.now) || c.Message != "rules for lab/backend:http stale for 7m." {
		t.Errorf("heartbeat: %d patches, %+v", l.patches()-patches, c)
	}
	if n := len(l.events("default")); n != 1 {
		t.Errorf("%d node events while one finding stands", n)
	}

	// A second service goes stale: the story changed, patched at once, one more Event.
	l.now = l.now.Add(10 * time.Second)
	l.publish(report(staleFinding(backend, "backend stale."), staleFinding(dns, "dns stale.")))
	c, _ = l.condition()
	if c.Message != "backend stale. (1 more critical: stale_rules)" || !c.LastTransitionTime.Time.Equal(staleAt) {
		t.Errorf("two stale services: %+v", c)
	}
	if n := len(l.events("default")); n != 2 {
		t.Errorf("%d node events after a second stale service, want 2", n)
	}

	// Healed: True, a new transition, a Normal Event.
	l.now = l.now.Add(10 * time.Second)
	healedAt := l.now
	l.publish(report())
	c, _ = l.condition()
	if c.Status != corev1.ConditionTrue || c.Reason != "ProxyHealthy" || !c.LastTransitionTime.Time.Equal(healedAt) {
		t.Errorf("healed: %+v", c)
	}
	ev := l.events("default")
	if i := slices.IndexFunc(ev, func(e corev1.Event) bool { return e.Type == corev1.EventTypeNormal && e.Reason == "ProxyHealthy" }); i < 0 {
		t.Errorf("no Normal ProxyHealthy event on healing: %+v", ev)
	}

	// It comes back within the event interval: the condition says so, the Events are
	// suppressed.
	l.now = l.now.Add(time.Minute)
	l.publish(report(staleFinding(backend, "backend stale again.")))
	c, _ = l.condition()
	if c.Status != corev1.ConditionFalse || !c.LastTransitionTime.Time.Equal(l.now) {
		t.Errorf("stale again: %+v", c)
	}
	// Sent: on the Node for each service and the recovery, on each Service (kube-system/kube-dns
	// too).
	if n := len(l.events("default")) + len(l.events("lab")); n != 4 || l.metric("events", "suppressed") != 2 || l.metric("events", "sent") != 5 {
		t.Errorf("a flap within the event interval: %d events, %v sent, %v suppressed", n, l.metric("events", "sent"), l.metric("events", "suppressed"))
	}
	if l.metric("patches", "error") != 0 {
		t.Errorf("patch errors: %v", l.metric("patches", "error"))
	}
}

// A node whose check could not run is never ProxyHealthy=True on its Node: Unknown, reason
// NotChecked, patched at once when it comes and when it goes; no Event, as nothing critical
// was found.
func TestPublisherNotChecked(t *testing.T) {
	l := newLab(t, Config{HeartbeatInterval: 5 * time.Minute, EventInterval: 10 * time.Minute})
	l.publish(report())
	l.now = l.now.Add(10 * time.Second)
	unknownAt := l.now
	l.publish(notChecked())
	c, _ := l.condition()
	if c.Status != corev1.ConditionUnknown || c.Reason != "NotChecked" || !strings.Contains(c.Message, "stale_rules (no Kubernetes API is configured)") ||
		!c.LastTransitionTime.Time.Equal(unknownAt) || l.patches() != 2 {
		t.Fatalf("not checked: %+v after %d patches", c, l.patches())
	}
	if n := len(l.events("default")); n != 0 {
		t.Errorf("%d events for a node not checked throughout", n)
	}
	l.now = l.now.Add(10 * time.Second)
	l.publish(report())
	if c, _ := l.condition(); c.Status != corev1.ConditionTrue || c.Reason != "ProxyHealthy" || !c.LastTransitionTime.Time.Equal(l.now) {
		t.Errorf("checked again: %+v", c)
	}
}

func TestPublisherKeepsTheTransitionAcrossRestarts(t *testing.T) {
	since := time.Date(2026, 11, 25, 1, 0, 0, 0, time.UTC)
	l := newLab(t, Config{HeartbeatInterval: 5 * time.Minute})
	n, _ := l.client.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
	n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: ConditionType, Status: corev1.ConditionTrue, Reason: ReasonHealthy,
		Message: "No critical finding.", LastTransitionTime: metav1.NewTime(since), LastHeartbeatTime: metav1.NewTime(l.now.Add(-time.Minute))})
	if _, err := l.client.CoreV1().Nodes().UpdateStatus(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	l.client.ClearActions()
	l.publish(report())
	if l.patches() != 0 {
		t.Errorf("the condition as found, heartbeat a minute old, was patched again at once")
	}
	l.now = l.now.Add(4 * time.Minute)
	l.publish(report())
	c, _ := l.condition()
	if l.patches() != 1 || !c.LastTransitionTime.Time.Equal(since) || !c.LastHeartbeatTime.Time.Equal(l.now) {
		t.Errorf("heartbeat after a restart: %d patches, %+v", l.patches(), c)
	}
}

func TestPublisherDoesNotRetellAfterARestart(t *testing.T) {
	l := newLab(t, Config{HeartbeatInterval: 5 * time.Minute, EventInterval: 10 * time.Minute})
	since := l.now.Add(-20 * time.Minute)
	n, _ := l.client.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
	n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: ConditionType, Status: corev1.ConditionFalse, Reason: "StaleRules",
		Message: "backend stale.", LastTransitionTime: metav1.NewTime(since), LastHeartbeatTime: metav1.NewTime(l.now.Add(-time.Minute))})
	if _, err := l.client.CoreV1().Nodes().UpdateStatus(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	bridge := verdict.Finding{Cause: verdict.BridgeNetfilterOff, Severity: verdict.Critical, Summary: "bridge netfilter is off."}
	// The previous run told the stale rules; bridge netfilter is news.
	l.publish(report(staleFinding(backend, "backend stale."), bridge))
	c, _ := l.condition()
	ev := l.events("default")
	if len(ev) != 1 || ev[0].Reason != "BridgeNetfilterOff" || len(l.events("lab")) != 0 {
		t.Errorf("after a restart: %+v", ev)
	}
	if c.Status != corev1.ConditionFalse || !c.LastTransitionTime.Time.Equal(since) {
		t.Errorf("after a restart: %+v", c)
	}
	// Cleared: told, with the transition.
	l.now = l.now.Add(10 * time.Second)
	l.publish(report())
	c, _ = l.condition()
	ev = l.events("default")
	recovered := slices.IndexFunc(ev, func(e corev1.Event) bool { return e.Reason == "ProxyHealthy" && e.Type == corev1.EventTypeNormal })
	if c.Status != corev1.ConditionTrue || !c.LastTransitionTime.Time.Equal(l.now) || len(ev) != 2 || recovered < 0 {
		t.Errorf("cleared after a restart: %+v, events %+v", c, ev)
	}
}

func TestPublisherDegradesWhenTheAPIRefuses(t *testing.T) {
	l := newLab(t, Config{HeartbeatInterval: 5 * time.Minute, RetryInterval: 30 * time.Second})
	forbidden := errors.New(`nodes "worker-3" is forbidden: User "system:serviceaccount:monitoring:proxyhealth" cannot patch resource "nodes/status"`)
	refuse := true
	l.client.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		return refuse, nil, forbidden
	})
	l.client.PrependReactor("create", "events", func(k8stesting.Action) (bool, runtime.Object, error) {
		return refuse, nil, errors.New("events is forbidden")
	})
	stale := report(staleFinding(backend, "backend stale."))
	l.publish(stale)
	if l.metric("patches", "error") != 1 || testutil.ToFloat64(l.p.succeeded) != 0 || l.metric("events", "error") != 2 {
		t.Fatalf("refused: patches %v errors, events %v errors", l.metric("patches", "error"), l.metric("events", "error"))
	}
	// No retry before the retry interval, then one.
	l.now = l.now.Add(10 * time.Second)
	l.publish(stale)
	if l.metric("patches", "error") != 1 {
		t.Errorf("retried before the retry interval")
	}
	refuse = false
	l.now = l.now.Add(30 * time.Second)
	l.publish(stale)
	c, _ := l.condition()
	if c.Status != corev1.ConditionFalse || c.Reason != "StaleRules" || testutil.ToFloat64(l.p.succeeded) != 1 || l.metric("patches", "success") != 1 {
		t.Errorf("after the API allowed it: %+v", c)
	}
}

func TestNewRefusesBadConfig(t *testing.T) {
	core := fakeAPI{fake.NewClientset()}
	for _, cfg := range []Config{
		{HeartbeatInterval: time.Minute},
		{NodeName: node},
		{NodeName: node, HeartbeatInterval: time.Minute, EventInterval: -1},
	} {
		if _, err := New(core, cfg, slog.Default()); err == nil {
			t.Errorf("New(%+v) accepted", cfg)
		}
	}
}

func TestEventLimiter(t *testing.T) {
	now := time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC)
	l := newEventLimiter(10*time.Minute, func() time.Time { return now })
	allowed := 0
	for i := range 40 {
		if l.allow(string(rune('a' + i))) {
			allowed++
		}
	}
	if allowed != eventBurst {
		t.Errorf("%d of 40 distinct events allowed at once, want the burst, %d", allowed, eventBurst)
	}
	now = now.Add(eventRefill)
	if !l.allow("new") || l.allow("newer") {
		t.Errorf("one event should be allowed per %s once the burst is spent", eventRefill)
	}
	now = now.Add(time.Hour)
	if !l.allow("a") || l.allow("a") {
		t.Errorf("one event per key per interval")
	}
}
