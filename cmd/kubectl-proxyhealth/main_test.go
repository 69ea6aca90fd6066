package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
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

// fleet is five exporters, as the pod proxy would answer for them: worker-1 critical (stale rules
// for lab/backend on two ports, and kube-dns), worker-2 healthy, worker-3 warning, worker-4's
// pod Pending, worker-5's proxy refused.
func fleet(t *testing.T) []nodeStatus {
	t.Helper()
	pods := []corev1.Pod{
		pod("proxyhealth-b", "worker-2", corev1.PodRunning),
		pod("proxyhealth-a", "worker-1", corev1.PodRunning),
		pod("proxyhealth-c", "worker-3", corev1.PodRunning),
		pod("proxyhealth-d", "worker-4", corev1.PodPending),
		pod("proxyhealth-e", "worker-5", corev1.PodRunning),
	}
	bodies := map[string][]byte{
		"proxyhealth-a": statusBody(t, "worker-1", verdict.CriticalFound,
			staleFinding(backendHTTP, []string{"10.244.3.11:8080", "10.244.3.12:8080", "10.244.3.13:8080", "10.244.3.14:8080"}, []string{"10.244.3.1:8080"}, 10, 13),
			staleFinding(backendGRPC, nil, []string{"10.244.3.1:9090"}, 11, 10),
			staleFinding(dnsTCP, []string{"10.244.2.1:53"}, nil, 1, 2),
			verdict.Finding{Cause: verdict.InvalidNotDropped, Severity: verdict.Warning, Summary: "INVALID packets not dropped."}),
		"proxyhealth-b": statusBody(t, "worker-2", verdict.Healthy),
		"proxyhealth-c": statusBody(t, "worker-3", verdict.WarningsOnly,
			verdict.Finding{Cause: verdict.UnrepliedFlows, Severity: verdict.Warning, Service: &dnsTCP, Summary: "unreplied."},
			verdict.Finding{Cause: verdict.InvalidNotDropped, Severity: verdict.Warning, Summary: "INVALID packets not dropped."}),
	}
	read := func(_ context.Context, p *corev1.Pod) ([]byte, error) {
		if p.Name == "proxyhealth-e" {
			return nil, errors.New("GET /status through the pod proxy: the server is currently unable to handle the request\n(get pods proxyhealth-e:9869)")
		}
		if p.Name == "proxyhealth-d" {
			t.Errorf("a Pending pod's /status was asked for")
		}
		return bodies[p.Name], nil
	}
	nodes := readAll(context.Background(), pods, read, 2, time.Second)
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
worker-4  unknown   -                                    error: pod proxyhealth-d is Pending, not Running (monitoring/proxyhealth-d)
worker-5  unknown   -                                    error: GET /status through the pod proxy: the server is currently unable to handle the request (get pods proxyhealth-e:9869) (monitoring/proxyhealth-e)
worker-3  warning   unreplied_flows,invalid_not_dropped  kube-system/kube-dns:dns-tcp (53/tcp)
worker-2  healthy   -                                    -

5 nodes: 1 critical, 2 unknown (2 not read), 1 warning, 1 healthy
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
	if len(got.Nodes) != 5 {
		t.Fatalf("%d nodes:\n%s", len(got.Nodes), b.String())
	}
	first := got.Nodes[0]
	if first.Node != "worker-1" || first.Pod != "monitoring/proxyhealth-a" || first.Verdict != "critical" ||
		strings.Join(first.Causes, ",") != "stale_rules,invalid_not_dropped" || first.WorstService == nil || *first.WorstService != backendHTTP ||
		first.Status == nil || len(first.Status.Findings) != 4 || len(first.Status.Findings[0].Evidence.Missing) != 4 {
		t.Errorf("worker-1: %+v", first)
	}
	if n := got.Nodes[1]; n.Node != "worker-4" || n.Verdict != "unknown" || n.Status != nil || n.Error != "pod proxyhealth-d is Pending, not Running" || n.Causes == nil {
		t.Errorf("worker-4: %+v", n)
	}
	if n := got.Nodes[4]; n.Node != "worker-2" || n.Verdict != "healthy" || len(n.Causes) != 0 || n.WorstService != nil {
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
worker-4  unknown: pod proxyhealth-d is Pending, not Running (monitoring/proxyhealth-d)
worker-5  unknown: GET /status through the pod proxy: the server is currently unable to handle the request (get pods proxyhealth-e:9869) (monitoring/proxyhealth-e)

lab/backend: stale rules on 1 node, in step on 2 nodes, 2 unknown
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
	healthy, _ := forService(fleet(t)[3:], "lab", "backend")
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
		nodes := readAll(context.Background(), pods, func(_ context.Context, p *corev1.Pod) ([]byte, error) {
			return bodies[p.Name], nil
		}, 2, time.Second)
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

func TestReadAllRefusesWhatIsNotAStatus(t *testing.T) {
	pods := []corev1.Pod{pod("a", "n1", corev1.PodRunning), pod("b", "n2", corev1.PodRunning)}
	terminating := pod("c", "n3", corev1.PodRunning)
	terminating.DeletionTimestamp = &metav1.Time{Time: since}
	pods = append(pods, terminating)
	bodies := map[string]string{"a": "<html>not found</html>", "b": `{"node": "n2"}`}
	nodes := readAll(context.Background(), pods, func(_ context.Context, p *corev1.Pod) ([]byte, error) {
		return []byte(bodies[p.Name]), nil
	}, 4, time.Second)
	if !strings.HasPrefix(nodes[0].Err, "decoding /status:") || !strings.Contains(nodes[1].Err, "no verdict") ||
		nodes[2].Err != "pod c is terminating" {
		t.Errorf("%+v", nodes)
	}
}

func TestReadAllBoundsEachRead(t *testing.T) {
	pods := []corev1.Pod{pod("slow", "n1", corev1.PodRunning)}
	nodes := readAll(context.Background(), pods, func(ctx context.Context, _ *corev1.Pod) ([]byte, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	}, 1, 10*time.Millisecond)
	if nodes[0].Err != context.DeadlineExceeded.Error() {
		t.Errorf("%+v", nodes[0])
	}
}

func TestPodPort(t *testing.T) {
	p := pod("a", "n1", corev1.PodRunning)
	for port, want := range map[string]string{"metrics": "9869", "9870": "9870"} {
		if got, err := podPort(&p, port); err != nil || got != want {
			t.Errorf("podPort(%q) = %q, %v; want %q", port, got, err, want)
		}
	}
	if _, err := podPort(&p, "web"); err == nil {
		t.Errorf("an unknown port name was accepted")
	}
}

func TestFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--output=yaml"},
		{"--service=backend"},
		{"--service=lab/"},
		{"--scheme=ftp"},
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
	if o, _ := parseFlags(nil, io.Discard); o.namespace != "" || o.selector != defaultSelector || o.port != "metrics" {
		t.Errorf("defaults: %+v", o)
	}
	if code := run(context.Background(), []string{"--help"}, io.Discard, io.Discard); code != exitHealthy {
		t.Errorf("--help: exit %d", code)
	}
}

func TestProxyErrorDetail(t *testing.T) {
	unavailable := &apierrors.StatusError{ErrStatus: metav1.Status{Code: 503, Message: "the server is currently unable to handle the request",
		Details: &metav1.StatusDetails{Causes: []metav1.StatusCause{{Type: metav1.CauseTypeUnexpectedServerResponse, Message: "unknown"}}}}}
	refused := "error trying to reach service: dial tcp 172.18.0.3:19877: connect: connection refused"
	status, _ := json.Marshal(metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Code: 503, Message: refused})
	for _, tc := range []struct {
		body []byte
		want string
	}{
		{[]byte(refused + "\n"), "HTTP 503: " + refused},
		{status, "HTTP 503: " + refused},
		{nil, ""},
	} {
		if got := proxyErrorDetail(unavailable, tc.body); got != tc.want {
			t.Errorf("body %q: %q, want %q", tc.body, got, tc.want)
		}
	}
	forbidden := apierrors.NewForbidden(corev1.Resource("pods/proxy"), "proxyhealth-a", errors.New("no RBAC"))
	if got := proxyErrorDetail(forbidden, nil); got != "" {
		t.Errorf("forbidden: %q, want nothing beyond the error's message", got)
	}
}
