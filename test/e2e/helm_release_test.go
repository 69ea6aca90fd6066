//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
)

// The release the lab installs: not in the default namespace, its dashboards in another one,
// and named apart from the kustomize overlay's objects that share the lab.
const (
	helmRelease           = "ph-release"
	helmNamespace         = "ph-release"
	helmGrafanaNamespace  = "ph-release-grafana"
	helmFullname          = helmRelease + "-proxyhealth"
	helmInstanceSelector  = "app.kubernetes.io/instance=" + helmRelease
	helmReleaseRecordsSel = "owner=helm,name=" + helmRelease
	helmChart             = "../../charts/proxyhealth"
	helmValuesDir         = "testdata/release" // in test/deploy
)

// testHelmRelease installs charts/proxyhealth into a namespace of its own with Helm's Go
// packages (test/deploy, run in the node namespace where the apiserver listens), upgrades it
// with other values and uninstalls it, asserting at each step what the apiserver holds: the
// values applied to the DaemonSet, RBAC, monitors, rules and dashboards, the objects an
// upgrade turns off deleted, and after uninstall nothing labelled by the release, cluster-scoped
// RBAC and Helm's release records included. The Prometheus Operator's CRDs are loaded.
func testHelmRelease(t *testing.T, cp *ControlPlane, c *deployClients, tool *deployToolCmd) {
	start := time.Now()
	grafana := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": helmGrafanaNamespace}}}
	if err := c.create(t, grafana, false); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("creating namespace %s: %v", helmGrafanaNamespace, err)
	}
	dashboards := committedDashboards(t)

	step := time.Now()
	out := tool.RunIn(cp.Lab.Node, "install", cp.AdminKubeconfig, helmChart, helmRelease, helmNamespace, filepath.Join(helmValuesDir, "install-values.yaml"))
	t.Logf("helm install (%s): %s", time.Since(step).Round(time.Millisecond), strings.TrimSpace(string(out)))

	ds := c.mustGet(t, "apps/v1", "DaemonSet", helmNamespace, helmFullname)
	container := firstContainer(t, ds)
	if got, want := container["image"], "ghcr.io/proxyhealth/proxyhealth:v0.1.0"; got != want {
		t.Errorf("DaemonSet image %v, want %s", got, want)
	}
	if sa, _, _ := unstructured.NestedString(ds.Object, "spec", "template", "spec", "serviceAccountName"); sa != helmFullname {
		t.Errorf("DaemonSet serviceAccountName %q, want %q", sa, helmFullname)
	}
	if nodeOS, _, _ := unstructured.NestedString(ds.Object, "spec", "template", "spec", "nodeSelector", "kubernetes.io/os"); nodeOS != "linux" {
		t.Errorf("DaemonSet nodeSelector kubernetes.io/os %q, want linux", nodeOS)
	}
	c.mustGet(t, "v1", "ServiceAccount", helmNamespace, helmFullname)
	role := c.mustGet(t, "rbac.authorization.k8s.io/v1", "ClusterRole", "", helmFullname)
	if rules, _, _ := unstructured.NestedSlice(role.Object, "rules"); len(rules) == 0 {
		t.Errorf("ClusterRole %s has no rules", helmFullname)
	}
	binding := c.mustGet(t, "rbac.authorization.k8s.io/v1", "ClusterRoleBinding", "", helmFullname)
	subjects, _, _ := unstructured.NestedSlice(binding.Object, "subjects")
	wantSubject := map[string]any{"kind": "ServiceAccount", "name": helmFullname, "namespace": helmNamespace}
	if len(subjects) != 1 || fmt.Sprint(subjects[0]) != fmt.Sprint(wantSubject) {
		t.Errorf("ClusterRoleBinding subjects %v, want [%v]", subjects, wantSubject)
	}
	pm := c.mustGet(t, "monitoring.coreos.com/v1", "PodMonitor", helmNamespace, helmFullname)
	if pm.GetLabels()["release"] != "kube-prometheus-stack" {
		t.Errorf("PodMonitor labels %v lack release: kube-prometheus-stack", pm.GetLabels())
	}
	if eps, _, _ := unstructured.NestedSlice(pm.Object, "spec", "podMetricsEndpoints"); len(eps) != 1 || eps[0].(map[string]any)["interval"] != "30s" {
		t.Errorf("PodMonitor endpoints %v, want one with interval 30s", eps)
	}
	c.mustBeGone(t, "monitoring.coreos.com/v1", "ServiceMonitor", helmNamespace, helmFullname)
	rule := c.mustGet(t, "monitoring.coreos.com/v1", "PrometheusRule", helmNamespace, helmFullname)
	if rule.GetLabels()["release"] != "kube-prometheus-stack" {
		t.Errorf("PrometheusRule labels %v lack release: kube-prometheus-stack", rule.GetLabels())
	}
	installedAlerts := alertNames(rule)
	if !slices.Contains(installedAlerts, "ProxyHealthConntrackTableNearlyFull") || !slices.Contains(installedAlerts, "ProxyHealthKubeProxyRulesStale") {
		t.Errorf("PrometheusRule alerts %v lack ProxyHealthConntrackTableNearlyFull or ProxyHealthKubeProxyRulesStale", installedAlerts)
	}
	checkDashboardConfigMaps(t, c, dashboards, "")
	t.Logf("installed: %s", strings.Join(c.labelled(t, helmInstanceSelector), ", "))

	step = time.Now()
	out = tool.RunIn(cp.Lab.Node, "upgrade", cp.AdminKubeconfig, helmChart, helmRelease, helmNamespace, filepath.Join(helmValuesDir, "upgrade-values.yaml"))
	t.Logf("helm upgrade (%s): %s", time.Since(step).Round(time.Millisecond), strings.TrimSpace(string(out)))

	ds = c.mustGet(t, "apps/v1", "DaemonSet", helmNamespace, helmFullname)
	container = firstContainer(t, ds)
	if got, want := container["image"], "ghcr.io/proxyhealth/proxyhealth:v0.1.1"; got != want {
		t.Errorf("after upgrade: DaemonSet image %v, want %s", got, want)
	}
	if args := toStrings(container["args"]); !slices.Contains(args, "--rules.grace-period=2m") {
		t.Errorf("after upgrade: DaemonSet args %v lack --rules.grace-period=2m", args)
	}
	c.mustBeGone(t, "monitoring.coreos.com/v1", "PodMonitor", helmNamespace, helmFullname)
	c.mustGet(t, "v1", "Service", helmNamespace, helmFullname)
	sm := c.mustGet(t, "monitoring.coreos.com/v1", "ServiceMonitor", helmNamespace, helmFullname)
	if eps, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints"); len(eps) != 1 || eps[0].(map[string]any)["interval"] != "15s" {
		t.Errorf("after upgrade: ServiceMonitor endpoints %v, want one with interval 15s", eps)
	}
	rule = c.mustGet(t, "monitoring.coreos.com/v1", "PrometheusRule", helmNamespace, helmFullname)
	upgradedAlerts := alertNames(rule)
	if slices.Contains(upgradedAlerts, "ProxyHealthConntrackTableNearlyFull") || len(upgradedAlerts) != len(installedAlerts)-1 {
		t.Errorf("after upgrade: PrometheusRule alerts %v, want those installed less ProxyHealthConntrackTableNearlyFull", upgradedAlerts)
	}
	checkDashboardConfigMaps(t, c, dashboards, "Kubernetes")
	if records := c.labelled(t, helmReleaseRecordsSel); len(records) != 2 {
		t.Errorf("after upgrade: Helm's release records %v, want revisions 1 and 2", records)
	}

	step = time.Now()
	out = tool.RunIn(cp.Lab.Node, "uninstall", cp.AdminKubeconfig, helmRelease, helmNamespace)
	t.Logf("helm uninstall (%s): %s", time.Since(step).Round(time.Millisecond), strings.TrimSpace(string(out)))
	// Deletion is immediate for objects without finalizers; none of the chart's has one.
	if left := c.labelled(t, helmInstanceSelector); len(left) > 0 {
		t.Errorf("after uninstall, labelled %s: %s", helmInstanceSelector, strings.Join(left, ", "))
	}
	if left := c.labelled(t, helmReleaseRecordsSel); len(left) > 0 {
		t.Errorf("after uninstall, Helm's release records: %s", strings.Join(left, ", "))
	}
	t.Logf("install, upgrade and uninstall checked in %s", time.Since(start).Round(time.Millisecond))
}

// committedDashboards reads dashboards/*.json by file name.
func committedDashboards(t *testing.T) map[string]string {
	t.Helper()
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(root, "dashboards", "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no dashboards in %s: %v", filepath.Join(root, "dashboards"), err)
	}
	out := map[string]string{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		out[filepath.Base(f)] = string(b)
	}
	return out
}

// checkDashboardConfigMaps: one ConfigMap per dashboard in the Grafana namespace, labelled
// for the sidecar, holding the committed JSON; folder is the grafana_folder annotation wanted
// ("" for none).
func checkDashboardConfigMaps(t *testing.T, c *deployClients, dashboards map[string]string, folder string) {
	t.Helper()
	cms := c.list(t, schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, helmGrafanaNamespace, helmInstanceSelector+",grafana_dashboard=1")
	found := map[string]bool{}
	for _, cm := range cms {
		if got := cm.GetAnnotations()["grafana_folder"]; got != folder {
			t.Errorf("ConfigMap %s: grafana_folder %q, want %q", cm.GetName(), got, folder)
		}
		data, _, _ := unstructured.NestedStringMap(cm.Object, "data")
		for file, content := range data {
			want, ok := dashboards[file]
			if !ok {
				t.Errorf("ConfigMap %s holds %s, not a committed dashboard", cm.GetName(), file)
				continue
			}
			if strings.TrimSpace(content) != strings.TrimSpace(want) {
				t.Errorf("ConfigMap %s: %s differs from dashboards/%s", cm.GetName(), file, file)
			}
			found[file] = true
		}
	}
	for file := range dashboards {
		if !found[file] {
			t.Errorf("no dashboard ConfigMap in %s holds %s", helmGrafanaNamespace, file)
		}
	}
}

func firstContainer(t *testing.T, ds *unstructured.Unstructured) map[string]any {
	t.Helper()
	containers, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "containers")
	if len(containers) == 0 {
		t.Fatalf("%s has no containers", describe(ds))
	}
	return containers[0].(map[string]any)
}

// alertNames lists the alerts of a PrometheusRule.
func alertNames(rule *unstructured.Unstructured) []string {
	var names []string
	groups, _, _ := unstructured.NestedSlice(rule.Object, "spec", "groups")
	for _, g := range groups {
		rules, _, _ := unstructured.NestedSlice(g.(map[string]any), "rules")
		for _, r := range rules {
			if a, ok := r.(map[string]any)["alert"].(string); ok {
				names = append(names, a)
			}
		}
	}
	sort.Strings(names)
	return names
}

func objectRef(apiVersion, kind, namespace, name string) *unstructured.Unstructured {
	o := &unstructured.Unstructured{}
	o.SetAPIVersion(apiVersion)
	o.SetKind(kind)
	o.SetNamespace(namespace)
	o.SetName(name)
	return o
}

// mustGet reads an object and fails the test when it is not there.
func (c *deployClients) mustGet(t *testing.T, apiVersion, kind, namespace, name string) *unstructured.Unstructured {
	t.Helper()
	ref := objectRef(apiVersion, kind, namespace, name)
	got, err := c.resource(t, ref).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("%s: %v", describe(ref), err)
	}
	return got
}

// mustBeGone fails the test when the object exists.
func (c *deployClients) mustBeGone(t *testing.T, apiVersion, kind, namespace, name string) {
	t.Helper()
	ref := objectRef(apiVersion, kind, namespace, name)
	_, err := c.resource(t, ref).Get(context.Background(), name, metav1.GetOptions{})
	if !apierrors.IsNotFound(err) {
		t.Errorf("%s: want not found, got %v", describe(ref), err)
	}
}

func (c *deployClients) list(t *testing.T, gvr schema.GroupVersionResource, namespace, selector string) []unstructured.Unstructured {
	t.Helper()
	l, err := c.dyn.Resource(gvr).Namespace(namespace).List(context.Background(), metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		t.Fatalf("listing %s in %q with %s: %v", gvr, namespace, selector, err)
	}
	return l.Items
}

// labelled lists every object matching selector, in every namespace and cluster-scoped, of
// every resource the apiserver can list (its discovery, CRDs included).
func (c *deployClients) labelled(t *testing.T, selector string) []string {
	t.Helper()
	lists, err := c.disc.ServerPreferredResources()
	if err != nil && !discovery.IsGroupDiscoveryFailedError(err) {
		t.Fatalf("discovery: %v", err)
	}
	var found []string
	for _, l := range lists {
		gv, err := schema.ParseGroupVersion(l.GroupVersion)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range l.APIResources {
			if !slices.Contains(r.Verbs, "list") || strings.Contains(r.Name, "/") {
				continue
			}
			for _, o := range c.list(t, gv.WithResource(r.Name), "", selector) {
				found = append(found, describe(&o))
			}
		}
	}
	sort.Strings(found)
	return found
}
