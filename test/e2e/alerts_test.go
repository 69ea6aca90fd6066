//go:build e2e

package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/proxyhealth/proxyhealth/alerts/testvariant"
)

const (
	alertsDriftExporterPort  = 19874
	alertsBridgeExporterPort = 19875

	// alertsSpeedup divides the shipped rules' for: durations and PromQL ranges: minutes
	// become seconds.
	alertsSpeedup = 60
)

// labAlertRules writes the lab's variant of alerts/proxyhealth.rules.yml (generated from the
// shipped file, never a copy: testvariant) to dir and returns its path.
func labAlertRules(t *testing.T, dir string) string {
	t.Helper()
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	shipped, err := os.ReadFile(filepath.Join(root, "alerts", "proxyhealth.rules.yml"))
	if err != nil {
		t.Fatal(err)
	}
	variant, err := testvariant.Rewrite(shipped, alertsSpeedup)
	if err != nil {
		t.Fatalf("deriving the lab's rules: %v", err)
	}
	path := filepath.Join(dir, "proxyhealth.lab.rules.yml")
	if err := os.WriteFile(path, variant, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("promtool", "check", "rules", path).CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules on the lab's variant: %v\n%s", err, out)
	}
	return path
}

// checkScrapeLint runs promtool check metrics on a scrape of e (the lint of the exposition
// format and metric names) and reports any finding as an error.
func checkScrapeLint(t *testing.T, e *Exporter, when string) {
	t.Helper()
	body, err := e.l.Get(e.l.Node, e.URL)
	if err != nil {
		t.Fatalf("scraping %s: %v", e.Name, err)
	}
	cmd := exec.Command("promtool", "check", "metrics")
	cmd.Stdin = strings.NewReader(body)
	if out, err := cmd.CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != "" {
		t.Errorf("promtool check metrics on the scrape %s: %v\n%s", when, err, out)
	}
}

// noNotifications fails the test if the webhook has received anything: in a healthy lab no
// alert of the shipped rules may fire.
func noNotifications(t *testing.T, w *Webhook, when string) {
	t.Helper()
	if msgs := w.Messages(); len(msgs) > 0 {
		t.Errorf("%s: %d notifications, want none:\n%s", when, len(msgs), w.String())
	}
}

// TestAlertsStaleRules runs incident 3 through the whole alerting path: the real exporter (with
// the deploy/ ClusterRole's ServiceAccount), a real Prometheus scraping it every second with the
// shipped rules sped up, and a real Alertmanager sending to the test's webhook. The stale-rule
// alert must reach the webhook naming the node, the service and the counts, and resolve once
// kube-proxy's connection is healed.
func TestAlertsStaleRules(t *testing.T) {
	requireKube(t)
	requireExporter(t)
	requirePrometheus(t)
	start := time.Now()
	l := newLabRules(t, labRawRules)
	cp := StartControlPlane(t, l, ControlPlaneOptions{})
	kubeconfig, how := cp.deployKubeconfig("proxyhealth-deploy.kubeconfig")
	t.Logf("exporter's credentials: %s", how)
	e := l.StartExporter("proxyhealth", alertsDriftExporterPort, nil, append(driftExporterArgs(kubeconfig), kubeProxyExporterArgs(cp)...)...)
	waitDriftSynced(t, e, cp)

	const ns, name = "lab", "backend"
	cp.CreateService(httpService(ns, name, "10.96.0.50", nil))
	oldEps, oldAddrs := remoteEndpoints(3, 1, 10)
	cp.ApplySlice(EndpointSlice(ns, name, name+"-1", httpSlicePorts, oldEps))
	cp.WaitServicePortEndpoints(30*time.Second, ns+"/"+name+":http", "tcp", oldAddrs)
	waitConverged(t, e, cp, "lab/backend with 10 endpoints checked without drift")

	p := StartPrometheus(t, l, PrometheusOptions{
		Targets:      []string{fmt.Sprintf("127.0.0.1:%d", alertsDriftExporterPort)},
		RuleFiles:    []string{labAlertRules(t, l.Dir)},
		Alertmanager: true,
	})
	hook := p.Alertmanager.Webhook
	// Healthy: the longest for: of the variant (15 s) passes without a notification.
	time.Sleep(16 * time.Second)
	noNotifications(t, hook, "healthy control plane, before the incident")
	if alerts, err := p.Alerts(); err != nil || len(alerts) > 0 {
		t.Errorf("Prometheus has alerts pending or firing in a healthy lab (%v): %+v", err, alerts)
	}

	t.Logf("kube-proxy's fault proxy: %s", cp.Blackhole())
	t.Cleanup(func() { cp.Heal() })
	newEps, newAddrs := remoteEndpoints(3, 3, 13) // 1 and 2 deleted, 11..13 added
	cp.ApplySlice(EndpointSlice(ns, name, name+"-1", httpSlicePorts, newEps))
	changed := time.Now()

	stale := map[string]string{
		"alertname": "ProxyHealthKubeProxyRulesStale", "severity": "critical", "node": labNodeName,
		"service_namespace": ns, "service_name": name, "service_port": "80", "protocol": "tcp",
	}
	// Grace 3 s, then the rule's for: (5 min / 60), then Alertmanager's group_wait.
	a, at := hook.WaitAlert(t, 60*time.Second, "firing", stale)
	t.Logf("ProxyHealthKubeProxyRulesStale reached the webhook %s after the change:\n  labels %v\n  description %q",
		at.Sub(changed).Round(time.Millisecond), a.Labels, a.Annotations["description"])
	if d := at.Sub(changed); d < driftGrace+5*time.Second {
		t.Errorf("fired %s after the change, before the exporter's grace period (%s) plus the rule's for: (5s)", d, driftGrace)
	}
	desc := a.Annotations["description"]
	for _, want := range []string{"node " + labNodeName, "lab/backend port 80/tcp", "2 stale", "3 missing"} {
		if !strings.Contains(desc, want) {
			t.Errorf("description lacks %q: %q", want, desc)
		}
	}
	for _, k := range []string{"summary", "runbook_url"} {
		if a.Annotations[k] == "" {
			t.Errorf("annotation %s missing: %v", k, a.Annotations)
		}
	}
	if !strings.HasSuffix(a.Annotations["runbook_url"], "docs/runbooks.md#proxyhealthkubeproxyrulesstale") {
		t.Errorf("runbook_url %q does not point at the runbook's section", a.Annotations["runbook_url"])
	}
	// The cluster-wide recording rule sees one node drifting for the service.
	v := p.WaitQuery(10*time.Second, `service_port:proxyhealth_service_drift_nodes:count{service_namespace="lab",service_name="backend"}`,
		func(v model.Vector) bool { return len(v) == 1 })
	if v[0].Value != 1 {
		t.Errorf("nodes drifting for lab/backend: %v, want 1", v)
	}
	checkScrapeLint(t, e, "while drifting")
	// Only the incident's alerts: the stale rules (and nothing about the exporter, its view
	// or the kernel). kube-proxy's one watch error per informer is below the list/watch
	// alert's threshold, as a routine reconnect would be.
	for _, m := range hook.Messages() {
		for _, a := range m.Alerts {
			if a.Labels["alertname"] != "ProxyHealthKubeProxyRulesStale" {
				t.Errorf("unexpected alert during the incident: %v %v", a.Labels, a.Annotations)
			}
		}
	}

	t.Logf("kube-proxy's fault proxy: %s", cp.Heal())
	healed := time.Now()
	cp.WaitServicePortEndpoints(30*time.Second, ns+"/"+name+":http", "tcp", newAddrs)
	_, at = hook.WaitAlert(t, 60*time.Second, "resolved", stale)
	t.Logf("resolved notification %s after healing", at.Sub(healed).Round(time.Millisecond))
	t.Logf("TestAlertsStaleRules took %s", time.Since(start).Round(time.Millisecond))
}

// TestAlertsBridgeNetfilter runs incident 1 through the alerting path: in the kernel lab with
// bridge-nf-call-iptables=0, connections from pod A to the lab/web VIP (endpoints on A's
// bridge) fail, and ProxyHealthBridgeNetfilterOff reaches the webhook naming the node and the
// service; with the setting back at 1 it resolves.
func TestAlertsBridgeNetfilter(t *testing.T) {
	requireExporter(t)
	requirePrometheus(t)
	start := time.Now()
	l := newLab(t)
	l.ServeTCP(l.B, "0.0.0.0:"+podPort)
	e := l.StartExporter("proxyhealth", alertsBridgeExporterPort, nil)
	p := StartPrometheus(t, l, PrometheusOptions{
		Targets:      []string{fmt.Sprintf("127.0.0.1:%d", alertsBridgeExporterPort)},
		RuleFiles:    []string{labAlertRules(t, l.Dir)},
		Alertmanager: true,
	})
	hook := p.Alertmanager.Webhook

	// Working: bridge-nf-call-iptables=1, connections succeed, nothing fires.
	for end := time.Now().Add(8 * time.Second); time.Now().Before(end); {
		if ok := l.Connect(l.A, webVIP+":80", 1, time.Second); ok != 1 {
			t.Fatalf("bridge-nf-call-iptables=1: a connection to the web VIP failed")
		}
		l.ReapExpired()
		time.Sleep(300 * time.Millisecond)
	}
	if got := hook.Alerts(map[string]string{"alertname": "ProxyHealthBridgeNetfilterOff"}); len(got) > 0 {
		t.Errorf("ProxyHealthBridgeNetfilterOff notified with bridge-nf-call-iptables=1:\n%s", hook.String())
	}

	l.Sysctl("net.bridge.bridge-nf-call-iptables=0")
	t.Cleanup(func() { l.Sysctl("net.bridge.bridge-nf-call-iptables=1") })
	broken := time.Now()
	labels := map[string]string{
		"alertname": "ProxyHealthBridgeNetfilterOff", "severity": "warning", "node": labNodeName,
		"service_namespace": "lab", "service_name": "web", "service_port": "80", "protocol": "tcp",
	}
	// Connections keep coming, as they would from a client retrying; each flow ends unreplied
	// when its SYN_SENT times out (5 s in the lab) and the reaper lets the exporter see it.
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if out, err := l.Exec(l.A, labtoolBin, "connect", webVIP+":80", "--count", "1", "--timeout", "500ms"); err != nil {
				done <- fmt.Errorf("labtool connect: %v: %s", err, out)
				return
			} else if !strings.Contains(out, "succeeded 0 of 1") {
				done <- errors.New("a connection succeeded with bridge-nf-call-iptables=0: " + out)
				return
			}
			_, _ = l.Exec(l.Node, "conntrack", "-L")
			time.Sleep(200 * time.Millisecond)
		}
	}()
	a, at := hook.WaitAlert(t, 90*time.Second, "firing", labels)
	close(stop)
	if err := <-done; err != nil {
		t.Error(err)
	}
	t.Logf("ProxyHealthBridgeNetfilterOff reached the webhook %s after the sysctl:\n  labels %v\n  description %q",
		at.Sub(broken).Round(time.Millisecond), a.Labels, a.Annotations["description"])
	for _, want := range []string{"node " + labNodeName, "lab/web:80", "bridge-nf-call-iptables is 0"} {
		if !strings.Contains(a.Annotations["description"], want) {
			t.Errorf("description lacks %q: %q", want, a.Annotations["description"])
		}
	}
	checkScrapeLint(t, e, "with same_bridge unreplied flows")

	l.Sysctl("net.bridge.bridge-nf-call-iptables=1")
	fixed := time.Now()
	_, at = hook.WaitAlert(t, 60*time.Second, "resolved", labels)
	t.Logf("resolved notification %s after the fix", at.Sub(fixed).Round(time.Millisecond))
	// The kernel lab has kube-proxy's rules written by hand, no kube-proxy and no API: those
	// two alerts are true there, and nothing else may fire.
	expected := map[string]bool{"ProxyHealthBridgeNetfilterOff": true, "ProxyHealthKubeProxyDown": true, "ProxyHealthAPIViewStale": true}
	for _, m := range hook.Messages() {
		for _, a := range m.Alerts {
			if !expected[a.Labels["alertname"]] {
				t.Errorf("unexpected alert in the kernel lab: %v %v", a.Labels, a.Annotations)
			}
		}
	}
	t.Logf("TestAlertsBridgeNetfilter took %s", time.Since(start).Round(time.Millisecond))
}

// deployKubeconfig writes a kubeconfig for the exporter as the ServiceAccount of deploy/base,
// bound to deploy/base's ClusterRole (applied through the admin client, the binding's subject
// moved to kube-system as an overlay's namespace would), so that a scenario proves that RBAC
// sufficient. Without those manifests it falls back to readOnlyKubeconfig. It returns the path
// and which credentials were used.
func (cp *ControlPlane) deployKubeconfig(name string) (string, string) {
	t := cp.t
	t.Helper()
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	base := filepath.Join(root, "deploy", "base")
	var sa corev1.ServiceAccount
	var role rbacv1.ClusterRole
	var binding rbacv1.ClusterRoleBinding
	for file, into := range map[string]any{"serviceaccount.yaml": &sa, "clusterrole.yaml": &role, "clusterrolebinding.yaml": &binding} {
		b, err := os.ReadFile(filepath.Join(base, file))
		if errors.Is(err, os.ErrNotExist) {
			return cp.readOnlyKubeconfig(name, apiserverAddr), "deploy/base/" + file + " not found: the lab's own read-only ServiceAccount"
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.UnmarshalStrict(b, into); err != nil {
			t.Fatalf("deploy/base/%s: %v", file, err)
		}
	}
	const ns = "kube-system"
	ctx := context.Background()
	sa.Namespace = ns
	for i := range binding.Subjects {
		if binding.Subjects[i].Kind == rbacv1.ServiceAccountKind && binding.Subjects[i].Name == sa.Name {
			binding.Subjects[i].Namespace = ns
		}
	}
	if binding.RoleRef.Name != role.Name {
		t.Fatalf("deploy/base: the ClusterRoleBinding binds %q, the ClusterRole is %q", binding.RoleRef.Name, role.Name)
	}
	// Names of their own, so that they cannot be confused with readOnlyKubeconfig's.
	role.Name, binding.Name, binding.RoleRef.Name = "deploy-"+role.Name, "deploy-"+binding.Name, "deploy-"+role.Name
	if _, err := cp.Client.CoreV1().ServiceAccounts(ns).Create(ctx, &sa, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating deploy/base's ServiceAccount: %v", err)
	}
	if _, err := cp.Client.RbacV1().ClusterRoles().Create(ctx, &role, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating deploy/base's ClusterRole: %v", err)
	}
	if _, err := cp.Client.RbacV1().ClusterRoleBindings().Create(ctx, &binding, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating deploy/base's ClusterRoleBinding: %v", err)
	}
	path := cp.tokenKubeconfig(t, ns, sa.Name, name, apiserverAddr)
	return path, fmt.Sprintf("ServiceAccount %s/%s bound to deploy/base's ClusterRole (%d rules)", ns, sa.Name, len(role.Rules))
}
