package reportwriter

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/proxyhealth/proxyhealth/internal/nodereport"
	"github.com/proxyhealth/proxyhealth/internal/verdict"
)

const (
	node      = "worker-3"
	namespace = "proxyhealth"
)

var backend = verdict.Service{Namespace: "lab", Name: "backend", Port: 80, Protocol: "tcp", PortName: "http"}

func report(findings ...verdict.Finding) verdict.Report {
	return verdict.Report{Node: node, Verdict: verdict.Judge(findings, nil), Time: time.Date(2026, 11, 28, 3, 0, 0, 0, time.UTC),
		Findings: findings, NotChecked: []verdict.NotChecked{}}
}

func stale(summary string, programmed int) verdict.Finding {
	svc := backend
	return verdict.Finding{Cause: verdict.StaleRules, Severity: verdict.Critical, Service: &svc, Summary: summary,
		Evidence: verdict.StaleRulesEvidence{Programmed: programmed, Expected: 11, Stale: []string{"10.244.3.1:8080"}, Missing: []string{"10.244.3.11:8080"}}}
}

// writes is how many writes succeeded.
func writes(w *Writer) int { return int(testutil.ToFloat64(w.writes.WithLabelValues("success"))) }

// fakeAPI is API on client-go's fake clientset.
type fakeAPI struct{ c *fake.Clientset }

func (f fakeAPI) GetNode(ctx context.Context, name string) (*corev1.Node, error) {
	return f.c.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
}

func (f fakeAPI) UpdateConfigMap(ctx context.Context, cm *corev1.ConfigMap) error {
	_, err := f.c.CoreV1().ConfigMaps(cm.Namespace).Update(ctx, cm, metav1.UpdateOptions{})
	return err
}

func (f fakeAPI) CreateConfigMap(ctx context.Context, cm *corev1.ConfigMap) error {
	_, err := f.c.CoreV1().ConfigMaps(cm.Namespace).Create(ctx, cm, metav1.CreateOptions{})
	return err
}

type clock struct{ t time.Time }

func (c *clock) now() time.Time          { return c.t }
func (c *clock) advance(d time.Duration) { c.t = c.t.Add(d) }
func newClock() *clock                   { return &clock{t: time.Date(2026, 11, 28, 3, 0, 0, 0, time.UTC)} }
func count(c *fake.Clientset, verb string) int {
	n := 0
	for _, a := range c.Actions() {
		if a.GetVerb() == verb && a.GetResource().Resource == "configmaps" {
			n++
		}
	}
	return n
}

func newWriter(t *testing.T, c *fake.Clientset, clk *clock, log *bytes.Buffer) *Writer {
	t.Helper()
	if log == nil {
		log = &bytes.Buffer{}
	}
	w, err := New(fakeAPI{c}, Config{NodeName: node, Namespace: namespace, MinInterval: 30 * time.Second, Heartbeat: 5 * time.Minute},
		slog.New(slog.NewTextHandler(log, nil)))
	if err != nil {
		t.Fatal(err)
	}
	w.now = clk.now
	return w
}

func nodeObject() *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, UID: "6f1c2b9e-node-uid"}}
}

func readReport(t *testing.T, c *fake.Clientset) (*corev1.ConfigMap, nodereport.Read) {
	t.Helper()
	cm, err := c.CoreV1().ConfigMaps(namespace).Get(context.Background(), nodereport.Name(node), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := nodereport.Decode(cm, nodereport.MaxBytes)
	if err != nil {
		t.Fatal(err)
	}
	return cm, r
}

// TestWriterCreatesTheReport: the first write creates the ConfigMap in the namespace, labelled
// for the plugin's list, owned by the Node (the garbage collector deletes it with the Node),
// holding the report and the heartbeat.
func TestWriterCreatesTheReport(t *testing.T) {
	c := fake.NewClientset(nodeObject())
	w := newWriter(t, c, newClock(), nil)
	rep := report(stale("kube-proxy's rules for lab/backend:http (80/tcp) differ from the API.", 10))
	w.Write(context.Background(), rep)

	cm, r := readReport(t, c)
	if cm.Name != "proxyhealth-node-worker-3" || cm.Labels["app.kubernetes.io/name"] != "proxyhealth" || cm.Labels["app.kubernetes.io/component"] != "node-report" {
		t.Errorf("object %s, labels %v", cm.Name, cm.Labels)
	}
	if len(cm.OwnerReferences) != 1 || cm.OwnerReferences[0].Kind != "Node" || cm.OwnerReferences[0].Name != node ||
		cm.OwnerReferences[0].UID != "6f1c2b9e-node-uid" || cm.OwnerReferences[0].BlockOwnerDeletion != nil {
		t.Errorf("owner references %+v, want the Node's, not blocking its deletion", cm.OwnerReferences)
	}
	if r.Report.Verdict != verdict.CriticalFound || len(r.Report.Findings) != 1 || r.Report.Findings[0].Summary != rep.Findings[0].Summary || r.Heartbeat != 5*time.Minute {
		t.Errorf("report %+v, heartbeat %v", r.Report, r.Heartbeat)
	}
	if got := testutil.ToFloat64(w.writes.WithLabelValues("success")); got != 1 {
		t.Errorf("successful writes %v, want 1", got)
	}
	if got := testutil.ToFloat64(w.bytes); got != float64(len(cm.Data[nodereport.KeyStatus])) {
		t.Errorf("bytes gauge %v, want %d", got, len(cm.Data[nodereport.KeyStatus]))
	}
}

// TestWriterWritesOnChangeRateLimited: a report whose story is the same is not written again
// before the heartbeat (a count that changes waits); a changed story is written at once, but
// never two writes within the minimum interval: a verdict that flaps every check costs one
// write per interval.
func TestWriterWritesOnChangeRateLimited(t *testing.T) {
	c := fake.NewClientset(nodeObject())
	clk := newClock()
	w := newWriter(t, c, clk, nil)
	ctx := context.Background()
	healthy := report()
	critical := report(stale("10 programmed", 10))

	w.Write(ctx, healthy)
	for range 10 { // the same story, checked every 10 s for 100 s
		clk.advance(10 * time.Second)
		w.Write(ctx, healthy)
	}
	if n := writes(w); n != 1 {
		t.Fatalf("%d writes of an unchanged report within the heartbeat, want 1", n)
	}
	// A change, 100 s after the last write: at once.
	w.Write(ctx, critical)
	if n := writes(w); n != 2 {
		t.Fatalf("%d writes after the verdict changed, want 2", n)
	}
	// Only a count changes: waits for the heartbeat.
	clk.advance(10 * time.Second)
	w.Write(ctx, report(stale("9 programmed", 9)))
	if n := writes(w); n != 2 {
		t.Fatalf("a reworded report was written before the heartbeat")
	}
	// Flapping every 10 s for 5 minutes: one write per 30 s at most.
	for i := range 30 {
		clk.advance(10 * time.Second)
		if i%2 == 0 {
			w.Write(ctx, healthy)
		} else {
			w.Write(ctx, critical)
		}
	}
	if n := writes(w) - 2; n > 10 || n < 5 {
		t.Errorf("%d writes in 300 s of a verdict flapping every 10 s, want at most one per 30 s (10) and some", n)
	}
	// Steady again: the heartbeat rewrites it, with the newest wording.
	before := writes(w)
	clk.advance(30 * time.Second)
	w.Write(ctx, report(stale("8 programmed", 8)))
	after := writes(w)
	for range 29 {
		clk.advance(10 * time.Second)
		w.Write(ctx, report(stale("8 programmed", 8)))
	}
	if n := writes(w) - after; n != 1 {
		t.Errorf("%d writes in 290 s of a steady report (after %d settling), want 1 heartbeat", n, after-before)
	}
	if _, r := readReport(t, c); r.Report.Findings[0].Summary != "8 programmed" {
		t.Errorf("the heartbeat wrote %q, want the newest wording", r.Report.Findings[0].Summary)
	}
}

// TestWriterRecreatesADeletedReport: an update of a report deleted meanwhile (by hand, or by the
// garbage collector after the Node was recreated) creates it again.
func TestWriterRecreatesADeletedReport(t *testing.T) {
	c := fake.NewClientset(nodeObject())
	clk := newClock()
	w := newWriter(t, c, clk, nil)
	w.Write(context.Background(), report())
	if err := c.CoreV1().ConfigMaps(namespace).Delete(context.Background(), nodereport.Name(node), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	clk.advance(5 * time.Minute)
	w.Write(context.Background(), report())
	readReport(t, c)
	if n := count(c, "create"); n != 2 {
		t.Errorf("%d creates, want 2", n)
	}
}

// TestWriterFailures: a write the API refuses (RBAC missing) is counted and logged once, retried
// no sooner than the minimum interval, and the exporter learns when it succeeds again. The
// Node's UID is read once.
func TestWriterFailures(t *testing.T) {
	c := fake.NewClientset(nodeObject())
	forbidden := true
	c.PrependReactor("*", "configmaps", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if forbidden {
			return true, nil, apierrors.NewForbidden(corev1.Resource("configmaps"), nodereport.Name(node), errors.New("RBAC"))
		}
		return false, nil, nil
	})
	clk := newClock()
	var log bytes.Buffer
	w := newWriter(t, c, clk, &log)
	ctx := context.Background()
	for range 9 { // 90 s: tries at 0, 30, 60
		w.Write(ctx, report())
		clk.advance(10 * time.Second)
	}
	if n := count(c, "update"); n != 3 {
		t.Errorf("%d tries in 90 s, want 3 (one per 30 s)", n)
	}
	if got := testutil.ToFloat64(w.writes.WithLabelValues("error")); got != 3 {
		t.Errorf("failed writes %v, want 3", got)
	}
	if n := strings.Count(log.String(), "cannot write the node's report"); n != 1 {
		t.Errorf("the failure was logged %d times, want once:\n%s", n, log.String())
	}
	forbidden = false
	w.Write(ctx, report())
	readReport(t, c)
	if !strings.Contains(log.String(), "the node's report is written again") {
		t.Errorf("the recovery was not logged:\n%s", log.String())
	}
	gets := 0
	for _, a := range c.Actions() {
		if a.GetVerb() == "get" && a.GetResource().Resource == "nodes" {
			gets++
		}
	}
	if gets != 1 {
		t.Errorf("the Node was read %d times, want once", gets)
	}
}

// TestWriterWaitsForItsNode: without the Node's UID (the Node not readable yet) nothing is
// written: a report without its owner would outlive a deleted node.
func TestWriterWaitsForItsNode(t *testing.T) {
	c := fake.NewClientset()
	clk := newClock()
	w := newWriter(t, c, clk, nil)
	w.Write(context.Background(), report())
	if n := writes(w); n != 0 {
		t.Fatalf("%d writes without the Node", n)
	}
	if _, err := c.CoreV1().Nodes().Create(context.Background(), nodeObject(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	clk.advance(30 * time.Second)
	w.Write(context.Background(), report())
	cm, _ := readReport(t, c)
	if cm.OwnerReferences[0].UID != "6f1c2b9e-node-uid" {
		t.Errorf("owner %+v", cm.OwnerReferences)
	}
}

func TestNewRefusesUnboundedSettings(t *testing.T) {
	for _, cfg := range []Config{
		{Namespace: namespace, MinInterval: time.Second, Heartbeat: time.Minute},
		{NodeName: node, MinInterval: time.Second, Heartbeat: time.Minute},
		{NodeName: node, Namespace: namespace, Heartbeat: time.Minute},
		{NodeName: node, Namespace: namespace, MinInterval: time.Minute, Heartbeat: time.Second},
	} {
		if _, err := New(fakeAPI{fake.NewClientset()}, cfg, slog.New(slog.DiscardHandler)); err == nil {
			t.Errorf("New accepted %+v", cfg)
		}
	}
}
