package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

const root = "../.."

// object is one rendered manifest: its kind, namespace and name, and its YAML.
type object struct {
	Kind, Namespace, Name string
	Labels                map[string]string
	raw                   []byte
}

// objects splits a manifest stream into objects.
func objects(t *testing.T, stream []byte) []object {
	t.Helper()
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(stream), 4096)
	var out []object
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return out
			}
			t.Fatal(err)
		}
		if len(m) == 0 {
			continue
		}
		raw, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		var meta struct {
			Kind     string
			Metadata struct {
				Name, Namespace string
				Labels          map[string]string
			}
		}
		if err := json.Unmarshal(raw, &meta); err != nil {
			t.Fatal(err)
		}
		out = append(out, object{Kind: meta.Kind, Namespace: meta.Metadata.Namespace, Name: meta.Metadata.Name, Labels: meta.Metadata.Labels, raw: raw})
	}
}

// decodeStrict decodes o into v refusing unknown fields: a field the API type does not have is
// a typo in a template.
func (o object) decodeStrict(t *testing.T, v any) {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(o.raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("%s %s/%s: %v", o.Kind, o.Namespace, o.Name, err)
	}
}

// typed decodes every object into its API type, strictly, and fails on an unknown kind.
func typed(t *testing.T, objs []object) {
	t.Helper()
	for _, o := range objs {
		var v any
		switch o.Kind {
		case "ServiceAccount":
			v = &corev1.ServiceAccount{}
		case "Service":
			v = &corev1.Service{}
		case "ConfigMap":
			v = &corev1.ConfigMap{}
		case "Namespace":
			v = &corev1.Namespace{}
		case "ClusterRole":
			v = &rbacv1.ClusterRole{}
		case "ClusterRoleBinding":
			v = &rbacv1.ClusterRoleBinding{}
		case "Role":
			v = &rbacv1.Role{}
		case "RoleBinding":
			v = &rbacv1.RoleBinding{}
		case "DaemonSet":
			v = &appsv1.DaemonSet{}
		case "PodMonitor":
			v = &monitoringv1.PodMonitor{}
		case "ServiceMonitor":
			v = &monitoringv1.ServiceMonitor{}
		case "PrometheusRule":
			v = &monitoringv1.PrometheusRule{}
		case "ValidatingAdmissionPolicy":
			v = &admissionregistrationv1.ValidatingAdmissionPolicy{}
		case "ValidatingAdmissionPolicyBinding":
			v = &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
		default:
			t.Fatalf("unexpected kind %s", o.Kind)
		}
		o.decodeStrict(t, v)
	}
}

// byKind indexes objects by kind, and those of an optional component (label
// app.kubernetes.io/component other than the exporter's "metrics": node-conditions,
// kubectl-plugin) by kind/component; a key rendered twice fails (except ConfigMaps). The RBAC
// that lets Prometheus get /metrics (a ClusterRole and binding named *-metrics-reader) is
// indexed apart, as "ClusterRole/metrics-reader" and "ClusterRoleBinding/metrics-reader".
func byKind(t *testing.T, objs []object) map[string]object {
	t.Helper()
	m := map[string]object{}
	for _, o := range objs {
		key := o.Kind
		if strings.HasSuffix(o.Name, metricsReaderSuffix) {
			key += "/metrics-reader"
		} else if c := o.Labels["app.kubernetes.io/component"]; c != "" && c != "metrics" {
			key += "/" + c
		}
		if _, dup := m[key]; dup && o.Kind != "ConfigMap" {
			t.Fatalf("two %s objects", key)
		}
		m[key] = o
	}
	return m
}

const metricsReaderSuffix = "-metrics-reader"

// The rules --web.kubernetes-auth needs: the exporter's, to review a caller, and a scraper's.
var (
	reviewRules = []rbacv1.PolicyRule{
		{APIGroups: []string{"authentication.k8s.io"}, Resources: []string{"tokenreviews"}, Verbs: []string{"create"}},
		{APIGroups: []string{"authorization.k8s.io"}, Resources: []string{"subjectaccessreviews"}, Verbs: []string{"create"}},
	}
	metricsReaderRules = []rbacv1.PolicyRule{{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}}
)

// hasRules tells whether have holds every rule of want.
func hasRules(have, want []rbacv1.PolicyRule) bool {
	for _, w := range want {
		if !slices.ContainsFunc(have, func(h rbacv1.PolicyRule) bool { return reflect.DeepEqual(h, w) }) {
			return false
		}
	}
	return true
}

// shippedRules reads the rules of a ClusterRole or Role of deploy/.
func shippedRules(t *testing.T, file string) []rbacv1.PolicyRule {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, file))
	if err != nil {
		t.Fatal(err)
	}
	var role rbacv1.ClusterRole
	if err := yaml.UnmarshalStrict(b, &role); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return role.Rules
}

// checkComponents checks the optional components' objects, rendered by the chart or kustomize:
// the DaemonSet runs with --node-conditions and --node-report, the node-conditions ClusterRole
// (the rules of deploy/components/node-conditions) is bound to the exporter's ServiceAccount,
// the node-report Role (deploy/components/node-report's) too in the exporter's namespace, and
// the kubectl plugin's ClusterRole has deploy/components/kubectl-plugin's rules, and the node
// report's admission policy is deploy/components/node-report's, bound with Deny.
func checkComponents(t *testing.T, k map[string]object) {
	t.Helper()
	checkReportPolicy(t, k)
	var ds appsv1.DaemonSet
	k["DaemonSet"].decodeStrict(t, &ds)
	for _, flag := range []string{"--node-conditions", "--node-report"} {
		if !slices.Contains(ds.Spec.Template.Spec.Containers[0].Args, flag) {
			t.Errorf("args %q: no %s", ds.Spec.Template.Spec.Containers[0].Args, flag)
		}
	}
	var reportRole rbacv1.Role
	var reportBinding rbacv1.RoleBinding
	k["Role/node-report"].decodeStrict(t, &reportRole)
	k["RoleBinding/node-report"].decodeStrict(t, &reportBinding)
	if !slices.EqualFunc(reportRole.Rules, shippedRules(t, "deploy/components/node-report/role.yaml"), rulesEqual) {
		t.Errorf("node-report rules %+v", reportRole.Rules)
	}
	if reportRole.Namespace != ds.Namespace || reportBinding.Namespace != ds.Namespace || reportBinding.RoleRef.Kind != "Role" || reportBinding.RoleRef.Name != reportRole.Name ||
		!slices.Equal(reportBinding.Subjects, []rbacv1.Subject{{Kind: "ServiceAccount", Name: ds.Spec.Template.Spec.ServiceAccountName, Namespace: ds.Namespace}}) {
		t.Errorf("the node-report binding %s/%s %+v -> %s does not bind Role %s/%s to the exporter in %s",
			reportBinding.Namespace, reportBinding.Name, reportBinding.Subjects, reportBinding.RoleRef.Name, reportRole.Namespace, reportRole.Name, ds.Namespace)
	}
	var role, plugin rbacv1.ClusterRole
	var binding rbacv1.ClusterRoleBinding
	var sa corev1.ServiceAccount
	k["ClusterRole/node-conditions"].decodeStrict(t, &role)
	k["ClusterRoleBinding/node-conditions"].decodeStrict(t, &binding)
	k["ClusterRole/kubectl-plugin"].decodeStrict(t, &plugin)
	k["ServiceAccount"].decodeStrict(t, &sa)
	if !slices.EqualFunc(role.Rules, shippedRules(t, "deploy/components/node-conditions/clusterrole.yaml"), rulesEqual) {
		t.Errorf("node-conditions rules %+v", role.Rules)
	}
	want := []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa.Name, Namespace: sa.Namespace}}
	if binding.RoleRef.Name != role.Name || !slices.Equal(binding.Subjects, want) || sa.Namespace != ds.Namespace || sa.Namespace == "" {
		t.Errorf("the node-conditions binding %+v -> %s does not bind %s to ServiceAccount %s/%s", binding.Subjects, binding.RoleRef.Name, role.Name, sa.Namespace, sa.Name)
	}
	if !slices.EqualFunc(plugin.Rules, shippedRules(t, "deploy/components/kubectl-plugin/clusterrole.yaml"), rulesEqual) {
		t.Errorf("kubectl-plugin rules %+v", plugin.Rules)
	}
}

// checkViewer checks what scrape auth ships for `kubectl proxyhealth`, rendered by the chart or
// kustomize: the exporter accepts the plugin's audience and the API server's, and the viewer
// ServiceAccount, in the DaemonSet's namespace, is bound to deploy/components/kubernetes-auth's
// ClusterRole (get on /status).
func checkViewer(t *testing.T, k map[string]object) {
	t.Helper()
	var ds appsv1.DaemonSet
	var sa corev1.ServiceAccount
	var role rbacv1.ClusterRole
	var binding rbacv1.ClusterRoleBinding
	k["DaemonSet"].decodeStrict(t, &ds)
	k["ServiceAccount/viewer"].decodeStrict(t, &sa)
	k["ClusterRole/viewer"].decodeStrict(t, &role)
	k["ClusterRoleBinding/viewer"].decodeStrict(t, &binding)
	args := ds.Spec.Template.Spec.Containers[0].Args
	for _, want := range []string{"--web.kubernetes-auth.audience=proxyhealth", "--web.kubernetes-auth.audience=kube-apiserver"} {
		if !slices.Contains(args, want) {
			t.Errorf("args %q lack %s", args, want)
		}
	}
	if sa.Name != "proxyhealth-viewer" || sa.Namespace != ds.Namespace {
		t.Errorf("viewer ServiceAccount %s/%s, want proxyhealth-viewer in %s (the plugin's default)", sa.Namespace, sa.Name, ds.Namespace)
	}
	if !slices.EqualFunc(role.Rules, shippedRules(t, "deploy/components/kubernetes-auth/viewer-clusterrole.yaml"), rulesEqual) {
		t.Errorf("viewer rules %+v", role.Rules)
	}
	want := []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa.Name, Namespace: sa.Namespace}}
	if binding.RoleRef.Name != role.Name || !slices.Equal(binding.Subjects, want) {
		t.Errorf("the viewer binding %+v -> %s does not bind %s to %s/%s", binding.Subjects, binding.RoleRef.Name, role.Name, sa.Namespace, sa.Name)
	}
}

// checkReportPolicy checks that the node report's ValidatingAdmissionPolicy, rendered by the chart
// or kustomize, has the spec of deploy/components/node-report/admission-policy.yaml (the one
// the e2e test TestNodeReportAdmissionPolicy holds an exporter to), for the exporter's
// ServiceAccount, and that its binding denies.
func checkReportPolicy(t *testing.T, k map[string]object) {
	t.Helper()
	var policy admissionregistrationv1.ValidatingAdmissionPolicy
	var binding admissionregistrationv1.ValidatingAdmissionPolicyBinding
	var ds appsv1.DaemonSet
	k["ValidatingAdmissionPolicy/node-report"].decodeStrict(t, &policy)
	k["ValidatingAdmissionPolicyBinding/node-report"].decodeStrict(t, &binding)
	k["DaemonSet"].decodeStrict(t, &ds)
	shipped := shippedReportPolicy(t)
	// The shipped policy names the ServiceAccount deploy/base runs the exporter as.
	if sa := ds.Spec.Template.Spec.ServiceAccountName; sa != "proxyhealth" {
		for i, c := range shipped.Spec.MatchConditions {
			shipped.Spec.MatchConditions[i].Expression = strings.ReplaceAll(c.Expression, "':proxyhealth'", "':"+sa+"'")
		}
	}
	if !reflect.DeepEqual(policy.Spec, shipped.Spec) {
		got, _ := json.MarshalIndent(policy.Spec, "", "  ")
		want, _ := json.MarshalIndent(shipped.Spec, "", "  ")
		t.Errorf("the node report's admission policy differs from deploy/components/node-report's:\n%s\nwant\n%s", got, want)
	}
	if binding.Spec.PolicyName != policy.Name || !slices.Equal(binding.Spec.ValidationActions, []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}) || binding.Spec.MatchResources != nil || binding.Spec.ParamRef != nil {
		t.Errorf("the node report's policy binding %+v: want policy %s, Deny, nothing else", binding.Spec, policy.Name)
	}
}

// shippedReportPolicy reads deploy/components/node-report's ValidatingAdmissionPolicy.
func shippedReportPolicy(t *testing.T) admissionregistrationv1.ValidatingAdmissionPolicy {
	t.Helper()
	const file = "deploy/components/node-report/admission-policy.yaml"
	b, err := os.ReadFile(filepath.Join(root, file))
	if err != nil {
		t.Fatal(err)
	}
	var policy admissionregistrationv1.ValidatingAdmissionPolicy
	for _, o := range objects(t, b) {
		if o.Kind == "ValidatingAdmissionPolicy" {
			if err := yaml.UnmarshalStrict(o.raw, &policy); err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			return policy
		}
	}
	t.Fatalf("%s has no ValidatingAdmissionPolicy", file)
	return policy
}

func rulesEqual(a, b rbacv1.PolicyRule) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return bytes.Equal(ja, jb)
}

// TestKustomizeComponents: an overlay in its own namespace with the optional components.
func TestKustomizeComponents(t *testing.T) {
	dir := t.TempDir()
	deploy, err := filepath.Abs(filepath.Join(root, "deploy"))
	if err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel(dir, deploy) // kustomize refuses absolute paths
	if err != nil {
		t.Fatal(err)
	}
	k := fmt.Sprintf("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamespace: monitoring\nresources:\n- %[1]s/base\ncomponents:\n- %[1]s/components/node-conditions\n- %[1]s/components/node-report\n- %[1]s/components/kubectl-plugin\n", rel)
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}
	objs := renderKustomize(t, dir)
	typed(t, objs)
	checkComponents(t, byKind(t, objs))
}

func renderChart(t *testing.T, release, namespace string, valuesFiles ...string) []object {
	t.Helper()
	vals, err := readValues(valuesFiles...)
	if err != nil {
		t.Fatal(err)
	}
	out, err := RenderChart(filepath.Join(root, chartDir), release, namespace, vals)
	if err != nil {
		t.Fatalf("helm template with %v: %v", valuesFiles, err)
	}
	return objects(t, out)
}

func renderKustomize(t *testing.T, dir string) []object {
	t.Helper()
	out, err := render(dir)
	if err != nil {
		t.Fatalf("kustomize %s: %v", dir, err)
	}
	return objects(t, out)
}

// ciValues are the chart's values files for tests (charts/proxyhealth/ci).
func ciValues(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(root, chartDir, "ci", "*-values.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no values files in %s/ci: %v", chartDir, err)
	}
	return files
}

// TestChartFilesAreCurrent: the rules and dashboards in the chart are alerts/ and dashboards/.
func TestChartFilesAreCurrent(t *testing.T) {
	if err := CheckChartFiles(root); err != nil {
		t.Fatal(err)
	}
}

// TestChartFilesCheckFindsChanges: the check names a changed, a missing and an extra file.
func TestChartFilesCheckFindsChanges(t *testing.T) {
	dir := t.TempDir()
	write := func(p, s string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, p), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(sourceRules, "groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: up == 0\n")
	write(sourceDashboards+"/a.json", "{}\n")
	write(sourceDashboards+"/b.json", "{\"b\": 1}\n")
	if err := WriteChartFiles(dir); err != nil {
		t.Fatal(err)
	}
	if err := CheckChartFiles(dir); err != nil {
		t.Fatalf("just generated: %v", err)
	}
	write(sourceDashboards+"/a.json", "{\"changed\": true}\n")
	if err := os.Remove(filepath.Join(dir, chartDashboards, "b.json")); err != nil {
		t.Fatal(err)
	}
	write(chartDashboards+"/c.json", "{}\n")
	err := CheckChartFiles(dir)
	for _, want := range []string{"a.json differs", "b.json is missing", "c.json has no source"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("want %q in %v", want, err)
		}
	}
	if err := WriteChartFiles(dir); err != nil {
		t.Fatal(err)
	}
	if err := CheckChartFiles(dir); err != nil {
		t.Fatalf("regenerated: %v", err)
	}
}

// TestChartLint: helm lint --strict, with the defaults and with each values file.
func TestChartLint(t *testing.T) {
	for _, f := range append([]string{""}, ciValues(t)...) {
		name := "defaults"
		var files []string
		if f != "" {
			name, files = filepath.Base(f), []string{f}
		}
		t.Run(name, func(t *testing.T) {
			vals, err := readValues(files...)
			if err != nil {
				t.Fatal(err)
			}
			if err := LintChart(filepath.Join(root, chartDir), "proxyhealth", vals); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestChartTemplate renders the chart with each values file and checks what each is for.
func TestChartTemplate(t *testing.T) {
	checks := map[string]func(t *testing.T, objs []object, k map[string]object){
		"default-values.yaml": func(t *testing.T, objs []object, k map[string]object) {
			for _, kind := range []string{"PodMonitor", "ServiceMonitor", "PrometheusRule", "Service", "ConfigMap", "ClusterRole/node-conditions", "ClusterRole/kubectl-plugin"} {
				if _, ok := k[kind]; ok {
					t.Errorf("a %s by default", kind)
				}
			}
			// The node report is on by default, for `kubectl proxyhealth`, each exporter held
			// to its own node's report by the admission policy.
			for _, kind := range []string{"Role/node-report", "RoleBinding/node-report", "ValidatingAdmissionPolicy/node-report", "ValidatingAdmissionPolicyBinding/node-report"} {
				if _, ok := k[kind]; !ok {
					t.Errorf("no %s by default", kind)
				}
			}
			checkReportPolicy(t, k)
			var ds appsv1.DaemonSet
			k["DaemonSet"].decodeStrict(t, &ds)
			pod := ds.Spec.Template.Spec
			if !slices.Contains(pod.Containers[0].Args, "--node-report") {
				t.Errorf("args %q: no --node-report by default", pod.Containers[0].Args)
			}
			if pod.NodeSelector["kubernetes.io/os"] != "linux" {
				t.Errorf("nodeSelector %v", pod.NodeSelector)
			}
			if len(pod.Tolerations) != 1 || pod.Tolerations[0].Operator != corev1.TolerationOpExists || pod.Tolerations[0].Key != "" {
				t.Errorf("tolerations %v: want every taint tolerated", pod.Tolerations)
			}
			if img := pod.Containers[0].Image; img != "ghcr.io/proxyhealth/proxyhealth:v0.1.0" {
				t.Errorf("image %s: want the tag v<appVersion>", img)
			}
			var crb rbacv1.ClusterRoleBinding
			k["ClusterRoleBinding"].decodeStrict(t, &crb)
			if s := crb.Subjects; len(s) != 1 || s[0].Namespace != "proxyhealth" || s[0].Name != k["ServiceAccount"].Name {
				t.Errorf("binding subjects %+v", s)
			}
			// conntrack's INVALID log is not read by default: no node setting changed, no
			// writable /proc.
			if slices.ContainsFunc(pod.Containers[0].Args, func(a string) bool {
				return a == "--conntrack.invalid-reasons" || strings.HasPrefix(a, "--path.procfs")
			}) || slices.ContainsFunc(pod.Volumes, func(v corev1.Volume) bool { return v.HostPath != nil && v.HostPath.Path == "/proc" }) {
				t.Errorf("args %q, volumes %+v: the INVALID log read by default", pod.Containers[0].Args, pod.Volumes)
			}
			// Scrape auth is off by default, and so are the rights it needs.
			if slices.Contains(pod.Containers[0].Args, "--web.kubernetes-auth") {
				t.Errorf("args %q: --web.kubernetes-auth by default", pod.Containers[0].Args)
			}
			// The exporter derives its legacy table read limit from the memory limit: a value
			// pinned in the args would go out of step with the limit when that is changed.
			if mem := pod.Containers[0].Resources.Limits.Memory(); mem.IsZero() || slices.ContainsFunc(pod.Containers[0].Args, func(a string) bool {
				return strings.HasPrefix(a, "--netfilter.legacy-max-table-bytes")
			}) {
				t.Errorf("memory limit %v, args %q: want a memory limit and the legacy table read limit derived from it", mem, pod.Containers[0].Args)
			}
			var cr rbacv1.ClusterRole
			k["ClusterRole"].decodeStrict(t, &cr)
			for _, r := range cr.Rules {
				if slices.Contains(r.Verbs, "create") {
					t.Errorf("the ClusterRole may create %v without kubernetesAuth", r.Resources)
				}
			}
		},
		"kubernetes-auth-values.yaml": func(t *testing.T, objs []object, k map[string]object) {
			var ds appsv1.DaemonSet
			k["DaemonSet"].decodeStrict(t, &ds)
			if args := ds.Spec.Template.Spec.Containers[0].Args; !slices.Contains(args, "--web.kubernetes-auth") {
				t.Errorf("args %q lack --web.kubernetes-auth", args)
			}
			var cr rbacv1.ClusterRole
			k["ClusterRole"].decodeStrict(t, &cr)
			if !hasRules(cr.Rules, reviewRules) {
				t.Errorf("the exporter's ClusterRole %+v cannot create TokenReviews and SubjectAccessReviews", cr.Rules)
			}
			checkViewer(t, k)
			var reader rbacv1.ClusterRole
			var readerBinding rbacv1.ClusterRoleBinding
			k["ClusterRole/metrics-reader"].decodeStrict(t, &reader)
			k["ClusterRoleBinding/metrics-reader"].decodeStrict(t, &readerBinding)
			if !reflect.DeepEqual(reader.Rules, metricsReaderRules) || readerBinding.RoleRef.Name != reader.Name {
				t.Errorf("metrics reader %+v bound by %+v", reader.Rules, readerBinding.RoleRef)
			}
			want := []rbacv1.Subject{{Kind: "ServiceAccount", Name: "prometheus-server", Namespace: "monitoring"}}
			if !slices.Equal(readerBinding.Subjects, want) {
				t.Errorf("metrics reader subjects %+v, want %+v", readerBinding.Subjects, want)
			}
			var pm monitoringv1.PodMonitor
			var sm monitoringv1.ServiceMonitor
			k["PodMonitor"].decodeStrict(t, &pm)
			k["ServiceMonitor"].decodeStrict(t, &sm)
			for kind, class := range map[string]*string{"PodMonitor": pm.Spec.ScrapeClassName, "ServiceMonitor": sm.Spec.ScrapeClassName} {
				if class == nil || *class != "kubernetes-auth" {
					t.Errorf("the %s names scrape class %v, want kubernetes-auth", kind, class)
				}
			}
		},
		"kube-prometheus-stack-values.yaml": func(t *testing.T, objs []object, k map[string]object) {
			for _, kind := range []string{"PodMonitor", "PrometheusRule"} {
				if k[kind].Labels["release"] != "kube-prometheus-stack" {
					t.Errorf("%s labels %v: no release label", kind, k[kind].Labels)
				}
			}
		},
		"everything-values.yaml": func(t *testing.T, objs []object, k map[string]object) {
			for _, o := range objs {
				want := "monitoring"
				switch o.Kind {
				case "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding":
					want = ""
				case "PodMonitor", "PrometheusRule":
					// Their own namespace (where a Prometheus looks for them) over namespaceOverride.
					want = "prometheus"
				case "ConfigMap":
					want = "grafana"
				}
				if o.Namespace != want {
					t.Errorf("%s %s in namespace %q, want %q", o.Kind, o.Name, o.Namespace, want)
				}
				if o.Labels["team"] != "network" {
					t.Errorf("%s %s lacks the common label: %v", o.Kind, o.Name, o.Labels)
				}
				if o.Labels["app.kubernetes.io/name"] != "ph" {
					t.Errorf("%s %s: app.kubernetes.io/name %q", o.Kind, o.Name, o.Labels["app.kubernetes.io/name"])
				}
			}
			var ds appsv1.DaemonSet
			k["DaemonSet"].decodeStrict(t, &ds)
			pod := ds.Spec.Template.Spec
			c := pod.Containers[0]
			if c.Image != "registry.example.com/mirror/proxyhealth:v0.1.0-rc.1@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef" || c.ImagePullPolicy != corev1.PullAlways {
				t.Errorf("image %s %s", c.Image, c.ImagePullPolicy)
			}
			if !slices.Equal(c.Args, []string{"--web.listen-address=:9970", "--node-name=$(NODE_NAME)", "--no-conntrack.table-stats",
				"--conntrack.invalid-reasons", "--conntrack.invalid-reasons.state-dir=/run/proxyhealth", "--conntrack.invalid-reasons.netfilter-dir=/host/proc/sys/net/netfilter",
				"--node-report", "--rules.grace-period=2m", "--log.format=json"}) {
				t.Errorf("args %q", c.Args)
			}
			if len(c.Env) != 2 || c.Env[1].Name != "GOMEMLIMIT" || c.Ports[0].ContainerPort != 9970 {
				t.Errorf("env %v ports %v", c.Env, c.Ports)
			}
			if len(pod.ImagePullSecrets) != 2 || pod.ImagePullSecrets[0].Name != "pull-secret" || pod.ImagePullSecrets[1].Name != "other-secret" {
				t.Errorf("imagePullSecrets %v", pod.ImagePullSecrets)
			}
			if pod.PriorityClassName != "system-node-critical" || pod.Affinity == nil || ds.Spec.UpdateStrategy.Type != appsv1.OnDeleteDaemonSetStrategyType {
				t.Errorf("priority class, affinity or update strategy not set")
			}
			// kube-proxy's logs, the INVALID log's netfilter settings and state, the extra one.
			if len(pod.Volumes) != 4 || len(c.VolumeMounts) != 4 {
				t.Errorf("volumes %v mounts %v", pod.Volumes, c.VolumeMounts)
			}
			var crb rbacv1.ClusterRoleBinding
			k["ClusterRoleBinding"].decodeStrict(t, &crb)
			if s := crb.Subjects; len(s) != 1 || s[0].Namespace != "monitoring" || s[0].Name != "node-proxyhealth" {
				t.Errorf("binding subjects %+v: want the ServiceAccount in the overridden namespace", s)
			}
			var pm monitoringv1.PodMonitor
			k["PodMonitor"].decodeStrict(t, &pm)
			ep := pm.Spec.PodMetricsEndpoints[0]
			if string(ep.Interval) != "15s" || string(ep.ScrapeTimeout) != "5s" || len(ep.RelabelConfigs) != 2 || len(ep.MetricRelabelConfigs) != 1 {
				t.Errorf("pod monitor endpoint %+v", ep)
			}
			if !slices.Equal(pm.Spec.NamespaceSelector.MatchNames, []string{"monitoring"}) {
				t.Errorf("pod monitor namespaces %v", pm.Spec.NamespaceSelector.MatchNames)
			}
			var sm monitoringv1.ServiceMonitor
			k["ServiceMonitor"].decodeStrict(t, &sm)
			var svc corev1.Service
			k["Service"].decodeStrict(t, &svc)
			if svc.Spec.Ports[0].Port != 9970 || sm.Spec.Endpoints[0].Port != svc.Spec.Ports[0].Name {
				t.Errorf("service port %v, monitor port %q", svc.Spec.Ports, sm.Spec.Endpoints[0].Port)
			}
			var pr monitoringv1.PrometheusRule
			k["PrometheusRule"].decodeStrict(t, &pr)
			var alerts []string
			up := ""
			for _, g := range pr.Spec.Groups {
				for _, r := range g.Rules {
					alerts = append(alerts, r.Alert)
					if r.Record == "proxyhealth:up" {
						up = r.Expr.String()
					}
				}
			}
			if slices.Contains(alerts, "ProxyHealthConntrackTableNearlyFull") || slices.Contains(alerts, "ProxyHealthExporterAbsent") || !slices.Contains(alerts, "ProxyHealthExporterDown") {
				t.Errorf("alerts %v: want the two disabled ones out, the others in", alerts)
			}
			if up != `up{job="ph"}` {
				t.Errorf("proxyhealth:up is %q: want the job of the renamed pods", up)
			}
			dashboards := 0
			for _, o := range objs {
				if o.Kind != "ConfigMap" {
					continue
				}
				dashboards++
				var cm corev1.ConfigMap
				o.decodeStrict(t, &cm)
				if cm.Labels["grafana_dashboard"] != "1" || cm.Annotations["grafana_folder"] != "Kubernetes" || len(cm.Data) != 1 {
					t.Errorf("dashboard ConfigMap %s: labels %v annotations %v", cm.Name, cm.Labels, cm.Annotations)
				}
				for key, v := range cm.Data {
					src, err := os.ReadFile(filepath.Join(root, sourceDashboards, key))
					if err != nil {
						t.Fatal(err)
					}
					if v != strings.TrimSuffix(string(src), "\n") {
						t.Errorf("dashboard %s differs from %s", cm.Name, key)
					}
				}
			}
			srcs, _ := filepath.Glob(filepath.Join(root, sourceDashboards, "*.json"))
			if dashboards != len(srcs) {
				t.Errorf("%d dashboard ConfigMaps for %d dashboards", dashboards, len(srcs))
			}
		},
		"node-conditions-values.yaml": func(t *testing.T, objs []object, k map[string]object) {
			checkComponents(t, k)
			var ds appsv1.DaemonSet
			k["DaemonSet"].decodeStrict(t, &ds)
			if args := ds.Spec.Template.Spec.Containers[0].Args; !slices.Contains(args, "--node-conditions.heartbeat-interval=2m") || slices.ContainsFunc(args, func(a string) bool {
				return strings.HasPrefix(a, "--node-conditions.event-interval")
			}) {
				t.Errorf("args %q: want the heartbeat set, the event interval left to the default", args)
			}
		},
		"invalid-reasons-values.yaml": func(t *testing.T, objs []object, k map[string]object) {
			var ds appsv1.DaemonSet
			k["DaemonSet"].decodeStrict(t, &ds)
			pod := ds.Spec.Template.Spec
			c := pod.Containers[0]
			const netfilterDir = "/host/proc/sys/net/netfilter"
			if !slices.Contains(c.Args, "--conntrack.invalid-reasons") || !slices.Contains(c.Args, "--conntrack.invalid-reasons.netfilter-dir="+netfilterDir) ||
				slices.ContainsFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--path.procfs") }) {
				t.Errorf("args %q: want --conntrack.invalid-reasons and --conntrack.invalid-reasons.netfilter-dir=%s, and the container's own procfs", c.Args, netfilterDir)
			}
			// The host's /proc/sys/net/netfilter, writable (the runtime's /proc/sys is
			// read-only), and nothing else of the host's /proc.
			i := slices.IndexFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == netfilterDir })
			if i < 0 || c.VolumeMounts[i].ReadOnly {
				t.Fatalf("volume mounts %+v: want the host's /proc/sys/net/netfilter writable at %s", c.VolumeMounts, netfilterDir)
			}
			j := slices.IndexFunc(pod.Volumes, func(v corev1.Volume) bool { return v.Name == c.VolumeMounts[i].Name })
			if j < 0 || pod.Volumes[j].HostPath == nil || pod.Volumes[j].HostPath.Path != "/proc/sys/net/netfilter" || !pod.HostNetwork {
				t.Errorf("volumes %+v, host network %v: want hostPath /proc/sys/net/netfilter in the node's network namespace", pod.Volumes, pod.HostNetwork)
			}
			if caps := c.SecurityContext.Capabilities; caps == nil || !slices.Contains(caps.Add, "NET_ADMIN") {
				t.Errorf("capabilities %+v: conntrack's settings and NFLOG need NET_ADMIN", caps)
			}
			// The node's own values of the settings are kept in a host directory that
			// outlives the container, the same path inside, made the exporter's user's by an
			// init container that can do nothing else.
			const stateDir = "/run/proxyhealth"
			if !slices.Contains(c.Args, "--conntrack.invalid-reasons.state-dir="+stateDir) {
				t.Errorf("args %q: want --conntrack.invalid-reasons.state-dir=%s", c.Args, stateDir)
			}
			i = slices.IndexFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == stateDir })
			if i < 0 || c.VolumeMounts[i].ReadOnly {
				t.Fatalf("volume mounts %+v: want the state directory writable at %s", c.VolumeMounts, stateDir)
			}
			j = slices.IndexFunc(pod.Volumes, func(v corev1.Volume) bool { return v.Name == c.VolumeMounts[i].Name })
			if j < 0 || pod.Volumes[j].HostPath == nil || pod.Volumes[j].HostPath.Path != stateDir ||
				pod.Volumes[j].HostPath.Type == nil || *pod.Volumes[j].HostPath.Type != corev1.HostPathDirectoryOrCreate {
				t.Errorf("volumes %+v: want hostPath %s, DirectoryOrCreate", pod.Volumes, stateDir)
			}
			if len(pod.InitContainers) != 1 {
				t.Fatalf("init containers %+v: want the state directory's", pod.InitContainers)
			}
			ic := pod.InitContainers[0]
			sc := ic.SecurityContext
			if ic.Image != c.Image || !slices.Equal(ic.Args, []string{"prepare-state-dir", "--conntrack.invalid-reasons.state-dir=" + stateDir, "--owner=9869:9869"}) ||
				len(ic.VolumeMounts) != 1 || ic.VolumeMounts[0].Name != c.VolumeMounts[i].Name || ic.VolumeMounts[0].MountPath != stateDir {
				t.Errorf("init container %+v: want the exporter's image preparing %s for 9869:9869, with that directory alone", ic, stateDir)
			}
			if sc == nil || sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) ||
				!slices.Equal(sc.Capabilities.Add, []corev1.Capability{"CHOWN"}) || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
				sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.Privileged != nil && *sc.Privileged {
				t.Errorf("init container's securityContext %+v: want CHOWN alone, no escalation, a read-only root", sc)
			}
		},
		"external-rbac-values.yaml": func(t *testing.T, objs []object, k map[string]object) {
			for _, kind := range []string{"ServiceAccount", "ClusterRole", "ClusterRoleBinding"} {
				if _, ok := k[kind]; ok {
					t.Errorf("a %s with rbac.create and serviceAccount.create false", kind)
				}
			}
			var ds appsv1.DaemonSet
			k["DaemonSet"].decodeStrict(t, &ds)
			pod := ds.Spec.Template.Spec
			if pod.ServiceAccountName != "proxyhealth-reader" || pod.HostNetwork || len(pod.Volumes) != 0 || pod.DNSPolicy != "" {
				t.Errorf("service account %q, host network %v, volumes %v, dnsPolicy %q", pod.ServiceAccountName, pod.HostNetwork, pod.Volumes, pod.DNSPolicy)
			}
		},
	}
	files := ciValues(t)
	if len(files) != len(checks) {
		t.Errorf("%d values files, %d checks: each values file needs its check", len(files), len(checks))
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			objs := renderChart(t, "proxyhealth", "proxyhealth", f)
			typed(t, objs)
			k := byKind(t, objs)
			for _, kind := range []string{"DaemonSet"} {
				if _, ok := k[kind]; !ok {
					t.Fatalf("no %s", kind)
				}
			}
			check, ok := checks[filepath.Base(f)]
			if !ok {
				t.Fatalf("no check for %s", f)
			}
			check(t, objs, k)
		})
	}
}

// TestChartMatchesKustomize: the chart, with the values of a kube-prometheus-stack install,
// renders the DaemonSet, RBAC and monitors the kustomize example overlay does, in everything
// but names and labels: the same pod (args, env, securityContext, volumes, probes, resources,
// nodeSelector, tolerations), the same ClusterRole rules bound to the ServiceAccount in the
// namespace it is in, the same scrape and the same rules, both monitors labelled for the
// Prometheus that selects them.
func TestChartMatchesKustomize(t *testing.T) {
	kust := byKind(t, renderKustomize(t, filepath.Join(root, "deploy/overlays/example")))
	chart := byKind(t, renderChart(t, "proxyhealth", kust["DaemonSet"].Namespace,
		filepath.Join(root, chartDir, "ci", "kube-prometheus-stack-values.yaml")))

	same := func(what string, a, b any) {
		t.Helper()
		ja, _ := json.MarshalIndent(a, "", "  ")
		jb, _ := json.MarshalIndent(b, "", "  ")
		if !bytes.Equal(ja, jb) {
			t.Errorf("%s differs:\nkustomize: %s\nchart:     %s", what, ja, jb)
		}
	}

	var kds, cds appsv1.DaemonSet
	kust["DaemonSet"].decodeStrict(t, &kds)
	chart["DaemonSet"].decodeStrict(t, &cds)
	kpod, cpod := kds.Spec.Template.Spec, cds.Spec.Template.Spec
	same("the pod spec", kpod, cpod)
	same("the update strategy", kds.Spec.UpdateStrategy, cds.Spec.UpdateStrategy)
	if kds.Namespace != cds.Namespace {
		t.Errorf("DaemonSet namespaces %q and %q", kds.Namespace, cds.Namespace)
	}

	for _, objs := range []map[string]object{kust, chart} {
		var sa corev1.ServiceAccount
		var cr rbacv1.ClusterRole
		var crb rbacv1.ClusterRoleBinding
		var ds appsv1.DaemonSet
		objs["ServiceAccount"].decodeStrict(t, &sa)
		objs["ClusterRole"].decodeStrict(t, &cr)
		objs["ClusterRoleBinding"].decodeStrict(t, &crb)
		objs["DaemonSet"].decodeStrict(t, &ds)
		want := []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa.Name, Namespace: sa.Namespace}}
		if !slices.Equal(crb.Subjects, want) || crb.RoleRef.Name != cr.Name || ds.Spec.Template.Spec.ServiceAccountName != sa.Name || sa.Namespace != ds.Namespace {
			t.Errorf("the binding %+v -> %s does not bind ClusterRole %s to ServiceAccount %s/%s of DaemonSet %s/%s",
				crb.Subjects, crb.RoleRef.Name, cr.Name, sa.Namespace, sa.Name, ds.Namespace, ds.Name)
		}
	}
	var kcr, ccr rbacv1.ClusterRole
	kust["ClusterRole"].decodeStrict(t, &kcr)
	chart["ClusterRole"].decodeStrict(t, &ccr)
	same("the ClusterRole's rules", kcr.Rules, ccr.Rules)

	var kpm, cpm monitoringv1.PodMonitor
	kust["PodMonitor"].decodeStrict(t, &kpm)
	chart["PodMonitor"].decodeStrict(t, &cpm)
	same("the scrape", kpm.Spec.PodMetricsEndpoints, cpm.Spec.PodMetricsEndpoints)
	same("the job label", kpm.Spec.JobLabel, cpm.Spec.JobLabel)
	same("the scrape class", kpm.Spec.ScrapeClassName, cpm.Spec.ScrapeClassName)
	// Both with scrape auth, the recommended setting.
	if !slices.Contains(kpod.Containers[0].Args, "--web.kubernetes-auth") || !hasRules(kcr.Rules, reviewRules) ||
		kpm.Spec.ScrapeClassName == nil || *kpm.Spec.ScrapeClassName != "kubernetes-auth" {
		t.Errorf("the example overlay without scrape auth: args %q, rules %+v, scrape class %v", kpod.Containers[0].Args, kcr.Rules, kpm.Spec.ScrapeClassName)
	}
	for _, pm := range []monitoringv1.PodMonitor{kpm, cpm} {
		sel := pm.Spec.Selector.MatchLabels
		for k, v := range sel {
			if kds.Spec.Template.Labels[k] != v && cds.Spec.Template.Labels[k] != v {
				t.Errorf("PodMonitor %s selects %s=%s, which its pods lack", pm.Name, k, v)
			}
		}
	}

	checkViewer(t, kust)
	checkViewer(t, chart)

	var kpr, cpr monitoringv1.PrometheusRule
	kust["PrometheusRule"].decodeStrict(t, &kpr)
	chart["PrometheusRule"].decodeStrict(t, &cpr)
	same("the rules", kpr.Spec, cpr.Spec)

	for _, kind := range []string{"PodMonitor", "PrometheusRule"} {
		if kust[kind].Labels["release"] == "" || kust[kind].Labels["release"] != chart[kind].Labels["release"] {
			t.Errorf("%s release labels: kustomize %q, chart %q", kind, kust[kind].Labels["release"], chart[kind].Labels["release"])
		}
	}
}

// TestKustomizeNamespace: the namespace is set in one place and everything follows it,
// including the ClusterRoleBinding's subject. The base puts its objects in "default"
// explicitly, so that `kubectl apply -k deploy/base -n X` is refused instead of leaving the
// binding's subject behind; an overlay's namespace (or `kustomize edit set namespace` in a copy
// of the base) moves the objects and the subject together.
func TestKustomizeNamespace(t *testing.T) {
	base, err := filepath.Abs(filepath.Join(root, "deploy/base"))
	if err != nil {
		t.Fatal(err)
	}
	check := func(t *testing.T, objs []object, ns string) {
		t.Helper()
		k := byKind(t, objs)
		for _, o := range objs {
			want := ns
			switch o.Kind {
			case "ClusterRole", "ClusterRoleBinding", "Namespace", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding":
				want = ""
			}
			if o.Namespace != want {
				t.Errorf("%s %s in namespace %q, want %q", o.Kind, o.Name, o.Namespace, want)
			}
		}
		var crb rbacv1.ClusterRoleBinding
		k["ClusterRoleBinding"].decodeStrict(t, &crb)
		if len(crb.Subjects) != 1 || crb.Subjects[0].Namespace != ns || crb.Subjects[0].Name != k["ServiceAccount"].Name {
			t.Errorf("the binding's subject %+v is not ServiceAccount %s/%s", crb.Subjects, ns, k["ServiceAccount"].Name)
		}
	}
	t.Run("base", func(t *testing.T) { check(t, renderKustomize(t, base), "default") })
	t.Run("overlay", func(t *testing.T) {
		dir := t.TempDir()
		rel, err := filepath.Rel(dir, base) // kustomize refuses an absolute base
		if err != nil {
			t.Fatal(err)
		}
		k := fmt.Sprintf("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamespace: monitoring\nresources:\n- %s\n", rel)
		if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
			t.Fatal(err)
		}
		check(t, renderKustomize(t, dir), "monitoring")
	})
	t.Run("edit_set_namespace", func(t *testing.T) {
		// What `kustomize edit set namespace monitoring` does to a copy of the base.
		dir := t.TempDir()
		entries, err := os.ReadDir(base)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			b, err := os.ReadFile(filepath.Join(base, e.Name()))
			if err != nil {
				t.Fatal(err)
			}
			if e.Name() == "kustomization.yaml" {
				var m map[string]any
				if err := yaml.Unmarshal(b, &m); err != nil {
					t.Fatal(err)
				}
				if m["namespace"] != "default" {
					t.Fatalf("the base's namespace is %v, want default", m["namespace"])
				}
				m["namespace"] = "monitoring"
				if b, err = yaml.Marshal(m); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.WriteFile(filepath.Join(dir, e.Name()), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		check(t, renderKustomize(t, dir), "monitoring")
	})
	t.Run("example_overlay", func(t *testing.T) {
		objs := renderKustomize(t, filepath.Join(root, "deploy/overlays/example"))
		var ns string
		for _, o := range objs {
			if o.Kind == "Namespace" {
				ns = o.Name
			}
		}
		var rest []object
		for _, o := range objs {
			switch o.Kind {
			case "PodMonitor", "PrometheusRule":
				if o.Namespace != ns {
					t.Errorf("%s in %q, want %q", o.Kind, o.Namespace, ns)
				}
			default:
				rest = append(rest, o)
			}
		}
		check(t, rest, ns)
	})
}

// TestPrometheusMetricsReader: deploy/prometheus-metrics-reader grants a Prometheus what the
// chart's metrics reader does, get on /metrics, and binds it to a ServiceAccount.
func TestPrometheusMetricsReader(t *testing.T) {
	k := byKind(t, renderKustomize(t, filepath.Join(root, "deploy/prometheus-metrics-reader")))
	var cr rbacv1.ClusterRole
	var crb rbacv1.ClusterRoleBinding
	k["ClusterRole/metrics-reader"].decodeStrict(t, &cr)
	k["ClusterRoleBinding/metrics-reader"].decodeStrict(t, &crb)
	if !reflect.DeepEqual(cr.Rules, metricsReaderRules) {
		t.Errorf("rules %+v, want %+v", cr.Rules, metricsReaderRules)
	}
	if crb.RoleRef.Name != cr.Name || len(crb.Subjects) != 1 || crb.Subjects[0].Kind != "ServiceAccount" {
		t.Errorf("binding %+v -> %s", crb.Subjects, crb.RoleRef.Name)
	}
}

// writableHostProc lists the pod's writable mounts of the host's /proc: any hostPath at or
// under /proc (or / itself) that a container or init container mounts without readOnly, but
// /proc/sys/net/netfilter, which --conntrack.invalid-reasons writes. A writable host /proc
// reaches every process of the node (/proc/PID/mem, environ, oom_score_adj) and every net.*
// sysctl.
func writableHostProc(pod corev1.PodSpec) []string {
	hostProc := map[string]string{}
	for _, v := range pod.Volumes {
		if v.HostPath == nil {
			continue
		}
		p := path.Clean(v.HostPath.Path)
		if p == "/" || p == "/proc" || strings.HasPrefix(p, "/proc/") {
			hostProc[v.Name] = p
		}
	}
	var out []string
	for _, c := range append(slices.Clone(pod.InitContainers), pod.Containers...) {
		for _, m := range c.VolumeMounts {
			p, ok := hostProc[m.Name]
			if ok && !m.ReadOnly && p != "/proc/sys/net/netfilter" {
				out = append(out, fmt.Sprintf("%s: hostPath %s at %s", c.Name, p, m.MountPath))
			}
		}
	}
	return out
}

// No values file of the chart, every option on included, nor any manifest under deploy/,
// mounts the host's /proc, /proc/sys or /proc/sys/net writable.
func TestNoWritableHostProc(t *testing.T) {
	check := func(t *testing.T, objs []object) {
		t.Helper()
		k := byKind(t, objs)
		var ds appsv1.DaemonSet
		k["DaemonSet"].decodeStrict(t, &ds)
		if w := writableHostProc(ds.Spec.Template.Spec); len(w) > 0 {
			t.Errorf("the host's /proc mounted writable: %q", w)
		}
	}
	for _, f := range ciValues(t) {
		t.Run("chart/"+filepath.Base(f), func(t *testing.T) { check(t, renderChart(t, "proxyhealth", "proxyhealth", f)) })
	}
	for _, dir := range []string{"deploy/base", "deploy/overlays/example"} {
		t.Run(dir, func(t *testing.T) { check(t, renderKustomize(t, filepath.Join(root, dir))) })
	}
	// The check itself finds what it is for.
	for _, p := range []string{"/proc", "/proc/", "/proc/sys", "/proc/sys/net", "/", "/proc/1"} {
		pod := corev1.PodSpec{
			Volumes:    []corev1.Volume{{Name: "v", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: p}}}},
			Containers: []corev1.Container{{Name: "c", VolumeMounts: []corev1.VolumeMount{{Name: "v", MountPath: "/host"}}}},
		}
		if len(writableHostProc(pod)) != 1 {
			t.Errorf("hostPath %s mounted writable not found", p)
		}
		pod.Containers[0].VolumeMounts[0].ReadOnly = true
		if len(writableHostProc(pod)) != 0 {
			t.Errorf("hostPath %s mounted read-only taken for writable", p)
		}
	}
}

// proxyRights lists the rules of roles among objs that grant a proxy subresource (pods/proxy,
// nodes/proxy, services/proxy) or could (a wildcard resource): each reaches a node's or a pod's
// ports from the API server's position, and the exporters use the host's network.
func proxyRights(t *testing.T, objs []object) []string {
	t.Helper()
	var out []string
	for _, o := range objs {
		if o.Kind != "ClusterRole" && o.Kind != "Role" {
			continue
		}
		var role rbacv1.ClusterRole
		o.decodeStrict(t, &role)
		for _, r := range role.Rules {
			for _, res := range r.Resources {
				if res == "*" || strings.HasSuffix(res, "/proxy") || strings.HasSuffix(res, "/*") {
					out = append(out, fmt.Sprintf("%s %s: %s %v", o.Kind, o.Name, res, r.Verbs))
				}
			}
		}
	}
	return out
}

// No role the project ships grants a proxy subresource: the chart with every values file, and
// with all of them at once (every option on), and every manifest under deploy/, rendered and
// as written.
func TestNoProxyRights(t *testing.T) {
	check := func(t *testing.T, objs []object) {
		t.Helper()
		if p := proxyRights(t, objs); len(p) > 0 {
			t.Errorf("proxy rights: %q", p)
		}
	}
	files := ciValues(t)
	for _, f := range files {
		t.Run("chart/"+filepath.Base(f), func(t *testing.T) { check(t, renderChart(t, "proxyhealth", "proxyhealth", f)) })
	}
	t.Run("chart/every values file", func(t *testing.T) {
		// All at once but the one that leaves the RBAC to the cluster (rbac.create false).
		var on []string
		for _, f := range files {
			if filepath.Base(f) != "external-rbac-values.yaml" {
				on = append(on, f)
			}
		}
		objs := renderChart(t, "proxyhealth", "proxyhealth", on...)
		k := byKind(t, objs)
		for _, kind := range []string{"ClusterRole/kubectl-plugin", "Role/node-report", "ClusterRole/node-conditions", "ClusterRole/viewer"} {
			if _, ok := k[kind]; !ok {
				t.Errorf("no %s with every option on", kind)
			}
		}
		check(t, objs)
	})
	for _, dir := range []string{"deploy/base", "deploy/overlays/example", "deploy/prometheus-metrics-reader"} {
		t.Run(dir, func(t *testing.T) { check(t, renderKustomize(t, filepath.Join(root, dir))) })
	}
	// Every file under deploy/ as written, components included.
	var objs []object
	err := filepath.WalkDir(filepath.Join(root, "deploy"), func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".yaml") || filepath.Base(path) == "kustomization.yaml" {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		objs = append(objs, objects(t, b)...)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Run("deploy/ files", func(t *testing.T) { check(t, objs) })
	// The check itself finds what it is for.
	for _, res := range []string{"pods/proxy", "nodes/proxy", "services/proxy", "*", "pods/*"} {
		b := fmt.Sprintf("apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata:\n  name: r\nrules:\n- apiGroups: [\"\"]\n  resources: [%q]\n  verbs: [get]\n", res)
		if len(proxyRights(t, objects(t, []byte(b)))) != 1 {
			t.Errorf("a role granting %s not found", res)
		}
	}
}

// TestChartNodeReportSwitches: nodeReport.admissionPolicy.enabled=false leaves the policy and
// its binding out and keeps the report; nodeReport.enabled=false leaves out the report, its
// Role and the policy.
func TestChartNodeReportSwitches(t *testing.T) {
	for _, tc := range []struct {
		values     string
		report     bool
		policy     bool
		reportRole bool
	}{
		{"nodeReport:\n  admissionPolicy:\n    enabled: false\n", true, false, true},
		{"nodeReport:\n  enabled: false\n", false, false, false},
	} {
		f := filepath.Join(t.TempDir(), "values.yaml")
		if err := os.WriteFile(f, []byte(tc.values), 0o644); err != nil {
			t.Fatal(err)
		}
		k := byKind(t, renderChart(t, "proxyhealth", "proxyhealth", f))
		var ds appsv1.DaemonSet
		k["DaemonSet"].decodeStrict(t, &ds)
		if got := slices.Contains(ds.Spec.Template.Spec.Containers[0].Args, "--node-report"); got != tc.report {
			t.Errorf("%q: --node-report %v, want %v", tc.values, got, tc.report)
		}
		for kind, want := range map[string]bool{
			"ValidatingAdmissionPolicy/node-report": tc.policy, "ValidatingAdmissionPolicyBinding/node-report": tc.policy,
			"Role/node-report": tc.reportRole, "RoleBinding/node-report": tc.reportRole,
		} {
			if _, got := k[kind]; got != want {
				t.Errorf("%q: a %s %v, want %v", tc.values, kind, got, want)
			}
		}
	}
}
