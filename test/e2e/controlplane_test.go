//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

var updateFixtures = flag.Bool("update-fixtures", false,
	"TestControlPlane: write kube-proxy's real rules into testdata/kube-proxy-<version>/")

// TestControlPlane proves the control-plane lab on its own: a real kube-proxy programs what the
// test writes into a real kube-apiserver, and incident 3 of docs/design.md reproduces: with its API
// connection black-holed, kube-proxy keeps the old endpoints while the API has new ones, and
// converges once the connection heals.
func TestControlPlane(t *testing.T) {
	requireKube(t)
	l := newLabRules(t, labRawRules)
	start := time.Now()
	cp := StartControlPlane(t, l, ControlPlaneOptions{})
	t.Logf("control plane with kube-proxy up in %s", time.Since(start).Round(time.Millisecond))

	const ns, name, portName = "lab", "backend", "lab/backend:http"
	cp.CreateService(&corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.50", Ports: []corev1.ServicePort{
			{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP},
		}},
	})
	backend := func(from, to int) ([]LabEndpoint, []string) {
		var eps []LabEndpoint
		var addrs []string
		for i := from; i <= to; i++ {
			ip := fmt.Sprintf("10.244.3.%d", i)
			eps = append(eps, LabEndpoint{IP: ip, NodeName: "node-b", Zone: "zone-b"})
			addrs = append(addrs, ip+":8080")
		}
		return eps, addrs
	}
	ports := []discoveryv1.EndpointPort{SlicePort("http", corev1.ProtocolTCP, 8080)}
	oldEps, oldAddrs := backend(1, 10)
	cp.ApplySlice(EndpointSlice(ns, name, name+"-1", ports, oldEps))
	programmed := time.Now()
	cp.WaitServicePortEndpoints(30*time.Second, portName, "tcp", oldAddrs)
	t.Logf("%s programmed with 10 endpoints %s after the slice was written", portName, time.Since(programmed).Round(time.Millisecond))

	// Incident 3: kube-proxy's connection goes dead while the apiserver stays up.
	logBefore := len(cp.KubeProxyLog())
	t.Logf("fault proxy: %s", cp.Blackhole())
	blackholed := time.Now()
	newEps, newAddrs := backend(3, 13) // 1 and 2 deleted, 11..13 added: 11 endpoints
	cp.ApplySlice(EndpointSlice(ns, name, name+"-1", ports, newEps))
	got, err := cp.Client.DiscoveryV1().EndpointSlices(ns).Get(context.Background(), name+"-1", metav1.GetOptions{})
	if err != nil || len(got.Endpoints) != 11 {
		t.Fatalf("the API should hold the new slice with 11 endpoints: %v", err)
	}
	var lost string
	waitFor(t, 90*time.Second, "kube-proxy's log to report its lost connection", func() (bool, string) {
		log := cp.KubeProxyLog()[logBefore:]
		for _, line := range strings.Split(log, "\n") {
			if strings.Contains(line, "watch ended with error") && strings.Contains(line, "http2: client connection lost") {
				lost = line
				return true, ""
			}
		}
		return false, lastLines(log, 5)
	})
	t.Logf("kube-proxy noticed the dead connection %s after the black-hole: %s", time.Since(blackholed).Round(time.Millisecond), lost)
	nat := cp.IptablesSave("nat")
	if eps, found := ServicePortEndpoints(nat, portName, "tcp"); !found || !equalStrings(eps, sortedCopy(oldAddrs)) {
		t.Fatalf("while black-holed the rules should keep the old 10 endpoints, got found=%v %v", found, eps)
	}
	// Its own health check does not see the problem.
	code, body, err := cp.KubeProxyGet(kubeProxyHealthz, "/healthz")
	if err != nil || code != 200 {
		t.Errorf("kube-proxy /healthz while stale: %d %v %s", code, err, body)
	} else {
		t.Logf("kube-proxy /healthz while stale: %d %s", code, strings.TrimSpace(body))
	}
	_, staleMetrics, _ := cp.KubeProxyGet(kubeProxyMetrics, "/metrics")
	// Stay black-holed a little longer and check the rules once more. The re-lists kube-proxy
	// starts meanwhile hang silently in the black-hole: no further log line appears (none in a
	// minute, tried), so "watch ended with error", once per informer, is the only trace.
	time.Sleep(3 * time.Second)
	if eps, _ := ServicePortEndpoints(cp.IptablesSave("nat"), portName, "tcp"); !equalStrings(eps, sortedCopy(oldAddrs)) {
		t.Fatalf("while black-holed the rules should keep the old 10 endpoints, got %v", eps)
	}
	staleFor := time.Since(blackholed)

	t.Logf("fault proxy: %s", cp.Heal())
	healed := time.Now()
	cp.WaitServicePortEndpoints(90*time.Second, portName, "tcp", newAddrs)
	t.Logf("stale for %s; rules converged to the API's 11 endpoints %s after healing",
		staleFor.Round(time.Millisecond), time.Since(healed).Round(time.Millisecond))
	watchErrors := grepLines(cp.KubeProxyLog()[logBefore:], "watch ended with error", "Failed to watch", "Failed to list")

	// More shapes for the rules collector's fixtures.
	t.Run("fixtures", func(t *testing.T) {
		cp := *cp
		cp.t = t
		createFixtureObjects(&cp)
		nat := cp.IptablesSave("nat")
		filter := cp.IptablesSave("filter")
		if *updateFixtures {
			_, metrics, err := cp.KubeProxyGet(kubeProxyMetrics, "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			writeFixtures(&cp, map[string]string{
				"iptables-save-nat.txt":        stripSaveStamps(nat),
				"iptables-save-filter.txt":     stripSaveStamps(filter),
				"kube-proxy-metrics.txt":       metrics,
				"kube-proxy-metrics-stale.txt": staleMetrics,
				"kube-proxy-watch-errors.log":  watchErrors,
				"api-objects.json":             apiObjects(&cp),
			})
		}
	})
}

// createFixtureObjects writes Services and EndpointSlices of the shapes the rules collector
// must read (createShapeObjects), and waits until kube-proxy programmed each one as expected in
// iptables mode.
func createFixtureObjects(cp *ControlPlane) {
	t := cp.t
	createShapeObjects(cp)
	cp.WaitServicePortEndpoints(30*time.Second, "kube-system/kube-dns:dns", "udp", []string{podB + ":53", "10.244.3.30:53"})
	cp.WaitServicePortEndpoints(30*time.Second, "kube-system/kube-dns:dns-tcp", "tcp", []string{podB + ":53", "10.244.3.30:53"})
	cp.WaitServicePortEndpoints(30*time.Second, "lab/web-nodeport:http", "tcp", []string{podB + ":8080", "10.244.3.50:8080"})
	cp.WaitServicePortEndpoints(30*time.Second, "lab/zonal:http", "tcp", []string{"10.244.3.60:8080", "10.244.3.62:8080"})
	waitFor(t, 30*time.Second, "lab/local-only:http programmed in KUBE-SVL with this node's 2 endpoints", func() (bool, string) {
		eps, found := LocalServicePortEndpoints(cp.IptablesSave("nat"), "lab/local-only:http", "tcp")
		return found && equalStrings(eps, []string{podB + ":8080", podB2 + ":8080"}), fmt.Sprintf("found=%v %v", found, eps)
	})
	waitFor(t, 30*time.Second, "lab/empty rejected in the filter table", func() (bool, string) {
		return strings.Contains(cp.IptablesSave("filter"), `"lab/empty:http has no endpoints"`), ""
	})
}

// stripSaveStamps drops iptables-save's "# Generated by ... on <date>" and "# Completed on"
// lines so that fixtures do not change with the clock.
func stripSaveStamps(s string) string {
	var b strings.Builder
	for _, line := range strings.SplitAfter(s, "\n") {
		if strings.HasPrefix(line, "# Generated by") || strings.HasPrefix(line, "# Completed on") {
			continue
		}
		b.WriteString(line)
	}
	return b.String()
}

func grepLines(s string, subs ...string) string {
	var b strings.Builder
	for _, line := range strings.SplitAfter(s, "\n") {
		for _, sub := range subs {
			if strings.Contains(line, sub) {
				b.WriteString(line)
				break
			}
		}
	}
	return b.String()
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// apiObjects is the lab's Services and EndpointSlices as JSON, without server-set fields: what
// the rules in the fixtures were programmed from.
func apiObjects(cp *ControlPlane) string {
	t := cp.t
	ctx := context.Background()
	svcs, err := cp.Client.CoreV1().Services("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	slices, err := cp.Client.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node, err := cp.Client.CoreV1().Nodes().Get(ctx, labNodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	clean := func(m *metav1.ObjectMeta) {
		m.ManagedFields, m.UID, m.ResourceVersion, m.CreationTimestamp, m.Generation = nil, "", "", metav1.Time{}, 0
	}
	for i := range svcs.Items {
		clean(&svcs.Items[i].ObjectMeta)
	}
	for i := range slices.Items {
		clean(&slices.Items[i].ObjectMeta)
	}
	clean(&node.ObjectMeta)
	for i := range node.Status.Conditions {
		node.Status.Conditions[i].LastHeartbeatTime = metav1.Time{}
		node.Status.Conditions[i].LastTransitionTime = metav1.Time{}
	}
	b, err := json.MarshalIndent(map[string]any{
		"node":           node,
		"services":       svcs.Items,
		"endpointSlices": slices.Items,
	}, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return string(b) + "\n"
}

func writeFixtures(cp *ControlPlane, files map[string]string) {
	t := cp.t
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "test", "e2e", "testdata", "kube-proxy-"+cp.Bins.Version)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("fixtures written to %s", dir)
}

// createShapeObjects writes the Services and EndpointSlices of the shapes both proxy modes'
// captures show: two protocols on one port (kube-dns), internalTrafficPolicy Local, a NodePort
// with externalTrafficPolicy Local, a Service without endpoints, zone hints.
func createShapeObjects(cp *ControlPlane) {
	tcp, udp := corev1.ProtocolTCP, corev1.ProtocolUDP
	local := corev1.ServiceInternalTrafficPolicyLocal
	http := []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: tcp}}
	httpSlice := []discoveryv1.EndpointPort{SlicePort("http", tcp, 8080)}
	here := func(ip string) LabEndpoint { return LabEndpoint{IP: ip, NodeName: labNodeName, Zone: labNodeZone} }
	there := func(ip string) LabEndpoint { return LabEndpoint{IP: ip, NodeName: "node-b", Zone: "zone-b"} }

	// kube-dns: two named ports on 53 (UDP and TCP) plus metrics; one endpoint on this node.
	cp.CreateService(&corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "kube-dns", Labels: map[string]string{"k8s-app": "kube-dns"}},
		Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.10", Ports: []corev1.ServicePort{
			{Name: "dns", Port: 53, TargetPort: intstr.FromInt32(53), Protocol: udp},
			{Name: "dns-tcp", Port: 53, TargetPort: intstr.FromInt32(53), Protocol: tcp},
			{Name: "metrics", Port: 9153, TargetPort: intstr.FromInt32(9153), Protocol: tcp},
		}},
	})
	cp.ApplySlice(EndpointSlice("kube-system", "kube-dns", "kube-dns-1",
		[]discoveryv1.EndpointPort{SlicePort("dns", udp, 53), SlicePort("dns-tcp", tcp, 53), SlicePort("metrics", tcp, 9153)},
		[]LabEndpoint{here(podB), there("10.244.3.30")}))

	// internalTrafficPolicy: Local: only this node's two endpoints, in KUBE-SVL.
	cp.CreateService(&corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "lab", Name: "local-only"},
		Spec:       corev1.ServiceSpec{ClusterIP: "10.96.0.51", InternalTrafficPolicy: &local, Ports: http},
	})
	cp.ApplySlice(EndpointSlice("lab", "local-only", "local-only-1", httpSlice,
		[]LabEndpoint{here(podB), here(podB2), there("10.244.3.40")}))

	// NodePort with externalTrafficPolicy: Local: KUBE-NODEPORTS, KUBE-EXT and both chains.
	cp.CreateService(&corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "lab", Name: "web-nodeport"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, ClusterIP: "10.96.0.52",
			ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal,
			Ports:                 []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), NodePort: 30080, Protocol: tcp}}},
	})
	cp.ApplySlice(EndpointSlice("lab", "web-nodeport", "web-nodeport-1", httpSlice,
		[]LabEndpoint{here(podB), there("10.244.3.50")}))

	// No endpoints: a REJECT in the filter table.
	cp.CreateService(&corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "lab", Name: "empty"},
		Spec:       corev1.ServiceSpec{ClusterIP: "10.96.0.53", Ports: http},
	})

	// Zone hints: this node (zone-a) programs only the endpoints hinted for zone-a.
	preferZone := corev1.ServiceTrafficDistributionPreferSameZone
	cp.CreateService(&corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "lab", Name: "zonal"},
		Spec:       corev1.ServiceSpec{ClusterIP: "10.96.0.54", TrafficDistribution: &preferZone, Ports: http},
	})
	zonal := EndpointSlice("lab", "zonal", "zonal-1", httpSlice, []LabEndpoint{
		{IP: "10.244.3.60", NodeName: "node-c", Zone: labNodeZone},
		{IP: "10.244.3.61", NodeName: "node-b", Zone: "zone-b"},
		{IP: "10.244.3.62", NodeName: "node-c", Zone: labNodeZone},
	})
	for i := range zonal.Endpoints {
		zonal.Endpoints[i].Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: *zonal.Endpoints[i].Zone}}}
	}
	cp.ApplySlice(zonal)
}
