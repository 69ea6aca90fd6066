//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/proxyhealth/proxyhealth/internal/testsupport/netnsdial"
	"github.com/proxyhealth/proxyhealth/test/kubelab"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"sigs.k8s.io/yaml"
)

// What the kubectl plugin reads: the node reports the lab's exporters write (--node-report) in
// the exporters' namespace, and the exporter pods there. There is no kubelet, so the test
// writes the Pod objects (spec.nodeName set) and their status (Running) itself. A second
// exporter pod on the lab's remote node, where no exporter runs, is a node without a report.
const (
	exporterNamespace = "monitoring"
	unreachablePodIP  = uplinkC
)

// nodeReportArgs are the exporter's flags for its node's report in the exporters' namespace,
// with the intervals cut so that a change reaches the report within seconds.
func nodeReportArgs() []string {
	return []string{"--node-report", "--node-report.namespace=" + exporterNamespace,
		"--node-report.min-interval=2s", "--node-report.heartbeat-interval=30s"}
}

func requirePlugin(t *testing.T) {
	t.Helper()
	requireLab(t)
	if pluginBuildErr != nil {
		t.Fatal(pluginBuildErr)
	}
}

// registerExporterPod writes a Pod for an exporter on node, labelled as the chart's and
// deploy/'s pods are, running as the exporter's ServiceAccount (a token can be bound to it),
// and sets its status to Running at ip.
func (cp *ControlPlane) registerExporterPod(name, node, ip string, port int) {
	t := cp.t
	t.Helper()
	ctx := context.Background()
	cp.EnsureNamespace(exporterNamespace)
	pods := cp.Client.CoreV1().Pods(exporterNamespace)
	created, err := pods.Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app.kubernetes.io/name": "proxyhealth"}},
		Spec: corev1.PodSpec{
			NodeName:           node,
			ServiceAccountName: reportPolicyAccount,
			HostNetwork:        true,
			Containers: []corev1.Container{{Name: "proxyhealth", Image: "ghcr.io/proxyhealth/proxyhealth:latest",
				Ports: []corev1.ContainerPort{{Name: "metrics", ContainerPort: int32(port), Protocol: corev1.ProtocolTCP}}}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating pod %s: %v", name, err)
	}
	created.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}, HostIP: ip,
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	if _, err := pods.UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("setting pod %s's status: %v", name, err)
	}
}

// shippedClusterRole reads a ClusterRole of deploy/ and creates it in the lab's apiserver.
func (cp *ControlPlane) shippedClusterRole(file string) *rbacv1.ClusterRole {
	t := cp.t
	t.Helper()
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, file))
	if err != nil {
		t.Fatal(err)
	}
	var role rbacv1.ClusterRole
	if err := yaml.UnmarshalStrict(b, &role); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	if _, err := cp.Client.RbacV1().ClusterRoles().Create(context.Background(), &role, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating %s's ClusterRole: %v", file, err)
	}
	return &role
}

// grantNodeReport creates deploy/components/node-report's Role and RoleBinding in the exporters'
// namespace, as kustomize renders them there, for the lab exporter's ServiceAccount
// (readOnlyKubeconfig's, in kube-system).
func (cp *ControlPlane) grantNodeReport() {
	t := cp.t
	t.Helper()
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	var role rbacv1.Role
	var binding rbacv1.RoleBinding
	for file, into := range map[string]any{"role.yaml": &role, "rolebinding.yaml": &binding} {
		b, err := os.ReadFile(filepath.Join(root, "deploy/components/node-report", file))
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.UnmarshalStrict(b, into); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
	}
	cp.EnsureNamespace(exporterNamespace)
	role.Namespace, binding.Namespace = exporterNamespace, exporterNamespace
	binding.Subjects = []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: "kube-system", Name: "proxyhealth"}}
	ctx := context.Background()
	if _, err := cp.Client.RbacV1().Roles(exporterNamespace).Create(ctx, &role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cp.Client.RbacV1().RoleBindings(exporterNamespace).Create(ctx, &binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// checkNoProxyRights asks the API server (SubjectAccessReview) whether the on-call user and
// the lab exporter's ServiceAccount may use any proxy subresource: neither may.
func (cp *ControlPlane) checkNoProxyRights() {
	t := cp.t
	t.Helper()
	for _, user := range []string{"system:serviceaccount:" + exporterNamespace + ":oncall", "system:serviceaccount:kube-system:proxyhealth",
		"system:serviceaccount:" + exporterNamespace + ":" + reportPolicyAccount} {
		for _, res := range []struct{ resource, namespace string }{{"pods", exporterNamespace}, {"nodes", ""}, {"services", exporterNamespace}, {"services", "default"}} {
			sar, err := cp.Client.AuthorizationV1().SubjectAccessReviews().Create(context.Background(), &authorizationv1.SubjectAccessReview{
				Spec: authorizationv1.SubjectAccessReviewSpec{User: user, Groups: []string{"system:serviceaccounts", "system:authenticated"},
					ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "get", Resource: res.resource, Subresource: "proxy", Namespace: res.namespace}},
			}, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if sar.Status.Allowed {
				t.Errorf("%s may get %s/proxy in %q", user, res.resource, res.namespace)
			}
		}
	}
}

// grantNodeConditions binds deploy/components/node-conditions' ClusterRole to the exporter's
// ServiceAccount (readOnlyKubeconfig's).
func (cp *ControlPlane) grantNodeConditions() {
	t := cp.t
	t.Helper()
	role := cp.shippedClusterRole("deploy/components/node-conditions/clusterrole.yaml")
	if _, err := cp.Client.RbacV1().ClusterRoleBindings().Create(context.Background(), &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role.Name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: "kube-system", Name: "proxyhealth"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// pluginKubeconfig is an on-call engineer's kubeconfig: a ServiceAccount bound to
// deploy/components/kubectl-plugin's ClusterRole by a RoleBinding in the exporters' namespace,
// as the deploy README says; nothing else.
func (cp *ControlPlane) pluginKubeconfig() string {
	t := cp.t
	t.Helper()
	ctx := context.Background()
	role := cp.shippedClusterRole("deploy/components/kubectl-plugin/clusterrole.yaml")
	cp.EnsureNamespace(exporterNamespace)
	if _, err := cp.Client.CoreV1().ServiceAccounts(exporterNamespace).Create(ctx, &corev1.ServiceAccount{
		ObjectMeta: metav1.ObjectMeta{Name: "oncall"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cp.Client.RbacV1().RoleBindings(exporterNamespace).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "proxyhealth-oncall"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: exporterNamespace, Name: "oncall"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return cp.tokenKubeconfig(t, exporterNamespace, "oncall", "oncall.kubeconfig", apiserverAddr)
}

// pluginRun runs kubectl-proxyhealth -n monitoring (in the node namespace, where the apiserver
// listens) and returns its stdout, stderr and exit code.
func pluginRun(t *testing.T, cp *ControlPlane, kubeconfig string, args ...string) (string, string, int) {
	t.Helper()
	return pluginRunIn(t, cp, kubeconfig, append([]string{"-n", exporterNamespace}, args...)...)
}

// pluginRunIn runs kubectl-proxyhealth with args alone.
func pluginRunIn(t *testing.T, cp *ControlPlane, kubeconfig string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command("ip", append([]string{"netns", "exec", cp.Lab.Node, pluginBin, "--kubeconfig=" + kubeconfig}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		return stdout.String(), stderr.String(), exit.ExitCode()
	case err != nil:
		t.Fatalf("kubectl-proxyhealth: %v\n%s", err, stderr.String())
	}
	return stdout.String(), stderr.String(), 0
}

// pluginNodes is `kubectl proxyhealth -o json`, as a client reads it.
type pluginNodes struct {
	Nodes []struct {
		Node         string   `json:"node"`
		Pod          string   `json:"pod"`
		Verdict      string   `json:"verdict"`
		Causes       []string `json:"causes"`
		WorstService *struct {
			Namespace string `json:"namespace"`
			Name      string `json:"name"`
			Port      int    `json:"port"`
		} `json:"worst_service"`
		Error string `json:"error"`
	} `json:"nodes"`
}

func parsePluginJSON(t *testing.T, out string, into any) {
	t.Helper()
	if err := json.Unmarshal([]byte(out), into); err != nil {
		t.Fatalf("kubectl-proxyhealth -o json: %v\n%s", err, out)
	}
}

// nodeCondition reads the lab node's ProxyHealthy condition through the API (nil when unset).
func (cp *ControlPlane) nodeCondition() *corev1.NodeCondition {
	cp.t.Helper()
	n, err := cp.Client.CoreV1().Nodes().Get(context.Background(), labNodeName, metav1.GetOptions{})
	if err != nil {
		cp.t.Fatal(err)
	}
	for _, c := range n.Status.Conditions {
		if c.Type == "ProxyHealthy" {
			return &c
		}
	}
	return nil
}

// eventsAbout lists proxyhealth's Events on an object (kube-proxy has its own on the Node).
func (cp *ControlPlane) eventsAbout(namespace, kind, name string) []corev1.Event {
	cp.t.Helper()
	list, err := cp.Client.CoreV1().Events(namespace).List(context.Background(), metav1.ListOptions{
		FieldSelector: fields.Set{"involvedObject.kind": kind, "involvedObject.name": name, "source": "proxyhealth"}.String(),
	})
	if err != nil {
		cp.t.Fatal(err)
	}
	return list.Items
}

func describeCondition(c *corev1.NodeCondition) string {
	if c == nil {
		return "no ProxyHealthy condition"
	}
	return string(c.Status) + " " + c.Reason + " " + strconv.Quote(c.Message) + " transition " + c.LastTransitionTime.UTC().String()
}

// pluginAuthExporterPort is where TestPluginKubernetesAuth's exporter listens.
const pluginAuthExporterPort = 19897

// shippedViewer creates deploy/components/kubernetes-auth's viewer in the exporters' namespace:
// its ServiceAccount, and its ClusterRole bound to it, as kustomize renders them there.
func (cp *ControlPlane) shippedViewer() string {
	t := cp.t
	t.Helper()
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	read := func(file string, into any) {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(root, "deploy/components/kubernetes-auth", file))
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.UnmarshalStrict(b, into); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
	}
	var sa corev1.ServiceAccount
	var binding rbacv1.ClusterRoleBinding
	read("viewer-serviceaccount.yaml", &sa)
	read("viewer-clusterrolebinding.yaml", &binding)
	cp.shippedClusterRole("deploy/components/kubernetes-auth/viewer-clusterrole.yaml")
	ctx := context.Background()
	cp.EnsureNamespace(exporterNamespace)
	if _, err := cp.Client.CoreV1().ServiceAccounts(exporterNamespace).Create(ctx, &sa, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for i := range binding.Subjects {
		binding.Subjects[i].Namespace = exporterNamespace // kustomize's namespace transformer
	}
	if _, err := cp.Client.RbacV1().ClusterRoleBindings().Create(ctx, &binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return sa.Name
}

// TestPluginKubernetesAuth: with --web.kubernetes-auth, as deploy/components/kubernetes-auth
// runs the exporter, and the exporter writing its node's report with
// deploy/components/node-report's Role and held by its admission policy (a token bound to its
// Pod, the ValidatingAdmissionPolicy plugin on), `kubectl proxyhealth` run by a cluster admin (a static
// token in system:masters) and by an on-call user with only deploy/components/kubectl-plugin's
// ClusterRole, bound in the exporters' namespace, names the node's stale rules (incident 3,
// kube-proxy black-holed) and exits 2; with --service it gives the stale and missing endpoints,
// and with --node the finding's evidence. Neither the on-call user nor the exporter may use any
// proxy subresource, the plugin mints no token, and the exporter is never asked by it. The
// audiences the component sets let in a token for the API server (a Prometheus's) and one for
// proxyhealth, not others.
func TestPluginKubernetesAuth(t *testing.T) {
	requireKube(t)
	requireExporter(t)
	requirePlugin(t)
	l := newLabRules(t, labRawRules)
	cp := StartControlPlane(t, l, ControlPlaneOptions{AdmissionPolicies: true})
	// The exporter as shipped: its ServiceAccount in the exporters' namespace with its read-only
	// view, scrape auth's reviews and the node report's Role, held by the node report's admission
	// policy, with a token bound to its Pod on the lab's node, as the kubelet mounts it.
	cp.bindClusterRole("proxyhealth-plugin-auth", []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"services", "nodes"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"authentication.k8s.io"}, Resources: []string{"tokenreviews"}, Verbs: []string{"create"}},
		{APIGroups: []string{"authorization.k8s.io"}, Resources: []string{"subjectaccessreviews"}, Verbs: []string{"create"}},
	}, exporterNamespace, reportPolicyAccount)
	viewer := cp.shippedViewer()
	oncall := cp.pluginKubeconfig()
	cp.grantNodeReportTo(exporterNamespace, reportPolicyAccount)
	cp.applyReportPolicy()
	cp.checkNoProxyRights()
	cp.registerExporterPod("proxyhealth-lab", labNodeName, uplinkN, pluginAuthExporterPort)
	pod, err := cp.Client.CoreV1().Pods(exporterNamespace).Get(context.Background(), "proxyhealth-lab", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(cp.Dir, "proxyhealth.kubeconfig")
	token := cp.requestToken(exporterNamespace, reportPolicyAccount, &authenticationv1.BoundObjectReference{
		Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID})
	if err := os.WriteFile(kubeconfig, []byte(kubelab.KubeconfigYAML(apiserverAddr, reportPolicyAccount, token)), 0o600); err != nil {
		t.Fatal(err)
	}

	addr := uplinkN + ":" + strconv.Itoa(pluginAuthExporterPort)
	exporter := l.Start(l.Node, "proxyhealth-plugin-auth", append([]string{exporterBin, "--web.listen-address=" + addr,
		"--web.kubernetes-auth", "--web.kubernetes-auth.audience=proxyhealth", "--web.kubernetes-auth.audience=kube-apiserver"},
		append(append(driftExporterArgs(kubeconfig), kubeProxyExporterArgs(cp)...), nodeReportArgs()...)...)...)
	exporterLog := func() string {
		b, _ := os.ReadFile(exporter.log)
		return string(b)
	}

	const ns, name = "lab", "backend"
	cp.CreateService(httpService(ns, name, "10.96.0.50", nil))
	oldEps, oldAddrs := remoteEndpoints(3, 1, 10)
	cp.ApplySlice(EndpointSlice(ns, name, name+"-1", httpSlicePorts, oldEps))
	cp.WaitServicePortEndpoints(30*time.Second, ns+"/"+name+":http", "tcp", oldAddrs)

	healthy := regexp.MustCompile(`(?m)^lab-node\s+healthy\s+-\s+-$`)
	waitFor(t, 60*time.Second, "kubectl proxyhealth by the on-call user: lab-node healthy", func() (bool, string) {
		if exporter.Exited() {
			t.Fatalf("the exporter exited:\n%s", exporterLog())
		}
		out, perr, code := pluginRun(t, cp, oncall)
		return code == 0 && healthy.MatchString(out), fmt.Sprintf("exit %d\n%s%s", code, out, perr)
	})
	if log := exporterLog(); !strings.Contains(log, "accepting tokens for these audiences only") || !strings.Contains(log, "https://kubernetes.default.svc.cluster.local") {
		t.Errorf("the exporter did not log the API server's audience it accepts:\n%s", log)
	}
	// The audiences as the real API server reviews them: a token for the API server (what a
	// Prometheus's ServiceAccount token is) passes, in either header, and so does one for
	// proxyhealth; one for another audience does not.
	client := &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{DialContext: netnsdial.Dialer(l.Node)}}
	for _, tc := range []struct {
		what, header string
		audiences    []string
		want         int
	}{
		{"the API server's audience, in Authorization", "Authorization", nil, http.StatusOK},
		{"the API server's audience, in X-Proxyhealth-Token", "X-Proxyhealth-Token", nil, http.StatusOK},
		{"audience proxyhealth", "X-Proxyhealth-Token", []string{"proxyhealth"}, http.StatusOK},
		{"audience vault", "X-Proxyhealth-Token", []string{"vault"}, http.StatusUnauthorized},
	} {
		tok, err := cp.Client.CoreV1().ServiceAccounts(exporterNamespace).CreateToken(context.Background(), viewer, &authenticationv1.TokenRequest{
			Spec: authenticationv1.TokenRequestSpec{Audiences: tc.audiences, ExpirationSeconds: ptrTo(int64(600))},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		req, err := http.NewRequest(http.MethodGet, "http://"+addr+"/status", nil)
		if err != nil {
			t.Fatal(err)
		}
		value := tok.Status.Token
		if tc.header == "Authorization" {
			value = "Bearer " + value
		}
		req.Header.Set(tc.header, value)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("GET /status with the viewer's token for %s: %d, want %d", tc.what, resp.StatusCode, tc.want)
		}
	}

	// Incident 3: kube-proxy's connection black-holed, the API moves on.
	t.Logf("kube-proxy's fault proxy: %s", cp.Blackhole())
	t.Cleanup(func() { cp.Heal() })
	newEps, _ := remoteEndpoints(3, 3, 13)
	cp.ApplySlice(EndpointSlice(ns, name, name+"-1", httpSlicePorts, newEps))
	stale := regexp.MustCompile(`(?m)^lab-node\s+critical\s+stale_rules\s+lab/backend:http \(80/tcp\)$`)
	waitFor(t, 90*time.Second, "kubectl proxyhealth by the on-call user: lab-node critical, stale_rules", func() (bool, string) {
		out, perr, code := pluginRun(t, cp, oncall)
		return code == 2 && stale.MatchString(out), fmt.Sprintf("exit %d\n%s%s", code, out, perr)
	})
	out, perr, code := pluginRun(t, cp, oncall)
	t.Logf("kubectl proxyhealth by the on-call user during the incident:\n%s", out)
	if code != 2 || !stale.MatchString(out) {
		t.Errorf("kubectl proxyhealth by the on-call user: exit %d, want 2\n%s%s", code, out, perr)
	}
	if out, perr, code := pluginRun(t, cp, cp.AdminKubeconfig); code != 2 || !stale.MatchString(out) {
		t.Errorf("kubectl proxyhealth by the cluster admin: exit %d, want 2\n%s%s", code, out, perr)
	}
	var bySvc struct {
		Nodes []struct {
			Node       string `json:"node"`
			StaleRules []struct {
				Missing []string `json:"missing"`
				Stale   []string `json:"stale"`
			} `json:"stale_rules"`
		} `json:"nodes"`
	}
	out, perr, code = pluginRun(t, cp, oncall, "--service="+ns+"/"+name, "-o", "json")
	parsePluginJSON(t, out, &bySvc)
	if code != 2 || len(bySvc.Nodes) != 1 || len(bySvc.Nodes[0].StaleRules) != 1 ||
		!slices.Equal(bySvc.Nodes[0].StaleRules[0].Stale, []string{"10.244.3.1:8080", "10.244.3.2:8080"}) ||
		!slices.Equal(bySvc.Nodes[0].StaleRules[0].Missing, []string{"10.244.3.11:8080", "10.244.3.12:8080", "10.244.3.13:8080"}) {
		t.Errorf("kubectl proxyhealth --service by the on-call user: exit %d\n%s%s", code, out, perr)
	}
	out, perr, code = pluginRun(t, cp, oncall, "--node="+labNodeName)
	for _, want := range []string{"CRITICAL stale_rules lab/backend:http (80/tcp)", "    stale: 10.244.3.1:8080, 10.244.3.2:8080",
		"    missing: 10.244.3.11:8080, 10.244.3.12:8080, 10.244.3.13:8080"} {
		if code != 2 || !strings.Contains(out, want) {
			t.Errorf("kubectl proxyhealth --node=%s by the on-call user: exit %d, want 2 and %q\n%s%s", labNodeName, code, want, out, perr)
		}
	}
	t.Logf("kubectl proxyhealth --node=%s:\n%s", labNodeName, out)
	// The report as stored, for BENCHMARKS.md's estimate of the writes.
	cm, err := cp.Client.CoreV1().ConfigMaps(exporterNamespace).Get(context.Background(), "proxyhealth-node-"+labNodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if raw, err := json.Marshal(cm); err == nil {
		t.Logf("the node report during the incident: status.json %d bytes, the ConfigMap %d bytes as JSON, owner %+v",
			len(cm.Data["status.json"]), len(raw), cm.OwnerReferences)
	}
	if len(cm.OwnerReferences) != 1 || cm.OwnerReferences[0].Kind != "Node" || cm.OwnerReferences[0].Name != labNodeName {
		t.Errorf("the report's owner: %+v, want Node %s", cm.OwnerReferences, labNodeName)
	}
	// No review went unanswered or was throttled, and every write of the report succeeded.
	if log := exporterLog(); strings.Contains(log, "does not answer") || strings.Contains(log, "throttled") || strings.Contains(log, "cannot write the node's report") {
		t.Errorf("the exporter's log:\n%s", log)
	}
}
