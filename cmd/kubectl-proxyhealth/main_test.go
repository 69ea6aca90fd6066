package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyhealth/proxyhealth/internal/verdict"
)

var (
	backendHTTP = verdict.Service{Namespace: "lab", Name: "backend", Port: 80, Protocol: "tcp", PortName: "http"}
	backendGRPC = verdict.Service{Namespace: "lab", Name: "backend", Port: 9090, Protocol: "tcp", PortName: "grpc"}
	dnsTCP      = verdict.Service{Namespace: "kube-system", Name: "kube-dns", Port: 53, Protocol: "tcp", PortName: "dns-tcp"}
	since       = time.Date(2026, 11, 25, 2, 41, 0, 0, time.UTC)
)

func pod(name, node string, phase corev1.PodPhase) corev1.Pod {
	p := corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "monitoring", Name: name},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "proxyhealth",
			Ports: []corev1.ContainerPort{{Name: "metrics", ContainerPort: 9869}}}}},
		Status: corev1.PodStatus{Phase: phase},
	}
	if phase == corev1.PodRunning {
		p.Status.PodIP = "10.0.0.1"
	}
	return p
}

func staleFinding(svc verdict.Service, missing, stale []string, programmed, expected int) verdict.Finding {
	return verdict.Finding{Cause: verdict.StaleRules, Severity: verdict.Critical, Service: &svc,
		Summary: "kube-proxy's rules for " + svc.String() + " differ from the API.",
		Evidence: verdict.StaleRulesEvidence{Programmed: programmed, Expected: expected, MissingCount: len(missing), StaleCount: len(stale),
			Missing: missing, Stale: stale, Since: since, ExplainedBy: []verdict.Cause{verdict.KubeProxyWatchFailing}}}
}

func statusBody(t *testing.T, node string, v verdict.Verdict, findings ...verdict.Finding) []byte {
	t.Helper()
	if findings == nil {
		findings = []verdict.Finding{}
	}
	b, err := json.Marshal(verdict.Report{Node: node, Verdict: v, Time: since, Findings: findings, NotChecked: []verdict.NotChecked{}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// joinBodies joins the pods with reports of the bodies, by pod name.
func joinBodies(pods []corev1.Pod, bodies map[string][]byte) []nodeStatus {
	var reports []corev1.ConfigMap
	for _, p := range pods {
		if b, ok := bodies[p.Name]; ok {
			reports = append(reports, *reportObject(p.Spec.NodeName, b))
		}
	}
	return join(reports, pods, defaultMaxStatusBytes, judgedNow)
}

// judgedNow is the plugin's clock in these tests: a minute after the reports were judged.
var judgedNow = since.Add(time.Minute)

// fleet is six nodes, as their reports and exporter pods are listed: worker-1 critical (stale
// rules for lab/backend on two ports, and kube-dns), worker-2 healthy, worker-3 warning,
// worker-4's pod Pending, worker-5's exporter without a report, worker-6's report an hour old.
func fleet(t *testing.T) []nodeStatus {
	t.Helper()
	pods := []corev1.Pod{
		pod("proxyhealth-b", "worker-2", corev1.PodRunning),
		pod("proxyhealth-a", "worker-1", corev1.PodRunning),
		pod("proxyhealth-c", "worker-3", corev1.PodRunning),
		pod("proxyhealth-d", "worker-4", corev1.PodPending),
		pod("proxyhealth-e", "worker-5", corev1.PodRunning),
	}
	old := statusBody(t, "worker-6", verdict.Healthy)
	var rep verdict.Report
	if err := json.Unmarshal(old, &rep); err != nil {
		t.Fatal(err)
	}
	rep.Time = since.Add(-time.Hour)
	old, _ = json.Marshal(rep)
	reports := []corev1.ConfigMap{
		*reportObject("worker-1", statusBody(t, "worker-1", verdict.CriticalFound,
			staleFinding(backendHTTP, []string{"10.244.3.11:8080", "10.244.3.12:8080", "10.244.3.13:8080", "10.244.3.14:8080"}, []string{"10.244.3.1:8080"}, 10, 13),
			staleFinding(backendGRPC, nil, []string{"10.244.3.1:9090"}, 11, 10),
			staleFinding(dnsTCP, []string{"10.244.2.1:53"}, nil, 1, 2),
			verdict.Finding{Cause: verdict.InvalidNotDropped, Severity: verdict.Warning, Summary: "INVALID packets not dropped."})),
		*reportObject("worker-2", statusBody(t, "worker-2", verdict.Healthy)),
		*reportObject("worker-3", statusBody(t, "worker-3", verdict.WarningsOnly,
			verdict.Finding{Cause: verdict.UnrepliedFlows, Severity: verdict.Warning, Service: &dnsTCP, Summary: "unreplied."},
			verdict.Finding{Cause: verdict.InvalidNotDropped, Severity: verdict.Warning, Summary: "INVALID packets not dropped."})),
		*reportObject("worker-6", old),
	}
	nodes := join(reports, pods, defaultMaxStatusBytes, judgedNow)
	sortNodes(nodes)
	return nodes
}

func TestFleetText(t *testing.T) {
	nodes := fleet(t)
	var b bytes.Buffer
	if err := writeFleetText(&b, nodes); err != nil {
		t.Fatal(err)
	}
	want := `NODE      VERDICT   CAUSES                               WORST SERVICE
worker-1  critical  stale_rules,invalid_not_dropped      lab/backend:http (80/tcp)
worker-4  unknown   -                                    error: pod proxyhealth-d is Pending, not Running
worker-5  unknown   -                                    error: no report from exporter pod monitoring/proxyhealth-e yet (is it run with --node-report, and allowed to write ConfigMaps in its namespace?)
worker-6  unknown   -                                    error: report monitoring/proxyhealth-node-worker-6 is 1h1m old, written at 2026-11-25T01:41:00Z (its exporter rewrites it every 5m while it runs): the exporter stopped or cannot write it
worker-3  warning   unreplied_flows,invalid_not_dropped  kube-system/kube-dns:dns-tcp (53/tcp)
worker-2  healthy   -                                    -

6 nodes: 1 critical, 3 unknown (3 not read), 1 warning, 1 healthy
`
	if got := b.String(); got != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
	if code := exitCode(nodes); code != exitCritical {
		t.Errorf("exit code %d, want %d", code, exitCritical)
	}
}

func TestFleetJSON(t *testing.T) {
	var b bytes.Buffer
	if err := writeFleetJSON(&b, fleet(t)); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Nodes []struct {
			Node         string           `json:"node"`
			Pod          string           `json:"pod"`
			Object       string           `json:"report"`
			Verdict      string           `json:"verdict"`
			Causes       []string         `json:"causes"`
			WorstService *verdict.Service `json:"worst_service"`
			Error        string           `json:"error"`
			Status       *struct {
				Node     string `json:"node"`
				Findings []struct {
					Evidence struct {
						Missing []string `json:"missing"`
					} `json:"evidence"`
				} `json:"findings"`
			} `json:"status"`
		} `json:"nodes"`
	}
	if err := json.Unmarshal(b.Bytes(), &got); err != nil {
		t.Fatalf("%v\n%s", err, b.String())
	}
	if len(got.Nodes) != 6 {
		t.Fatalf("%d nodes:\n%s", len(got.Nodes), b.String())
	}
	first := got.Nodes[0]
	if first.Node != "worker-1" || first.Pod != "monitoring/proxyhealth-a" || first.Object != "monitoring/proxyhealth-node-worker-1" || first.Verdict != "critical" ||
		strings.Join(first.Causes, ",") != "stale_rules,invalid_not_dropped" || first.WorstService == nil || *first.WorstService != backendHTTP ||
		first.Status == nil || len(first.Status.Findings) != 4 || len(first.Status.Findings[0].Evidence.Missing) != 4 {
		t.Errorf("worker-1: %+v", first)
	}
	if n := got.Nodes[1]; n.Node != "worker-4" || n.Verdict != "unknown" || n.Status != nil || n.Error != "pod proxyhealth-d is Pending, not Running" || n.Causes == nil {
		t.Errorf("worker-4: %+v", n)
	}
	if n := got.Nodes[5]; n.Node != "worker-2" || n.Verdict != "healthy" || len(n.Causes) != 0 || n.WorstService != nil {
		t.Errorf("worker-2: %+v", n)
	}
}

func TestService(t *testing.T) {
	nodes, err := forService(fleet(t), "lab", "backend")
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := writeServiceText(&b, "lab/backend", nodes); err != nil {
		t.Fatal(err)
	}
	want := `NODE      SERVICE PORT                 PROGRAMMED  IN API  MISSING                                                        STALE                SINCE
worker-1  lab/backend:http (80/tcp)    10          13      4 (10.244.3.11:8080, 10.244.3.12:8080, 10.244.3.13:8080, ...)  1 (10.244.3.1:8080)  2026-11-25T02:41:00Z
worker-1  lab/backend:grpc (9090/tcp)  11          10      0                                                              1 (10.244.3.1:9090)  2026-11-25T02:41:00Z
worker-4  unknown: pod proxyhealth-d is Pending, not Running
worker-5  unknown: no report from exporter pod monitoring/proxyhealth-e yet (is it run with --node-report, and allowed to write ConfigMaps in its namespace?)
worker-6  unknown: report monitoring/proxyhealth-node-worker-6 is 1h1m old, written at 2026-11-25T01:41:00Z (its exporter rewrites it every 5m while it runs): the exporter stopped or cannot write it

lab/backend: stale rules on 1 node, in step on 2 nodes, 3 unknown
`
	if got := b.String(); got != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
	if code := serviceExitCode(nodes); code != exitCritical {
		t.Errorf("exit code %d, want %d", code, exitCritical)
	}
	if len(nodes[0].StaleRules) != 2 || nodes[0].StaleRules[0].MissingCount != 4 || len(nodes[0].StaleRules[0].Missing) != 4 || !nodes[0].StaleRules[0].Since.Equal(since) {
		t.Errorf("decoded evidence: %+v", nodes[0].StaleRules)
	}

	// kube-dns's stale rules are not lab/backend's; a Service no node has stale rules for.
	other, err := forService(fleet(t)[2:], "lab", "backend")
	if err != nil {
		t.Fatal(err)
	}
	if code := serviceExitCode(other); code != exitCannotRun {
		t.Errorf("nodes in step but one unread: exit %d, want %d", code, exitCannotRun)
	}
	healthy, _ := forService(fleet(t)[4:], "lab", "backend")
	if code := serviceExitCode(healthy); code != exitHealthy {
		t.Errorf("all in step: exit %d, want %d (%+v)", code, exitHealthy, healthy)
	}
}

func TestExitCode(t *testing.T) {
	report := func(v verdict.Verdict) nodeStatus { return nodeStatus{Report: &verdict.Report{Verdict: v}} }
	unread := nodeStatus{Err: "refused"}
	for _, tc := range []struct {
		nodes []nodeStatus
		want  int
	}{
		{nil, exitCannotRun},
		{[]nodeStatus{report(verdict.Healthy), report(verdict.Healthy)}, exitHealthy},
		{[]nodeStatus{report(verdict.Healthy), report(verdict.WarningsOnly)}, exitWarnings},
		{[]nodeStatus{report(verdict.WarningsOnly), unread}, exitCannotRun},
		{[]nodeStatus{unread, report(verdict.CriticalFound), report(verdict.WarningsOnly)}, exitCritical},
		{[]nodeStatus{report(verdict.Healthy), report(verdict.Unknown)}, exitCannotRun},
		{[]nodeStatus{report(verdict.Unknown), report(verdict.WarningsOnly)}, exitCannotRun},
		{[]nodeStatus{report(verdict.Unknown), report(verdict.CriticalFound)}, exitCritical},
	} {
		if got := exitCode(tc.nodes); got != tc.want {
			t.Errorf("%+v: exit %d, want %d", tc.nodes, got, tc.want)
		}
	}
}

// A node whose check could not run is never healthy: unknown, exit code 3, as diagnose says for
// it, even when its exporter says "healthy" (as exporters did before the one health model), and
// whatever only warns elsewhere; a critical finding elsewhere is certain.
func TestFleetNotChecked(t *testing.T) {
	notChecked := func(node string, v verdict.Verdict, findings ...verdict.Finding) []byte {
		b, err := json.Marshal(verdict.Report{Node: node, Verdict: v, Time: since, Findings: append([]verdict.Finding{}, findings...),
			NotChecked: []verdict.NotChecked{{Causes: []verdict.Cause{verdict.StaleRules}, Reason: "no Kubernetes API is configured"}}})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	invalid := verdict.Finding{Cause: verdict.InvalidNotDropped, Severity: verdict.Warning, Summary: "INVALID packets not dropped."}
	read := func(bodies map[string][]byte) []nodeStatus {
		pods := []corev1.Pod{pod("a", "worker-1", corev1.PodRunning), pod("b", "worker-2", corev1.PodRunning)}
		nodes := join([]corev1.ConfigMap{*reportObject("worker-1", bodies["a"]), *reportObject("worker-2", bodies["b"])}, pods, defaultMaxStatusBytes, judgedNow)
		sortNodes(nodes)
		return nodes
	}

	nodes := read(map[string][]byte{"a": statusBody(t, "worker-1", verdict.Healthy), "b": notChecked("worker-2", "healthy")})
	if code := exitCode(nodes); code != exitCannotRun {
		t.Errorf("a node not checked throughout, the other healthy: exit %d, want %d", code, exitCannotRun)
	}
	var b bytes.Buffer
	if err := writeFleetText(&b, nodes); err != nil {
		t.Fatal(err)
	}
	want := `NODE      VERDICT  CAUSES                    WORST SERVICE
worker-2  unknown  not checked: stale_rules  -
worker-1  healthy  -                         -

2 nodes: 0 critical, 1 unknown (0 not read), 0 warning, 1 healthy
`
	if got := b.String(); got != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
	b.Reset()
	if err := writeFleetJSON(&b, nodes); err != nil {
		t.Fatal(err)
	}
	var doc fleetJSON
	if err := json.Unmarshal(b.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Nodes[0].Node != "worker-2" || doc.Nodes[0].Verdict != verdict.Unknown || doc.Nodes[0].Status.Verdict != verdict.Unknown {
		t.Errorf("JSON: %s", b.String())
	}

	nodes = read(map[string][]byte{"a": statusBody(t, "worker-1", verdict.WarningsOnly, invalid), "b": notChecked("worker-2", verdict.Unknown)})
	if code := exitCode(nodes); code != exitCannotRun {
		t.Errorf("warnings on one node, the other not checked throughout: exit %d, want %d", code, exitCannotRun)
	}
	nodes = read(map[string][]byte{"a": statusBody(t, "worker-1", verdict.Healthy), "b": notChecked("worker-2", verdict.Unknown, invalid)})
	if code := exitCode(nodes); code != exitCannotRun || nodes[0].verdict() != verdict.Unknown {
		t.Errorf("a warning and something not checked on one node: exit %d (%s), want %d", code, nodes[0].verdict(), exitCannotRun)
	}
	crit := staleFinding(dnsTCP, []string{"10.244.2.1:53"}, nil, 1, 2)
	nodes = read(map[string][]byte{"a": statusBody(t, "worker-1", verdict.CriticalFound, crit), "b": notChecked("worker-2", verdict.Unknown)})
	if code := exitCode(nodes); code != exitCritical {
		t.Errorf("critical on one node, the other not checked throughout: exit %d, want %d", code, exitCritical)
	}
}

// What is not a report to believe leaves its node unknown, with why: not JSON, no verdict, the
// report of another node under this one's name, a report older than two heartbeats; a pod
// being replaced does not hide its node's report.
func TestJoinRefusesWhatIsNotAReport(t *testing.T) {
	forged := reportObject("n3", statusBody(t, "n4", verdict.Healthy))
	forged.Name = "proxyhealth-node-n3"
	lateBody := statusBody(t, "n5", verdict.Healthy)
	var rep verdict.Report
	if err := json.Unmarshal(lateBody, &rep); err != nil {
		t.Fatal(err)
	}
	rep.Time = since.Add(-5 * time.Minute)
	lateBody, _ = json.Marshal(rep)
	late := reportObject("n5", lateBody)
	late.Data["heartbeat_seconds"] = "20"
	terminating := pod("old", "n6", corev1.PodRunning)
	terminating.DeletionTimestamp = &metav1.Time{Time: since}
	nodes := join([]corev1.ConfigMap{
		*reportObject("n1", []byte("<html>not found</html>")),
		*reportObject("n2", []byte(`{"node": "n2"}`)),
		*forged, *late,
		*reportObject("n6", statusBody(t, "n6", verdict.Healthy)),
	}, []corev1.Pod{pod("new", "n6", corev1.PodRunning), terminating}, defaultMaxStatusBytes, judgedNow)
	want := map[string]string{
		"n1": "report monitoring/proxyhealth-node-n1: decoding status.json:",
		"n2": "report monitoring/proxyhealth-node-n2 has no verdict",
		"n3": `report monitoring/proxyhealth-node-n3: it is the report of node "n4", not of the node its name says`,
		"n5": "report monitoring/proxyhealth-node-n5 is 6m old, written at 2026-11-25T02:36:00Z (its exporter rewrites it every 20s while it runs)",
	}
	for _, n := range nodes {
		if w, ok := want[n.Node]; ok && (n.Report != nil || !strings.HasPrefix(n.Err, w)) {
			t.Errorf("%s: %q, want %q", n.Node, n.Err, w)
		}
		if n.Node == "n6" && (n.Report == nil || n.Pod != "monitoring/new") {
			t.Errorf("n6: %+v", n)
		}
	}
	if len(nodes) != 5 {
		t.Errorf("%d nodes, want 5: %+v", len(nodes), nodes)
	}
}

func TestFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--output=yaml"},
		{"--service=backend"},
		{"--service=lab/"},
		{"--node=n1", "--service=lab/backend"},
		{"--timeout=0s"},
		{"--selector=a in (b"},
		{"extra"},
		{"--no-such-flag"},
	} {
		if code := run(context.Background(), args, io.Discard, io.Discard); code != exitCannotRun {
			t.Errorf("%v: exit %d, want %d", args, code, exitCannotRun)
		}
	}
	o, err := parseFlags([]string{"-n", "monitoring", "-l", "app=ph", "--context", "prod", "--service", "lab/backend", "-o", "json"}, io.Discard)
	if err != nil || o.namespace != "monitoring" || o.selector != "app=ph" || o.service != "lab/backend" || o.output != "json" {
		t.Fatalf("%+v, %v", o, err)
	}
	if o, _ := parseFlags(nil, io.Discard); o.namespace != "" || o.selector != defaultSelector || o.maxStatusBytes != 64<<10 {
		t.Errorf("defaults: %+v", o)
	}
	if code := run(context.Background(), []string{"--help"}, io.Discard, io.Discard); code != exitHealthy {
		t.Errorf("--help: exit %d", code)
	}
}
