package main

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyhealth/proxyhealth/internal/verdict"
)

// Each node's report is read up to --max-status-bytes and no further: a larger one leaves its
// node unknown with the reason, and one of exactly the limit is read.
func TestReportReadBounded(t *testing.T) {
	a := newFakeAPIServer(t)
	const size = 16 << 10
	for _, node := range []string{"worker-1", "worker-2"} {
		// A healthy report padded with JSON whitespace to size bytes.
		b := freshBody(t, node, verdict.Healthy)
		a.addNode(t, node, append(b, bytes.Repeat([]byte(" "), size-len(b))...))
	}
	out, errOut, code := a.run(t, "--max-status-bytes="+strconv.Itoa(size))
	if code != exitHealthy || strings.Count(out, "healthy  -") != 2 {
		t.Errorf("reports of exactly --max-status-bytes: exit %d, want 0 with both nodes healthy:\n%s%s", code, out, errOut)
	}
	out, errOut, code = a.run(t, "--max-status-bytes="+strconv.Itoa(size-1))
	want := "is 16384 bytes, over the bound of 16383 (--max-status-bytes); not read"
	if code != exitCannotRun || strings.Count(out, want) != 2 {
		t.Errorf("reports of --max-status-bytes + 1: exit %d, want 3 with both nodes saying %q:\n%s%s", code, want, out, errOut)
	}
	if errOut != "" {
		t.Errorf("stderr: %q, want nothing (the reason is the node's)", errOut)
	}
}

// A list response larger than a page of reports at their bound is not read further: what the
// API server returns for a label selector is whatever the exporters wrote.
func TestListResponseBounded(t *testing.T) {
	a := newFakeAPIServer(t)
	a.addNode(t, "worker-1", freshBody(t, "worker-1", verdict.Healthy))
	huge := corev1.ConfigMapList{TypeMeta: metav1.TypeMeta{Kind: "ConfigMapList", APIVersion: "v1"},
		Items: []corev1.ConfigMap{*reportObject("worker-1", freshBody(t, "worker-1", verdict.Healthy))}}
	huge.Items[0].Data["padding"] = strings.Repeat("x", 2<<20)
	raw, err := json.Marshal(huge)
	if err != nil {
		t.Fatal(err)
	}
	a.set(func(a *fakeAPIServer) { a.rawReports = raw })
	// A page: 100 reports of 2 x 1000 bytes, and 16 KiB each: 1.8 MB.
	out, errOut, code := a.run(t, "--max-status-bytes=1000")
	if code != exitCannotRun || !strings.Contains(errOut, "listing the node reports") || !strings.Contains(errOut, "at --max-status-bytes); not read further") {
		t.Errorf("a 2 MiB list: exit %d, want 3 naming the bound:\n%s%s", code, out, errOut)
	}
}

func TestMaxStatusBytesFlag(t *testing.T) {
	for _, v := range []string{"0", "-1", "lots"} {
		if _, err := parseFlags([]string{"--max-status-bytes=" + v}, &bytes.Buffer{}); err == nil {
			t.Errorf("--max-status-bytes=%s accepted", v)
		}
	}
}

// An API server that never answers the lists ends the run within --timeout, exit code 3 with
// the reason: kubectl's --request-timeout is none by default.
func TestListBounded(t *testing.T) {
	a := newFakeAPIServer(t)
	a.set(func(a *fakeAPIServer) { a.listNeverAnswers = true })
	type result struct {
		out, errOut string
		code        int
	}
	done := make(chan result, 1)
	go func() {
		out, errOut, code := a.run(t, "--timeout=300ms")
		done <- result{out, errOut, code}
	}()
	select {
	case r := <-done:
		if r.code != exitCannotRun || !strings.Contains(r.errOut, "listing the node reports") {
			t.Errorf("exit %d, want 3 naming the list:\n%s%s", r.code, r.out, r.errOut)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the run still waits for the list after 10s (--timeout=300ms)")
	}
}

// The plugin asks the API server for the reports and the exporter pods, and for nothing else:
// no proxy, no token. --node shows that node's findings with their evidence.
func TestReadsOnlyReportsAndPods(t *testing.T) {
	a := newFakeAPIServer(t)
	a.addNode(t, "worker-1", freshBody(t, "worker-1", verdict.CriticalFound,
		staleFinding(backendHTTP, []string{"10.244.3.11:8080"}, []string{"10.244.3.1:8080"}, 10, 10)))
	a.addNode(t, "worker-2", freshBody(t, "worker-2", verdict.Healthy))
	for _, args := range [][]string{nil, {"--service=lab/backend"}, {"--node=worker-1"}, {"--node=worker-1", "-o", "json"}} {
		out, errOut, code := a.run(t, args...)
		if code != exitCritical {
			t.Errorf("%q: exit %d, want 2:\n%s%s", args, code, out, errOut)
		}
	}
	out, _, _ := a.run(t, "--node=worker-1")
	for _, want := range []string{
		"report monitoring/proxyhealth-node-worker-1, judged at ",
		"node worker-1: critical (1 critical)",
		"CRITICAL stale_rules lab/backend:http (80/tcp)",
		"    missing: 10.244.3.11:8080",
		"    stale: 10.244.3.1:8080",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("--node=worker-1 lacks %q:\n%s", want, out)
		}
	}
	if out, errOut, code := a.run(t, "--node=worker-9"); code != exitCannotRun || !strings.Contains(errOut, "no report of node worker-9") {
		t.Errorf("--node of a node without a report: exit %d\n%s%s", code, out, errOut)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, p := range a.paths {
		if p != "GET /api/v1/namespaces/monitoring/configmaps" && p != "GET /api/v1/namespaces/monitoring/pods" {
			t.Errorf("the plugin asked for %s", p)
		}
	}
}
