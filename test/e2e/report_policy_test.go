//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/proxyhealth/proxyhealth/internal/nodereport"
	"github.com/proxyhealth/proxyhealth/internal/testsupport/netnsdial"
	"github.com/proxyhealth/proxyhealth/test/kubelab"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"
)

// reportPolicyExporterPort is where TestNodeReportAdmissionPolicy's exporter listens.
const reportPolicyExporterPort = 19899

// The exporter's ServiceAccount as deploy/ and the chart ship it: in the exporters' namespace,
// with the node report's Role there.
const reportPolicyAccount = "proxyhealth"

// TestNodeReportAdmissionPolicy: deploy/components/node-report's ValidatingAdmissionPolicy and
// binding (the chart renders the same; test/deploy checks that), on the lab's real
// kube-apiserver with the ValidatingAdmissionPolicy plugin on. The exporter runs with a token of
// its ServiceAccount bound to a Pod on the lab's node, as the kubelet mounts it, and writes its
// node's report. With that token, a report for another node, another ConfigMap, a report owned
// by something else than its Node, and deleting another node's report are refused, each with
// the policy's message; a token of the same ServiceAccount that carries no node (bound to no
// Pod) cannot write even its node's report; another user is not held by the policy.
func TestNodeReportAdmissionPolicy(t *testing.T) {
	requireKube(t)
	requireExporter(t)
	l := newLabRules(t, labRawRules)
	cp := StartControlPlane(t, l, ControlPlaneOptions{AdmissionPolicies: true})
	ctx := context.Background()
	ns := exporterNamespace

	// The exporter's account, its read-only API view and the node report's Role, in ns.
	cp.bindClusterRole("proxyhealth-report-policy", []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"services", "nodes"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"get", "list", "watch"}},
	}, ns, reportPolicyAccount)
	cp.grantNodeReportTo(ns, reportPolicyAccount)
	// delete is not the Role's; granted here so that the policy's answer to a delete is seen.
	cp.grantRole("proxyhealth-report-policy-delete", ns, reportPolicyAccount,
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"delete"}})
	cp.applyReportPolicy()

	// The exporter's Pod, on the lab's node (no kubelet: the object is enough for a bound token).
	pod, err := cp.Client.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "proxyhealth-policy", Labels: map[string]string{"app.kubernetes.io/name": "proxyhealth"}},
		Spec: corev1.PodSpec{
			NodeName:           labNodeName,
			ServiceAccountName: reportPolicyAccount,
			HostNetwork:        true,
			Containers:         []corev1.Container{{Name: "proxyhealth", Image: "ghcr.io/proxyhealth/proxyhealth:latest"}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating the exporter's pod: %v", err)
	}
	podToken := cp.requestToken(ns, reportPolicyAccount, &authenticationv1.BoundObjectReference{
		Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID})
	unboundToken := cp.requestToken(ns, reportPolicyAccount, nil)
	asExporter := cp.tokenClient(t, podToken)
	asUnbound := cp.tokenClient(t, unboundToken)

	// The apiserver loads a new policy within a few seconds: until it refuses a ConfigMap not
	// the exporter's own report, it is not in force yet.
	waitFor(t, 60*time.Second, "the node report's policy in force", func() (bool, string) {
		_, err := asExporter.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: "policy-probe", Namespace: ns}}, metav1.CreateOptions{})
		if err == nil {
			if err := cp.Client.CoreV1().ConfigMaps(ns).Delete(ctx, "policy-probe", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			return false, "a ConfigMap policy-probe was created"
		}
		return strings.Contains(err.Error(), "ValidatingAdmissionPolicy"), err.Error()
	})

	// What the API server makes of the pod-bound token: the node is in the user's extra.
	review, err := cp.Client.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
		Spec: authenticationv1.TokenReviewSpec{Token: podToken}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node, err := cp.Client.CoreV1().Nodes().Get(ctx, labNodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	extra := review.Status.User.Extra
	t.Logf("the pod-bound token: user %s, extra %v", review.Status.User.Username, extra)
	if got := extra["authentication.kubernetes.io/node-name"]; len(got) != 1 || got[0] != labNodeName {
		t.Fatalf("the pod-bound token's extra node-name is %q, want [%s] (ServiceAccountTokenPodNodeInfo): %+v", got, labNodeName, review.Status)
	}
	if got := extra["authentication.kubernetes.io/node-uid"]; len(got) != 1 || got[0] != string(node.UID) {
		t.Errorf("the pod-bound token's extra node-uid is %q, want [%s]", got, node.UID)
	}

	// The exporter, with the pod-bound token, writes its own node's report.
	kubeconfig := filepath.Join(cp.Dir, "report-policy.kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(kubelab.KubeconfigYAML(apiserverAddr, reportPolicyAccount, podToken)), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := uplinkN + ":" + strconv.Itoa(reportPolicyExporterPort)
	exporter := l.Start(l.Node, "proxyhealth-report-policy", append([]string{exporterBin, "--web.listen-address=" + addr},
		append(append(driftExporterArgs(kubeconfig), kubeProxyExporterArgs(cp)...), nodeReportArgs()...)...)...)
	own := nodereport.Name(labNodeName)
	waitFor(t, 60*time.Second, "the exporter's report "+ns+"/"+own, func() (bool, string) {
		if exporter.Exited() {
			b, _ := os.ReadFile(exporter.log)
			t.Fatalf("the exporter exited:\n%s", b)
		}
		cm, err := cp.Client.CoreV1().ConfigMaps(ns).Get(ctx, own, metav1.GetOptions{})
		if err != nil {
			b, _ := os.ReadFile(exporter.log)
			return false, fmt.Sprintf("%v\n%s", err, lastLines(string(b), 20))
		}
		return cm.Data[nodereport.KeyStatus] != "", fmt.Sprint(cm.Data)
	})
	if b, _ := os.ReadFile(exporter.log); bytes.Contains(b, []byte("denied request")) {
		t.Errorf("the policy refused one of the exporter's writes:\n%s", grepLines(string(b), "denied request"))
	}

	other := "other-node"
	otherReport := nodereport.Name(other)
	report := func(name, ownerNode string, ownerUID string) *corev1.ConfigMap {
		return &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: ownerNode, UID: types.UID(ownerUID)}}},
			Data: map[string]string{nodereport.KeyStatus: `{"node":"` + ownerNode + `"}`},
		}
	}
	// Another node's report, as the cluster admin wrote it: the exporter must not delete it.
	if _, err := cp.Client.CoreV1().ConfigMaps(ns).Create(ctx, report(otherReport, other, "00000000-0000-0000-0000-000000000001"), metav1.CreateOptions{}); err != nil {
		t.Fatalf("the admin, not held by the policy, creating %s: %v", otherReport, err)
	}
	if _, err := cp.Client.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "grafana-dashboards", Namespace: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("the admin, not held by the policy, creating a ConfigMap: %v", err)
	}

	ownCurrent, err := cp.Client.CoreV1().ConfigMaps(ns).Get(ctx, own, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Unconditional updates, as the exporter's, which keeps writing meanwhile.
	ownCurrent.ResourceVersion = ""
	foreignOwner := ownCurrent.DeepCopy()
	foreignOwner.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Namespace", Name: ns, UID: "00000000-0000-0000-0000-000000000002"}}
	for _, tc := range []struct {
		what    string
		write   func() error
		message string // "" when allowed
	}{
		{"the exporter updating its own report", func() error {
			_, err := asExporter.CoreV1().ConfigMaps(ns).Update(ctx, ownCurrent, metav1.UpdateOptions{})
			return err
		}, ""},
		{"the exporter creating another node's report", func() error {
			_, err := asExporter.CoreV1().ConfigMaps(ns).Create(ctx, report(nodereport.Name("third-node"), "third-node", string(node.UID)), metav1.CreateOptions{})
			return err
		}, "may write ConfigMap " + own + " (its node report) only, not " + nodereport.Name("third-node")},
		{"the exporter overwriting another node's report", func() error {
			_, err := asExporter.CoreV1().ConfigMaps(ns).Update(ctx, report(otherReport, labNodeName, string(node.UID)), metav1.UpdateOptions{})
			return err
		}, "only, not " + otherReport},
		{"the exporter overwriting another ConfigMap", func() error {
			_, err := asExporter.CoreV1().ConfigMaps(ns).Update(ctx, &corev1.ConfigMap{
				ObjectMeta: metav1.ObjectMeta{Name: "grafana-dashboards", Namespace: ns}, Data: map[string]string{"x": "y"}}, metav1.UpdateOptions{})
			return err
		}, "only, not grafana-dashboards"},
		{"the exporter creating another ConfigMap", func() error {
			_, err := asExporter.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{
				ObjectMeta: metav1.ObjectMeta{Name: "settings", Namespace: ns}}, metav1.CreateOptions{})
			return err
		}, "only, not settings"},
		{"the exporter deleting another node's report", func() error {
			return asExporter.CoreV1().ConfigMaps(ns).Delete(ctx, otherReport, metav1.DeleteOptions{})
		}, "only, not " + otherReport},
		{"the exporter making its report owned by something else than its Node", func() error {
			_, err := asExporter.CoreV1().ConfigMaps(ns).Update(ctx, foreignOwner, metav1.UpdateOptions{})
			return err
		}, "must make its report owned by its Node, and by nothing else"},
		{"the exporter making its report owned by a Node of another UID", func() error {
			_, err := asExporter.CoreV1().ConfigMaps(ns).Update(ctx, report(own, labNodeName, "00000000-0000-0000-0000-000000000003"), metav1.UpdateOptions{})
			return err
		}, "must make its report owned by its Node, and by nothing else"},
		{"a token bound to no pod writing the node's report", func() error {
			_, err := asUnbound.CoreV1().ConfigMaps(ns).Update(ctx, ownCurrent, metav1.UpdateOptions{})
			return err
		}, "carries no node name"},
		{"the admin updating another ConfigMap", func() error {
			_, err := cp.Client.CoreV1().ConfigMaps(ns).Update(ctx, &corev1.ConfigMap{
				ObjectMeta: metav1.ObjectMeta{Name: "grafana-dashboards", Namespace: ns}, Data: map[string]string{"x": "admin"}}, metav1.UpdateOptions{})
			return err
		}, ""},
	} {
		err := tc.write()
		switch {
		case tc.message == "" && err != nil:
			t.Errorf("%s: %v, want it allowed", tc.what, err)
		case tc.message != "" && err == nil:
			t.Errorf("%s: allowed, want it refused by the policy (%q)", tc.what, tc.message)
		case tc.message != "" && (!apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "ValidatingAdmissionPolicy") || !strings.Contains(err.Error(), tc.message)):
			t.Errorf("%s: %v, want the policy's refusal %q", tc.what, err, tc.message)
		case err != nil:
			t.Logf("%s: refused: %v", tc.what, err)
		default:
			t.Logf("%s: allowed", tc.what)
		}
	}
	if cm, err := cp.Client.CoreV1().ConfigMaps(ns).Get(ctx, otherReport, metav1.GetOptions{}); err != nil || cm.OwnerReferences[0].Name != other {
		t.Errorf("another node's report after the exporter's tries: %v %+v", err, cm)
	}
	if b, _ := os.ReadFile(exporter.log); bytes.Contains(b, []byte("denied request")) {
		t.Errorf("the policy refused one of the exporter's own writes:\n%s", grepLines(string(b), "denied request"))
	}
}

// grantNodeReportTo creates deploy/components/node-report's Role and RoleBinding in ns, as
// kustomize renders them there, bound to ServiceAccount ns/sa.
func (cp *ControlPlane) grantNodeReportTo(ns, sa string) {
	t := cp.t
	t.Helper()
	var role rbacv1.Role
	var binding rbacv1.RoleBinding
	for file, into := range map[string]any{"role.yaml": &role, "rolebinding.yaml": &binding} {
		if err := yaml.UnmarshalStrict(readRepoFile(t, "deploy/components/node-report/"+file), into); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
	}
	cp.EnsureNamespace(ns)
	role.Namespace, binding.Namespace = ns, ns
	binding.Subjects = []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: sa}}
	ctx := context.Background()
	if _, err := cp.Client.RbacV1().Roles(ns).Create(ctx, &role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cp.Client.RbacV1().RoleBindings(ns).Create(ctx, &binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// grantRole creates Role ns/name with rule, bound to ServiceAccount ns/sa.
func (cp *ControlPlane) grantRole(name, ns, sa string, rule rbacv1.PolicyRule) {
	t := cp.t
	t.Helper()
	ctx := context.Background()
	if _, err := cp.Client.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: []rbacv1.PolicyRule{rule}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cp.Client.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: sa}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// applyReportPolicy creates deploy/components/node-report/admission-policy.yaml's
// ValidatingAdmissionPolicy and binding as written. (The lab runs no controller-manager, whose
// controller type-checks a policy into its status: the refusals below are what show it works.)
func (cp *ControlPlane) applyReportPolicy() {
	t := cp.t
	t.Helper()
	const file = "deploy/components/node-report/admission-policy.yaml"
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(readRepoFile(t, file)), 4096)
	var policy *admissionregistrationv1.ValidatingAdmissionPolicy
	var binding *admissionregistrationv1.ValidatingAdmissionPolicyBinding
	for {
		var doc map[string]any
		if err := dec.Decode(&doc); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			t.Fatalf("%s: %v", file, err)
		}
		raw, err := yaml.Marshal(doc)
		if err != nil {
			t.Fatal(err)
		}
		switch doc["kind"] {
		case "ValidatingAdmissionPolicy":
			policy = &admissionregistrationv1.ValidatingAdmissionPolicy{}
			err = yaml.UnmarshalStrict(raw, policy)
		case "ValidatingAdmissionPolicyBinding":
			binding = &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
			err = yaml.UnmarshalStrict(raw, binding)
		default:
			t.Fatalf("%s: unexpected kind %v", file, doc["kind"])
		}
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
	}
	if policy == nil || binding == nil {
		t.Fatalf("%s: want a ValidatingAdmissionPolicy and its binding", file)
	}
	ctx := context.Background()
	api := cp.Client.AdmissionregistrationV1()
	if _, err := api.ValidatingAdmissionPolicies().Create(ctx, policy, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating %s's policy: %v", file, err)
	}
	if _, err := api.ValidatingAdmissionPolicyBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating %s's binding: %v", file, err)
	}
}

// requestToken is a new token of ServiceAccount ns/sa (TokenRequest), bound to bound if set.
func (cp *ControlPlane) requestToken(ns, sa string, bound *authenticationv1.BoundObjectReference) string {
	t := cp.t
	t.Helper()
	tok, err := cp.Client.CoreV1().ServiceAccounts(ns).CreateToken(context.Background(), sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptrTo(int64(3600)), BoundObjectRef: bound},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("requesting a token for %s/%s: %v", ns, sa, err)
	}
	return tok.Status.Token
}

// tokenClient is a client of the lab's apiserver with token, from the test process.
func (cp *ControlPlane) tokenClient(t *testing.T, token string) kubernetes.Interface {
	t.Helper()
	c, err := kubernetes.NewForConfig(&rest.Config{
		Host:            "https://" + apiserverAddr,
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{Insecure: true},
		Dial:            netnsdial.Dialer(cp.Lab.Node),
		Timeout:         10 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// readRepoFile reads a file of the repository.
func readRepoFile(t *testing.T, file string) []byte {
	t.Helper()
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, file))
	if err != nil {
		t.Fatal(err)
	}
	return b
}
