//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"sigs.k8s.io/yaml"
)

// How the kubectl plugin reaches the lab's exporter: the API server's pod proxy dials the pod's
// status.podIP. There is no kubelet, so the test writes the Pod object (spec.nodeName set) and
// then its status (Running, podIP) itself. The apiserver runs in the node namespace and
// refuses to proxy to loopback, so the exporter listens on the node namespace's uplink address
// too (172.18.0.2, the lab node's InternalIP) and the Pod's IP is that address, as for a
// hostNetwork DaemonSet pod. A second exporter pod whose IP is the lab's remote node, where
// nothing listens on the port, is a node whose /status cannot be read.
const (
	exporterNamespace = "monitoring"
	unreachablePodIP  = uplinkC
)

func requirePlugin(t *testing.T) {
	t.Helper()
	requireLab(t)
	if pluginBuildErr != nil {
		t.Fatal(pluginBuildErr)
	}
}

// registerExporterPod writes a Pod for an exporter on node, labelled as the chart's and
// deploy/'s pods are, and sets its status to Running at ip.
func (cp *ControlPlane) registerExporterPod(name, node, ip string, port int) {
	t := cp.t
	t.Helper()
	ctx := context.Background()
	cp.EnsureNamespace(exporterNamespace)
	pods := cp.Client.CoreV1().Pods(exporterNamespace)
	created, err := pods.Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app.kubernetes.io/name": "proxyhealth"}},
		Spec: corev1.PodSpec{
			NodeName:    node,
			HostNetwork: true,
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
// as the deploy README recommends; nothing else.
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
