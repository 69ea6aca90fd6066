package nodereport

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/proxyhealth/proxyhealth/internal/verdict"
)

var judged = time.Date(2026, 11, 28, 3, 0, 0, 0, time.UTC)

func addrs(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%d]:8080", prefix, i+1)
	}
	return out
}

// staleFinding is a stale_rules finding as the exporter writes it, with up to 20 addresses
// of each kind (the evidence's cap) and kube-proxy's side.
func staleFinding(i, missing, stale int) verdict.Finding {
	svc := verdict.Service{Namespace: "team-" + fmt.Sprint(i), Name: "backend-service-" + fmt.Sprint(i), Port: 8080, Protocol: "tcp", PortName: "http"}
	healthy := true
	ev := verdict.StaleRulesEvidence{
		Programmed: 65, Expected: 77, MissingCount: missing, StaleCount: stale,
		Missing: addrs("[fd00:10:244:2::", min(missing, 20)), Stale: addrs("[fd00:10:244:1::", min(stale, 20)),
		ByFamily: []verdict.FamilyDrift{{Family: "IPv6", MissingCount: missing, StaleCount: stale}},
		Since:    judged.Add(-14 * time.Minute), GracePeriodSeconds: 60, ProxyMode: "iptables",
		ExplainedBy: []verdict.Cause{verdict.KubeProxyWatchFailing},
		KubeProxy: &verdict.KubeProxyEvidence{Up: true, Healthy: &healthy, LastSync: judged.Add(-30 * time.Second),
			ListErrors:            []verdict.ListErrorCount{{Resource: "endpointslices", Verb: "watch", Recent: 1, Total: 1}},
			ListErrorsSpanSeconds: 600, LastListError: judged.Add(-19 * time.Minute), LogFiles: []string{"/var/log/pods/kube-system_kube-proxy-x2b9c_0f6e/kube-proxy/0.log"}},
	}
	return verdict.Finding{Cause: verdict.StaleRules, Severity: verdict.Critical, Service: &svc,
		Summary:  fmt.Sprintf("kube-proxy's rules for %s differ from the API: 65 endpoints programmed, 77 in the API (%d missing, %d stale) for 14m, because kube-proxy's list/watch of the API failed (endpointslices watch 1; last at 2026-11-28T02:41:07Z); restart kube-proxy on this node.", svc, missing, stale),
		Evidence: ev, Runbook: verdict.RunbookBase + "#proxyhealthkubeproxyrulesstale"}
}

func unrepliedFinding(i int) verdict.Finding {
	svc := verdict.Service{Namespace: "team-" + fmt.Sprint(i), Name: "web-" + fmt.Sprint(i), Port: 443, Protocol: "tcp", PortName: "https"}
	return verdict.Finding{Cause: verdict.UnrepliedFlows, Severity: verdict.Warning, Service: &svc,
		Summary:  fmt.Sprintf("12 connections to %s ended without a reply in the last 10m.", svc),
		Evidence: map[string]any{"ended": 12, "open": 1, "by_reason": []map[string]any{{"reason": "remote_endpoint", "flows": 12}}},
		Runbook:  verdict.RunbookBase + "#unreplied-service-flows"}
}

func reportOf(findings ...verdict.Finding) verdict.Report {
	return verdict.Report{Node: "ip-10-0-17-203.eu-west-1.compute.internal", Verdict: verdict.Judge(findings, nil), Time: judged,
		WindowSeconds: 600, Findings: findings, NotChecked: []verdict.NotChecked{},
		Notes: []string{"kube-proxy v1.36.3 is among the versions proxyhealth is tested with."}}
}

// The report sizes BENCHMARKS.md's API load is estimated from: a healthy node, incident 3 on
// one Service port (the example of docs/verdict.md), and the worst a node can say (the
// verdict's cap of 50 stale ports with 20 IPv6 addresses of each kind, and 50 unreplied
// Services), which Encode cuts to MaxBytes.
func TestReportSizes(t *testing.T) {
	worst := []verdict.Finding{}
	for i := range 50 {
		worst = append(worst, staleFinding(i, 120, 40))
	}
	for i := range 50 {
		worst = append(worst, unrepliedFinding(i))
	}
	for _, tc := range []struct {
		name string
		rep  verdict.Report
		max  int
	}{
		{"healthy", reportOf(), 1 << 10},
		{"stale rules on one Service port", reportOf(staleFinding(0, 12, 5)), 4 << 10},
		{"the worst: 50 stale ports and 50 unreplied Services", reportOf(worst...), MaxBytes},
	} {
		b, err := Encode(tc.rep, MaxBytes)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		full, _ := json.Marshal(tc.rep)
		cm := Object("proxyhealth", b, tc.rep.Node, "0c5a1f7e-2d1b-4f7e-9c55-6b1d3c0e8a21", 5*time.Minute)
		obj, err := json.Marshal(cm)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: status.json %d bytes (%d whole), the ConfigMap %d bytes as JSON", tc.name, len(b), len(full), len(obj))
		if len(b) > tc.max {
			t.Errorf("%s: %d bytes, over %d", tc.name, len(b), tc.max)
		}
		var back verdict.Report
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatal(err)
		}
		if got := verdict.Judge(back.Findings, back.NotChecked); got != tc.rep.Verdict {
			t.Errorf("%s: the encoded report judges %s, want %s", tc.name, got, tc.rep.Verdict)
		}
	}
}

// TestEncodeBound: a report over the bound loses the evidence of its last findings first, then
// those findings, with a note; the first finding (the worst) stays, so the verdict does not
// change; what cannot fit at all is an error, never a larger object.
func TestEncodeBound(t *testing.T) {
	rep := reportOf(staleFinding(0, 12, 5), unrepliedFinding(1), unrepliedFinding(2))
	whole, _ := json.Marshal(rep)
	for limit := len(whole); limit > 0; limit -= 97 {
		b, err := Encode(rep, limit)
		if err != nil {
			if limit > 1500 {
				t.Errorf("limit %d: %v", limit, err)
			}
			continue
		}
		if len(b) > limit {
			t.Fatalf("limit %d: %d bytes", limit, len(b))
		}
		var back verdict.Report
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatal(err)
		}
		if len(back.Findings) == 0 || back.Findings[0].Cause != verdict.StaleRules || verdict.Judge(back.Findings, back.NotChecked) != verdict.CriticalFound {
			t.Fatalf("limit %d: the worst finding was lost: %s", limit, b)
		}
		if left := len(rep.Findings) - len(back.Findings); left > 0 && !strings.Contains(strings.Join(back.Notes, " "), fmt.Sprintf("%d more findings left out", left)) {
			t.Errorf("limit %d: %d findings left out without a note: %v", limit, left, back.Notes)
		}
	}
	if rep.Findings[2].Evidence == nil || len(rep.Findings) != 3 {
		t.Errorf("Encode changed the caller's report")
	}
}

func TestName(t *testing.T) {
	if got := Name("worker-3"); got != "proxyhealth-node-worker-3" {
		t.Errorf("Name = %q", got)
	}
	long := strings.Repeat("a", 60) + "." + strings.Repeat("b", 60) + "." + strings.Repeat("c", 60) + "." + strings.Repeat("d", 60)
	other := long[:len(long)-1] + "e"
	a, b := Name(long), Name(other)
	if len(a) > 253 || a == b || len(validation.IsDNS1123Subdomain(a)) > 0 {
		t.Errorf("Name of a 243-character node: %q (%d), of one differing in its last: %q", a, len(a), b)
	}
}

// TestDecodeRefuses: an object larger than the bound is not read, nor one that names another
// node than its own name says.
func TestDecodeRefuses(t *testing.T) {
	b, err := Encode(reportOf(staleFinding(0, 12, 5)), MaxBytes)
	if err != nil {
		t.Fatal(err)
	}
	cm := Object("proxyhealth", b, "ip-10-0-17-203.eu-west-1.compute.internal", "uid", 5*time.Minute)
	if r, err := Decode(cm, MaxBytes); err != nil || r.Heartbeat != 5*time.Minute || r.Report.Verdict != verdict.CriticalFound {
		t.Fatalf("Decode: %+v, %v", r, err)
	}
	if _, err := Decode(cm, len(b)-1); err == nil || !strings.Contains(err.Error(), "over the bound") {
		t.Errorf("Decode of a report over the bound: %v", err)
	}
	forged := cm.DeepCopy()
	forged.Name = Name("worker-1")
	if _, err := Decode(forged, MaxBytes); err == nil || !strings.Contains(err.Error(), "not of the node its name says") {
		t.Errorf("Decode of another node's report under worker-1's name: %v", err)
	}
	if _, err := Decode(&corev1.ConfigMap{}, MaxBytes); err == nil {
		t.Errorf("Decode of an empty ConfigMap succeeded")
	}
}
