//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyhealth/proxyhealth/internal/verdict"
)

// The verdict labs' exporters (each lab has a node namespace of its own).
const (
	verdictExporterPort       = 19877
	verdictKernelExporterPort = 19878
)

// labReport is /status, and diagnose's JSON, as a client reads them.
type labReport struct {
	Node     string `json:"node"`
	Verdict  string `json:"verdict"`
	Findings []struct {
		Cause    string           `json:"cause"`
		Severity string           `json:"severity"`
		Service  *verdict.Service `json:"service"`
		Summary  string           `json:"summary"`
		Evidence struct {
			Programmed   int                   `json:"programmed"`
			Expected     int                   `json:"expected"`
			MissingCount int                   `json:"missing_count"`
			StaleCount   int                   `json:"stale_count"`
			Missing      []string              `json:"missing"`
			Stale        []string              `json:"stale"`
			ByFamily     []verdict.FamilyDrift `json:"by_family"`
			ExplainedBy  []string              `json:"explained_by"`
			KubeProxy    *struct {
				Up            bool                     `json:"up"`
				Healthy       *bool                    `json:"healthy"`
				ListErrors    []verdict.ListErrorCount `json:"list_errors"`
				LastListError time.Time                `json:"last_list_error"`
			} `json:"kube_proxy"`
		} `json:"evidence"`
		Runbook string `json:"runbook"`
	} `json:"findings"`
	NotChecked []verdict.NotChecked `json:"not_checked"`
	// diagnose --service only.
	ServicePorts []struct {
		Service    verdict.Service `json:"service"`
		Expected   []string        `json:"expected"`
		Programmed []string        `json:"programmed"`
		Missing    []string        `json:"missing"`
		Stale      []string        `json:"stale"`
		Chains     []string        `json:"chains"`
	} `json:"service_ports"`
	raw string
}

func (r labReport) causes() []string {
	var out []string
	for _, f := range r.Findings {
		out = append(out, f.Cause)
	}
	return out
}

func parseReport(t *testing.T, body string) labReport {
	t.Helper()
	var r labReport
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		t.Fatalf("parsing a report: %v\n%s", err, body)
	}
	r.raw = body
	return r
}

func (e *Exporter) status(t *testing.T) labReport {
	t.Helper()
	body, err := e.l.Get(e.l.Node, strings.TrimSuffix(e.URL, "/metrics")+"/status")
	if err != nil {
		t.Fatalf("GET /status: %v", err)
	}
	return parseReport(t, body)
}

// diagnose runs `proxyhealth diagnose` once in the node namespace and returns its JSON report,
// its exit code and its stderr.
func diagnose(t *testing.T, cp *ControlPlane, kubeconfig string, extra ...string) (labReport, int, string) {
	t.Helper()
	args := append([]string{"netns", "exec", cp.Lab.Node, exporterBin, "diagnose",
		"--kubeconfig=" + kubeconfig,
		"--node-name=" + labNodeName,
		"--kubeproxy.log-path=" + cp.KubeProxy.log,
		"--api.probe-interval=1s",
		"--window=3s",
		"--output=json",
	}, extra...)
	cmd := exec.Command("ip", args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		code = exit.ExitCode()
	case err != nil:
		t.Fatalf("diagnose: %v\n%s", err, stderr.String())
	}
	return parseReport(t, stdout.String()), code, stderr.String()
}

// TestVerdictStaleRules is incident 3 told as the issue asks: with the real kube-apiserver and a
// real kube-proxy whose API connection is black-holed, both the running exporter's /status and
// a one-shot `proxyhealth diagnose` name stale_rules for lab/backend:http with the exact stale
// and missing addresses, explained by kube-proxy's watch failure from its log; a healthy node
// gives verdict healthy and exit code 0, before and after.
//
// Along the way, the same verdict where else the engineer looks: the exporter's Node condition
// ProxyHealthy and its Events (--node-conditions, with deploy/components/node-conditions'
// RBAC), and `kubectl proxyhealth` reading the node's report (--node-report, with
// deploy/components/node-report's Role; the plugin with deploy/components/kubectl-plugin's
// RBAC), read back through the API.
func TestVerdictStaleRules(t *testing.T) {
	requireKube(t)
	requireExporter(t)
	requirePlugin(t)
	l := newLabRules(t, labRawRules)
	cp := StartControlPlane(t, l, ControlPlaneOptions{})
	kubeconfig := cp.readOnlyKubeconfig("proxyhealth.kubeconfig", apiserverAddr)
	cp.grantNodeConditions()
	cp.grantNodeReport()
	oncall := cp.pluginKubeconfig()
	e := l.StartExporter("proxyhealth", verdictExporterPort, nil,
		append(driftExporterArgs(kubeconfig), append(append(kubeProxyExporterArgs(cp), "--status.window=1m",
			"--node-conditions"), nodeReportArgs()...)...)...)
	cp.registerExporterPod("proxyhealth-lab", labNodeName, uplinkN, verdictExporterPort)
	waitDriftSynced(t, e, cp)

	const ns, name = "lab", "backend"
	cp.CreateService(httpService(ns, name, "10.96.0.50", nil))
	oldEps, oldAddrs := remoteEndpoints(3, 1, 10)
	cp.ApplySlice(EndpointSlice(ns, name, name+"-1", httpSlicePorts, oldEps))
	cp.WaitServicePortEndpoints(30*time.Second, ns+"/"+name+":http", "tcp", oldAddrs)
	waitConverged(t, e, cp, "lab/backend with 10 endpoints checked without drift")

	// Healthy: /status and diagnose agree.
	waitFor(t, 20*time.Second, "/status healthy", func() (bool, string) {
		r := e.status(t)
		return r.Verdict == "healthy" && len(r.NotChecked) == 0, r.raw
	})
	checkLandingPage(t, e, "healthy", "healthy")
	r, code, stderr := diagnose(t, cp, kubeconfig)
	if code != 0 || r.Verdict != "healthy" || len(r.Findings) != 0 || r.Node != labNodeName {
		t.Fatalf("diagnose on a healthy node: exit %d, report:\n%s\nstderr:\n%s", code, r.raw, stderr)
	}

	// The Node condition and the plugin agree.
	waitFor(t, 30*time.Second, "node condition ProxyHealthy=True", func() (bool, string) {
		c := cp.nodeCondition()
		return c != nil && c.Status == corev1.ConditionTrue && c.Reason == "ProxyHealthy", describeCondition(c)
	})
	healthyRow := regexp.MustCompile(`(?m)^lab-node\s+healthy\s+-\s+-$`)
	waitFor(t, 30*time.Second, "kubectl proxyhealth: lab-node healthy", func() (bool, string) {
		out, perr, pcode := pluginRun(t, cp, oncall)
		return pcode == 0 && healthyRow.MatchString(out), fmt.Sprintf("exit %d\n%s%s", pcode, out, perr)
	})
	var fleet pluginNodes
	out, perr, pcode := pluginRun(t, cp, oncall, "-o", "json")
	parsePluginJSON(t, out, &fleet)
	if pcode != 0 || len(fleet.Nodes) != 1 || fleet.Nodes[0].Node != labNodeName || fleet.Nodes[0].Pod != exporterNamespace+"/proxyhealth-lab" ||
		fleet.Nodes[0].Verdict != "healthy" || len(fleet.Nodes[0].Causes) != 0 {
		t.Errorf("kubectl proxyhealth -o json on a healthy node: exit %d\n%s%s", pcode, out, perr)
	}
	// Bound in the exporters' namespace only, the engineer must say which: listing pods
	// everywhere is refused, and said so.
	if out, perr, pcode := pluginRunIn(t, cp, oncall); pcode != 3 || out != "" ||
		!strings.Contains(perr, `listing the node reports (selector app.kubernetes.io/name=proxyhealth,app.kubernetes.io/component=node-report in all namespaces): configmaps is forbidden`) {
		t.Errorf("kubectl proxyhealth without -n, bound in %s only: exit %d, want 3\n%s%s", exporterNamespace, pcode, out, perr)
	}
	// A second node whose exporter writes no report: listed with the reason, and the fleet is
	// no longer known healthy.
	cp.registerExporterPod("proxyhealth-node-b", "node-b", unreachablePodIP, verdictExporterPort)
	out, perr, pcode = pluginRun(t, cp, oncall)
	unreachable := regexp.MustCompile(`(?m)^node-b\s+unknown\s+-\s+error: no report from exporter pod monitoring/proxyhealth-node-b yet`)
	if pcode != 3 || !unreachable.MatchString(out) {
		t.Errorf("kubectl proxyhealth with an unreachable exporter: exit %d, want 3\n%s%s", pcode, out, perr)
	}

	// Incident 3: kube-proxy's connection black-holed, the API moves on.
	t.Logf("kube-proxy's fault proxy: %s", cp.Blackhole())
	t.Cleanup(func() { cp.Heal() })
	newEps, _ := remoteEndpoints(3, 3, 13) // 1 and 2 deleted, 11..13 added
	cp.ApplySlice(EndpointSlice(ns, name, name+"-1", httpSlicePorts, newEps))
	changed := time.Now()
	wantService := verdict.Service{Namespace: ns, Name: name, Port: 80, Protocol: "tcp", PortName: "http"}
	wantStale := []string{"10.244.3.1:8080", "10.244.3.2:8080"}
	wantMissing := []string{"10.244.3.11:8080", "10.244.3.12:8080", "10.244.3.13:8080"}
	checkStale := func(what string, r labReport) {
		t.Helper()
		if r.Verdict != "critical" || !slices.Equal(r.causes(), []string{"stale_rules"}) {
			t.Errorf("%s: verdict %s, causes %v, want critical with stale_rules only:\n%s", what, r.Verdict, r.causes(), r.raw)
			return
		}
		f := r.Findings[0]
		ev := f.Evidence
		if f.Severity != "critical" || f.Service == nil || *f.Service != wantService ||
			!slices.Equal(ev.Stale, wantStale) || !slices.Equal(ev.Missing, wantMissing) ||
			ev.StaleCount != 2 || ev.MissingCount != 3 || ev.Programmed != 10 || ev.Expected != 11 ||
			!strings.HasSuffix(f.Runbook, "docs/runbooks.md#proxyhealthkubeproxyrulesstale") {
			t.Errorf("%s: finding %+v\n%s", what, f, r.raw)
		}
		if !strings.Contains(f.Summary, "10 endpoints programmed, 11 in the API (3 missing, 2 stale)") {
			t.Errorf("%s: summary %q", what, f.Summary)
		}
	}

	// The exporter: the drift past its grace period, then (about 40 s after the black-hole,
	// when kube-proxy logs its watches ending) explained by the watch failure, in the same one
	// finding.
	var explained labReport
	waitFor(t, 90*time.Second, "/status: stale_rules explained by kube_proxy_watch_failing", func() (bool, string) {
		r := e.status(t)
		// kube-proxy logs each watch's end on its own, so the finding is explained at the first;
		// wait for the EndpointSlices watch, whose failure the change needs, to be among them.
		ok := len(r.Findings) == 1 && r.Findings[0].Cause == "stale_rules" &&
			slices.Contains(r.Findings[0].Evidence.ExplainedBy, "kube_proxy_watch_failing") &&
			r.Findings[0].Evidence.KubeProxy != nil &&
			slices.ContainsFunc(r.Findings[0].Evidence.KubeProxy.ListErrors, func(l verdict.ListErrorCount) bool { return l.Resource == "endpointslices" })
		if len(r.Findings) > 0 && time.Since(changed) < driftGrace {
			t.Errorf("/status has findings %s after the change, inside the grace period:\n%s", time.Since(changed), r.raw)
		}
		explained = r
		return ok, r.raw
	})
	t.Logf("/status: %s, %d s after the change", explained.Findings[0].Summary, int(time.Since(changed).Seconds()))
	checkStale("/status", explained)
	checkLandingPage(t, e, "incident3_stale_rules", "critical", findingWant{
		Severity: "critical", Cause: "stale_rules", Service: "lab/backend:http (80/tcp)",
		Summary: []string{"kube-proxy's rules for lab/backend:http", "10 endpoints programmed, 11 in the API (3 missing, 2 stale)"},
		Evidence: map[string]string{"programmed": "10", "expected": "11",
			"missing": strings.Join(wantMissing, ", "), "stale": strings.Join(wantStale, ", "),
			"explained_by": "kube_proxy_watch_failing"},
		Runbook: "docs/runbooks.md#proxyhealthkubeproxyrulesstale",
	})
	if kp := explained.Findings[0].Evidence.KubeProxy; kp == nil || !kp.Up || kp.Healthy == nil || !*kp.Healthy || kp.LastListError.IsZero() ||
		!slices.ContainsFunc(kp.ListErrors, func(l verdict.ListErrorCount) bool { return l.Resource == "endpointslices" && l.Total >= 1 }) {
		t.Errorf("/status: kube-proxy's side: %+v", kp)
	}

	// The Node condition, its Events, and the plugin.
	var staleCondition *corev1.NodeCondition
	waitFor(t, 30*time.Second, "node condition ProxyHealthy=False, reason StaleRules", func() (bool, string) {
		staleCondition = cp.nodeCondition()
		c := staleCondition
		return c != nil && c.Status == corev1.ConditionFalse && c.Reason == "StaleRules", describeCondition(c)
	})
	if !strings.Contains(staleCondition.Message, "lab/backend:http (80/tcp)") ||
		!strings.Contains(staleCondition.Message, "10 endpoints programmed, 11 in the API (3 missing, 2 stale)") {
		t.Errorf("node condition message %q", staleCondition.Message)
	}
	t.Logf("node condition: %s", describeCondition(staleCondition))
	backendSvc, err := cp.Client.CoreV1().Services(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 15*time.Second, "StaleRules Events on the Node and on lab/backend", func() (bool, string) {
		nodeEvents, svcEvents := cp.eventsAbout("default", "Node", labNodeName), cp.eventsAbout(ns, "Service", name)
		ok := len(nodeEvents) == 1 && nodeEvents[0].Reason == "StaleRules" && nodeEvents[0].Type == corev1.EventTypeWarning &&
			len(svcEvents) == 1 && svcEvents[0].Reason == "StaleRules" && svcEvents[0].InvolvedObject.UID == backendSvc.UID &&
			strings.Contains(svcEvents[0].Message, "On node "+labNodeName+": kube-proxy's rules for lab/backend:http")
		return ok, fmt.Sprintf("node %+v\nservice %+v", nodeEvents, svcEvents)
	})
	waitFor(t, 30*time.Second, "kubectl proxyhealth: lab-node critical, stale_rules", func() (bool, string) {
		out, perr, pcode = pluginRun(t, cp, oncall)
		return pcode == 2 && regexp.MustCompile(`(?m)^lab-node\s+critical\s+stale_rules\s+lab/backend:http \(80/tcp\)$`).MatchString(out) && unreachable.MatchString(out),
			fmt.Sprintf("exit %d\n%s%s", pcode, out, perr)
	})
	t.Logf("kubectl proxyhealth during the incident:\n%s", out)
	var bySvc struct {
		Service string `json:"service"`
		Nodes   []struct {
			Node       string `json:"node"`
			StaleRules []struct {
				Service    verdict.Service `json:"service"`
				Programmed int             `json:"programmed"`
				Expected   int             `json:"expected"`
				Missing    []string        `json:"missing"`
				Stale      []string        `json:"stale"`
			} `json:"stale_rules"`
			Error string `json:"error"`
		} `json:"nodes"`
	}
	out, perr, pcode = pluginRun(t, cp, oncall, "--service="+ns+"/"+name, "-o", "json")
	parsePluginJSON(t, out, &bySvc)
	if pcode != 2 || len(bySvc.Nodes) != 2 || bySvc.Nodes[0].Node != labNodeName || len(bySvc.Nodes[0].StaleRules) != 1 || bySvc.Nodes[1].Error == "" {
		t.Errorf("kubectl proxyhealth --service: exit %d\n%s%s", pcode, out, perr)
	} else if sr := bySvc.Nodes[0].StaleRules[0]; sr.Service != wantService || sr.Programmed != 10 || sr.Expected != 11 ||
		!slices.Equal(sr.Missing, wantMissing) || !slices.Equal(sr.Stale, wantStale) {
		t.Errorf("kubectl proxyhealth --service: %+v", sr)
	}
	out, _, _ = pluginRun(t, cp, oncall, "--service="+ns+"/"+name)
	if !strings.Contains(out, "lab/backend: stale rules on 1 node, in step on 0 nodes, 1 unknown") {
		t.Errorf("kubectl proxyhealth --service, text:\n%s", out)
	}

	// diagnose, once: the same finding, and the Service side by side.
	r, code, stderr = diagnose(t, cp, kubeconfig, "--service="+ns+"/"+name)
	if code != 2 {
		t.Errorf("diagnose during the incident: exit %d, want 2\nstderr:\n%s", code, stderr)
	}
	checkStale("diagnose", r)
	if len(r.Findings) == 1 && !slices.Equal(r.Findings[0].Evidence.ExplainedBy, []string{"kube_proxy_watch_failing"}) {
		t.Errorf("diagnose: explained by %v, want kube_proxy_watch_failing (read back from kube-proxy's log)", r.Findings[0].Evidence.ExplainedBy)
	}
	if len(r.ServicePorts) != 1 {
		t.Fatalf("diagnose --service: %d ports\n%s", len(r.ServicePorts), r.raw)
	}
	sp := r.ServicePorts[0]
	if sp.Service != wantService || len(sp.Expected) != 11 || len(sp.Programmed) != 10 ||
		!slices.Equal(sp.Stale, wantStale) || !slices.Equal(sp.Missing, wantMissing) || len(sp.Chains) != 1 {
		t.Errorf("diagnose --service: %+v", sp)
	}

	// The text form says the same for people.
	text, err := exec.Command("ip", "netns", "exec", cp.Lab.Node, exporterBin, "diagnose",
		"--kubeconfig="+kubeconfig, "--node-name="+labNodeName, "--kubeproxy.log-path="+cp.KubeProxy.log,
		"--api.probe-interval=1s", "--window=3s", "--service="+ns+"/"+name).Output()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 {
		t.Errorf("diagnose --output=text: %v", err)
	}
	for _, want := range []string{
		"node " + labNodeName + ": critical (1 critical",
		"CRITICAL stale_rules lab/backend:http (80/tcp)",
		"  10.244.3.1:8080   -    yes    stale",
		"  10.244.3.11:8080  yes  -      missing",
	} {
		if !strings.Contains(string(text), want) {
			t.Errorf("diagnose text lacks %q:\n%s", want, text)
		}
	}

	// Healed: healthy again, everywhere.
	t.Logf("kube-proxy's fault proxy: %s", cp.Heal())
	waitFor(t, 60*time.Second, "/status without stale_rules once kube-proxy's connection is healed", func() (bool, string) {
		r := e.status(t)
		return !slices.Contains(r.causes(), "stale_rules"), r.raw
	})
	waitConverged(t, e, cp, "every service port checked after healing")
	// kube-proxy's one watch failure per informer is still in its log: below the threshold of
	// a finding of its own.
	r, code, stderr = diagnose(t, cp, kubeconfig)
	if code != 0 || r.Verdict != "healthy" {
		t.Errorf("diagnose after healing: exit %d, want 0:\n%s\nstderr:\n%s", code, r.raw, stderr)
	}

	// The condition clears, with a new transition, and the recovery is an Event.
	waitFor(t, 30*time.Second, "node condition ProxyHealthy=True again", func() (bool, string) {
		c := cp.nodeCondition()
		return c != nil && c.Status == corev1.ConditionTrue && c.LastTransitionTime.After(staleCondition.LastTransitionTime.Time), describeCondition(c)
	})
	checkLandingPage(t, e, "healed", "healthy")
	waitFor(t, 15*time.Second, "a Normal ProxyHealthy Event on the Node", func() (bool, string) {
		evs := cp.eventsAbout("default", "Node", labNodeName)
		return slices.ContainsFunc(evs, func(e corev1.Event) bool { return e.Reason == "ProxyHealthy" && e.Type == corev1.EventTypeNormal }), fmt.Sprint(evs)
	})
	zero := int64(0)
	if err := cp.Client.CoreV1().Pods(exporterNamespace).Delete(context.Background(), "proxyhealth-node-b", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "kubectl proxyhealth after healing: lab-node healthy", func() (bool, string) {
		out, perr, pcode = pluginRun(t, cp, oncall)
		return pcode == 0 && healthyRow.MatchString(out), fmt.Sprintf("exit %d\n%s%s", pcode, out, perr)
	})
	// The publisher's own series: three patches at least (True, False, True), three Events
	// sent (Node, Service, recovery), no error.
	s := e.Scrape(t)
	checkScrapeSignatures(t, s, readmeReference(t))
	if ok, errs, sent, evErrs, last := s.Sum("proxyhealth_node_condition_patches_total", map[string]string{"result": "success"}),
		s.Sum("proxyhealth_node_condition_patches_total", map[string]string{"result": "error"}),
		s.Sum("proxyhealth_node_events_total", map[string]string{"result": "sent"}),
		s.Sum("proxyhealth_node_events_total", map[string]string{"result": "error"}),
		s.Sum("proxyhealth_node_condition_last_patch_success", nil); ok < 3 || errs != 0 || sent != 3 || evErrs != 0 || last != 1 {
		t.Errorf("node condition series: patches %v ok %v failed, events %v sent %v failed, last patch success %v\n%s\n%s", ok, errs, sent, evErrs, last,
			s.Series("proxyhealth_node_condition_patches_total"), s.Series("proxyhealth_node_events_total"))
	}
}

// diagnoseDuring runs diagnose in the lab's node namespace over window while during runs (after
// diagnose has had startAfter to start listening), and returns its JSON report and exit code.
func diagnoseDuring(t *testing.T, l *Lab, window, startAfter time.Duration, during func(), extra ...string) (labReport, int, string) {
	t.Helper()
	args := append([]string{"netns", "exec", l.Node, exporterBin, "diagnose", "--window=" + window.String(), "--output=json"}, withInvalidReasonsStateDir(t, extra)...)
	cmd := exec.Command("ip", args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(startAfter)
	during()
	err := cmd.Wait()
	code := 0
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		code = exit.ExitCode()
	case err != nil:
		t.Fatalf("diagnose: %v\n%s", err, stderr.String())
	}
	return parseReport(t, stdout.String()), code, stderr.String()
}

// finding returns r's finding of cause, or fails.
func (r labReport) finding(t *testing.T, cause string) int {
	t.Helper()
	for i, f := range r.Findings {
		if f.Cause == cause {
			return i
		}
	}
	t.Fatalf("no %s finding:\n%s", cause, r.raw)
	return -1
}

// TestVerdictKernel is incidents 1 and 2 told as a verdict on the real kernel, by the running
// exporter's /status and by diagnose: bridge netfilter off with same-bridge connections failing
// is bridge_netfilter_off (critical, naming lab/web:80/tcp), and INVALID packets that nothing
// drops with be_liberal off are invalid_not_dropped. The lab runs no API server and no
// kube-proxy: stale rules and kube-proxy are not checked, and say so.
func TestVerdictKernel(t *testing.T) {
	requireExporter(t)
	l := newLab(t)
	l.ServeTCP(l.B, "0.0.0.0:"+podPort)
	const window = 30 * time.Second
	e := l.StartExporter("proxyhealth", verdictKernelExporterPort, nil, "--no-collector.kubeproxy", "--status.window="+window.String())
	noKubeProxy := []string{"--no-collector.kubeproxy"}

	// No finding, but not everything checkable (no API, kube-proxy not looked at): unknown,
	// exit code 3 with the reasons, never healthy.
	r, code, stderr := diagnoseDuring(t, l, 2*time.Second, 0, func() {}, noKubeProxy...)
	if code != 3 || r.Verdict != "unknown" || len(r.Findings) != 0 || !strings.Contains(stderr, "stale_rules: no Kubernetes API configured") ||
		!strings.Contains(stderr, "kube_proxy_sync_failing, kube_proxy_down, kube_proxy_stuck, kube_proxy_watch_failing: the kubeproxy collector is off") {
		t.Errorf("diagnose on the quiet lab: exit %d, stderr:\n%s\nreport:\n%s", code, stderr, r.raw)
	}
	waitFor(t, 10*time.Second, "/status unknown", func() (bool, string) {
		r := e.status(t)
		return r.Verdict == "unknown" && len(r.Findings) == 0, r.raw
	})
	checkLandingPage(t, e, "unknown", "unknown")

	// Incident 1.
	l.Sysctl("net.bridge.bridge-nf-call-iptables=0")
	t.Cleanup(func() { l.Sysctl("net.bridge.bridge-nf-call-iptables=1") })
	web := verdict.Service{Namespace: "lab", Name: "web", Port: 80, Protocol: "tcp"}
	r, code, stderr = diagnoseDuring(t, l, 8*time.Second, 2*time.Second, func() {
		if ok := l.Connect(l.A, webVIP+":80", 3, 2*time.Second); ok != 0 {
			t.Errorf("bridge-nf-call-iptables=0: %d of 3 connections succeeded", ok)
		}
	}, noKubeProxy...)
	if code != 2 || r.Verdict != "critical" {
		t.Errorf("diagnose, incident 1: exit %d verdict %s, want 2 and critical\nstderr:\n%s", code, r.Verdict, stderr)
	}
	checkBridge := func(what string, r labReport) {
		t.Helper()
		f := r.Findings[r.finding(t, "bridge_netfilter_off")]
		if f.Severity != "critical" || f.Service != nil || !strings.Contains(f.Summary, "net.bridge.bridge-nf-call-iptables is 0") ||
			!strings.Contains(f.Summary, "connections to lab/web:80/tcp fail") || !strings.HasSuffix(f.Runbook, "#proxyhealthbridgenetfilteroff") {
			t.Errorf("%s: %+v", what, f)
		}
		var ev struct {
			Findings []struct {
				Cause    string `json:"cause"`
				Evidence struct {
					BridgeNF int `json:"bridge_nf_call_iptables"`
					Ended    int `json:"ended"`
					Open     int `json:"open"`
					Services []struct {
						Service verdict.Service `json:"service"`
						Ended   int             `json:"ended"`
						Open    int             `json:"open"`
					} `json:"services"`
				} `json:"evidence"`
			} `json:"findings"`
		}
		if err := json.Unmarshal([]byte(r.raw), &ev); err != nil {
			t.Fatal(err)
		}
		b := ev.Findings[r.finding(t, "bridge_netfilter_off")].Evidence
		if b.BridgeNF != 0 || b.Ended+b.Open != 3 || len(b.Services) != 1 || b.Services[0].Service != web || b.Services[0].Ended+b.Services[0].Open != 3 {
			t.Errorf("%s: evidence %+v, want the 3 connections to lab/web", what, b)
		}
		if slices.Contains(r.causes(), "unreplied_flows") {
			t.Errorf("%s: the same-bridge flows are also told as unreplied_flows:\n%s", what, r.raw)
		}
	}
	checkBridge("diagnose", r)
	waitFor(t, 15*time.Second, "/status: bridge_netfilter_off with the 3 connections", func() (bool, string) {
		l.ReapExpired()
		r := e.status(t)
		return slices.Contains(r.causes(), "bridge_netfilter_off") && strings.Contains(r.raw, `"ended": 3`), r.raw
	})
	checkBridge("/status", e.status(t))
	checkLandingPage(t, e, "incident1_bridge_netfilter_off", "critical", findingWant{
		Severity: "critical", Cause: "bridge_netfilter_off",
		Summary: []string{"net.bridge.bridge-nf-call-iptables is 0, so replies from endpoints on the client's own bridge escape un-NATed",
			"connections to lab/web:80/tcp fail (3 ended unreplied"},
		Evidence: map[string]string{"bridge_nf_call_iptables": "0", "ended": "3", "open": "0",
			"services": "service={namespace=lab name=web port=80 protocol=tcp} ended=3 open=0", "explains": "unreplied_flows"},
		Runbook: "#proxyhealthbridgenetfilteroff",
	})
	l.Sysctl("net.bridge.bridge-nf-call-iptables=1")

	// Incident 2: be_liberal off (the lab's setting) and no INVALID drop in KUBE-FORWARD.
	r, code, stderr = diagnoseDuring(t, l, 5*time.Second, 2*time.Second, func() { l.SendInvalid(l.A, podC+":"+blackPort, 50) }, noKubeProxy...)
	i := r.finding(t, "invalid_not_dropped")
	if f := r.Findings[i]; f.Severity != "warning" || !strings.Contains(f.Summary, "50 packets INVALID") || !strings.HasSuffix(f.Runbook, "#proxyhealthinvalidpacketsnotdropped") {
		t.Errorf("diagnose, incident 2: %+v", f)
	}
	if code != 3 || r.Verdict != "unknown" {
		t.Errorf("diagnose, incident 2: exit %d verdict %s, want 3 and unknown (a warning, and stale rules and kube-proxy not checked)\nstderr:\n%s",
			code, r.Verdict, stderr)
	}
	waitFor(t, 10*time.Second, "/status: invalid_not_dropped", func() (bool, string) {
		r := e.status(t)
		return slices.Contains(r.causes(), "invalid_not_dropped"), r.raw
	})
	// Bridge netfilter is back on: incident 1's three failed connections, still inside the
	// window, are now unreplied flows with no cause on the node. Only warnings, but stale rules
	// and kube-proxy not checked: unknown, as diagnose says.
	checkLandingPage(t, e, "incident2_invalid_not_dropped", "unknown", findingWant{
		Severity: "warning", Cause: "invalid_not_dropped",
		Summary:  []string{"Conntrack marked 50 packets INVALID", "with nf_conntrack_tcp_be_liberal off and no ctstate INVALID drop rule on the forward path"},
		Evidence: map[string]string{"invalid_packets": "50", "tcp_be_liberal": "0", "invalid_drop_rule": "false"},
		Runbook:  "#proxyhealthinvalidpacketsnotdropped",
	}, findingWant{
		Severity: "warning", Cause: "unreplied_flows", Service: "lab/web:80/tcp",
		Summary:  []string{"Connections to lab/web:80/tcp get no reply (3 ended unreplied"},
		Evidence: map[string]string{"ended": "3", "open": "0", "by_reason": "reason=same_bridge ended=3 open=0"},
		Runbook:  "#unreplied-service-flows",
	})
	// The drop rule makes the same packets harmless.
	l.MustExec(l.Node, "iptables-nft", "-A", "KUBE-FORWARD", "-m", "conntrack", "--ctstate", "INVALID", "-j", "DROP")
	r, _, _ = diagnoseDuring(t, l, 5*time.Second, 2*time.Second, func() { l.SendInvalid(l.A, podC+":"+blackPort, 50) }, noKubeProxy...)
	if slices.Contains(r.causes(), "invalid_not_dropped") {
		t.Errorf("diagnose with an INVALID drop rule: still invalid_not_dropped:\n%s", r.raw)
	}
}
