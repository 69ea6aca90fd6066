//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/proxyhealth/proxyhealth/internal/testsupport/netnsdial"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The drift lab's timers: short enough that a run takes about a minute and a half, in the
// same proportions as the defaults (grace > check interval, fresh-within > probe interval).
const (
	driftCheckInterval = 1 * time.Second
	driftGrace         = 3 * time.Second
	apiFreshWithin     = 5 * time.Second
	apiProbeInterval   = 1 * time.Second

	// scrapeEvery is how often the drift scenarios scrape while they watch a value that must
	// not move.
	scrapeEvery = 250 * time.Millisecond

	driftExporterPort    = 19872
	ownProxyExporterPort = 19873

	// A second fault proxy, between the second exporter and the apiserver.
	exporterProxyAddr   = "127.0.0.1:6446"
	exporterControlAddr = "127.0.0.1:6447"
)

// The drift metrics.
const (
	servicesChecked  = "proxyhealth_rules_services_checked"
	servicesDrifted  = "proxyhealth_rules_services_drifted"
	endpointsStale   = "proxyhealth_rules_endpoints_stale"
	endpointsMissing = "proxyhealth_rules_endpoints_missing"
	serviceDrift     = "proxyhealth_service_drift_endpoints"
	driftAge         = "proxyhealth_rules_drift_age_seconds"
	viewFresh        = "proxyhealth_api_view_fresh"
	lastHeard        = "proxyhealth_api_last_heard_timestamp_seconds"
)

var rulesCollector = map[string]string{"collector": "rules"}

// TestDrift reproduces incident 3 of docs/design.md against the real exporter: a real kube-proxy
// whose API connection is black-holed keeps old endpoints while the API moves on, and the
// exporter, comparing kube-proxy's rules with its own view of the API, names the service and
// counts the stale and missing endpoints exactly. It asserts only on the exporter's scrape.
// The subtests share one control plane and run in order.
func TestDrift(t *testing.T) {
	requireKube(t)
	requireExporter(t)
	start := time.Now()
	l := newLabRules(t, labRawRules)
	cp := StartControlPlane(t, l, ControlPlaneOptions{})
	kubeconfig := cp.readOnlyKubeconfig("proxyhealth.kubeconfig", apiserverAddr)
	e := l.StartExporter("proxyhealth", driftExporterPort, nil, append(driftExporterArgs(kubeconfig), kubeProxyExporterArgs(cp)...)...)
	waitDriftSynced(t, e, cp)
	t.Logf("control plane, kube-proxy and exporter synced in %s", time.Since(start).Round(time.Millisecond))

	var drifting Scrape // taken while a service drifts, for the README check
	t.Run("healthy_churn", func(t *testing.T) { testHealthyChurn(t, cp.In(t), e) })
	t.Run("kube_proxy_connection_dead", func(t *testing.T) { drifting = testKubeProxyDead(t, cp.In(t), e) })
	t.Run("kube_proxy_log_errors", func(t *testing.T) { testKubeProxyLogErrors(t, cp.In(t), e) })
	t.Run("local_and_zone_hints", func(t *testing.T) { testLocalAndZoneHints(t, cp.In(t), e) })
	t.Run("local_chain_jump_removed", func(t *testing.T) { testLocalChainJumpRemoved(t, cp.In(t), e, false) })
	t.Run("exporter_connection_dead", func(t *testing.T) { testExporterConnectionDead(t, cp.In(t)) })
	t.Run("scrape_matches_readme", func(t *testing.T) {
		if drifting == nil {
			t.Skip("no scrape taken while drifting (kube_proxy_connection_dead failed early)")
		}
		testDriftScrapeMatchesReadme(t, drifting)
	})
	// Last: it stops kube-proxy.
	t.Run("kube_proxy_stopped", func(t *testing.T) { testKubeProxyStopped(t, cp.In(t), e) })
	t.Logf("TestDrift took %s", time.Since(start).Round(time.Millisecond))
}

func driftExporterArgs(kubeconfig string) []string {
	return []string{
		"--log.level=debug",
		"--kubeconfig=" + kubeconfig,
		"--node-name=" + labNodeName,
		"--rules.check-interval=" + driftCheckInterval.String(),
		"--rules.grace-period=" + driftGrace.String(),
		"--api.fresh-within=" + apiFreshWithin.String(),
		"--api.probe-interval=" + apiProbeInterval.String(),
	}
}

// In returns the control plane bound to t, so that a subtest's failures are its own.
func (cp *ControlPlane) In(t *testing.T) *ControlPlane {
	c := *cp
	c.t = t
	c.Lab = cp.Lab.In(t)
	return &c
}

// readOnlyKubeconfig writes a kubeconfig for the exporter that reaches the apiserver at server
// as a ServiceAccount allowed only what the exporter needs: get, list and watch of Services,
// EndpointSlices and Nodes (and /version, which every authenticated client may read).
func (cp *ControlPlane) readOnlyKubeconfig(name, server string) string {
	t := cp.t
	t.Helper()
	ctx := context.Background()
	const ns, sa = "kube-system", "proxyhealth"
	read := []string{"get", "list", "watch"}
	_, err := cp.Client.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "proxyhealth"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"services", "nodes"}, Verbs: read},
			{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: read},
		},
	}, metav1.CreateOptions{})
	if err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatalf("creating ClusterRole proxyhealth: %v", err)
	}
	_, err = cp.Client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "proxyhealth"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "proxyhealth"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: sa}},
	}, metav1.CreateOptions{})
	if err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatalf("creating ClusterRoleBinding proxyhealth: %v", err)
	}
	_, err = cp.Client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: sa},
	}, metav1.CreateOptions{})
	if err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatalf("creating ServiceAccount %s/%s: %v", ns, sa, err)
	}
	return cp.tokenKubeconfig(t, ns, sa, name, server)
}

// FaultProxy is a labtool fault-proxy in the node namespace other than kube-proxy's.
type FaultProxy struct {
	cp            *ControlPlane
	p             *proc
	Addr, Control string
}

// StartFaultProxy starts another fault proxy from listen to the apiserver, commanded on control.
func (cp *ControlPlane) StartFaultProxy(name, listen, control string) *FaultProxy {
	t := cp.t
	t.Helper()
	f := &FaultProxy{cp: cp, Addr: listen, Control: control}
	f.p = cp.Lab.Start(cp.Lab.Node, name, labtoolBin, "fault-proxy", listen, "--to", apiserverAddr, "--control", control)
	waitFor(t, 5*time.Second, name+" ready", func() (bool, string) {
		b, _ := os.ReadFile(f.p.log)
		return strings.Contains(string(b), "ready"), string(b)
	})
	return f
}

func (f *FaultProxy) command(t *testing.T, cmd string) string {
	t.Helper()
	resp, err := netnsdial.HTTPClient(f.cp.Lab.Node, 5*time.Second).Get("http://" + f.Control + "/" + cmd)
	if err != nil {
		t.Fatalf("fault proxy %s %s: %v", f.Addr, cmd, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return strings.TrimSpace(string(b))
}

// Blackhole makes the connections through f dead: open, but silent.
func (f *FaultProxy) Blackhole(t *testing.T) string { t.Helper(); return f.command(t, "blackhole") }

// Heal makes f forward again.
func (f *FaultProxy) Heal(t *testing.T) string { t.Helper(); return f.command(t, "heal") }

// Objects of the drift scenarios.

var (
	httpPorts      = []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}}
	httpSlicePorts = []discoveryv1.EndpointPort{SlicePort("http", corev1.ProtocolTCP, 8080)}
)

func httpService(ns, name, clusterIP string, mutate func(*corev1.ServiceSpec)) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       corev1.ServiceSpec{ClusterIP: clusterIP, Ports: httpPorts},
	}
	if mutate != nil {
		mutate(&s.Spec)
	}
	return s
}

// remoteEndpoints returns the endpoints 10.244.<subnet>.<from..to> on node-b (zone-b) and
// their ip:8080 addresses.
func remoteEndpoints(subnet, from, to int) ([]LabEndpoint, []string) {
	var eps []LabEndpoint
	var addrs []string
	for i := from; i <= to; i++ {
		ip := fmt.Sprintf("10.244.%d.%d", subnet, i)
		eps = append(eps, LabEndpoint{IP: ip, NodeName: "node-b", Zone: "zone-b"})
		addrs = append(addrs, ip+":8080")
	}
	return eps, addrs
}

func (cp *ControlPlane) deleteSlice(ns, name string) {
	cp.t.Helper()
	if err := cp.Client.DiscoveryV1().EndpointSlices(ns).Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		cp.t.Fatalf("deleting EndpointSlice %s/%s: %v", ns, name, err)
	}
}

func (cp *ControlPlane) deleteService(ns, name string) {
	cp.t.Helper()
	if err := cp.Client.CoreV1().Services(ns).Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		cp.t.Fatalf("deleting Service %s/%s: %v", ns, name, err)
	}
}

// apiServicePorts counts the service ports in the API that kube-proxy programs (and the
// exporter therefore checks): those of Services with a cluster IP, not ExternalName, and not
// left to another proxy.
func (cp *ControlPlane) apiServicePorts() int {
	cp.t.Helper()
	svcs, err := cp.Client.CoreV1().Services("").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		cp.t.Fatalf("listing Services: %v", err)
	}
	n := 0
	for _, s := range svcs.Items {
		if s.Spec.ClusterIP == "" || s.Spec.ClusterIP == corev1.ClusterIPNone || s.Spec.Type == corev1.ServiceTypeExternalName {
			continue
		}
		if _, ok := s.Labels["service.kubernetes.io/service-proxy-name"]; ok {
			continue
		}
		n += len(s.Spec.Ports)
	}
	return n
}

// Scrape readers.

// gauge returns the one series of name matching labels, or -1 when there is none.
func gauge(t *testing.T, s Scrape, name string, labels map[string]string) float64 {
	t.Helper()
	v, ok, err := s.Value(name, labels)
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		return -1
	}
	return v
}

func driftLabels(ns, name, kind string) map[string]string {
	return map[string]string{"service_namespace": ns, "service_name": name, "service_port": "80", "protocol": "tcp", "kind": kind}
}

// driftSummary renders the drift gauges of a scrape for failure messages.
func driftSummary(s Scrape) string {
	var b strings.Builder
	for _, name := range []string{viewFresh, servicesChecked, servicesDrifted, endpointsStale, endpointsMissing, driftAge} {
		b.WriteString(s.Series(name) + "\n")
	}
	b.WriteString(s.Series(serviceDrift) + "\n")
	b.WriteString(s.Series(success))
	return b.String()
}

// checkNoDrift fails the test unless s shows a fresh view, checked service ports and no drift
// at all.
func checkNoDrift(t *testing.T, s Scrape, when string) bool {
	t.Helper()
	ok := gauge(t, s, viewFresh, nil) == 1 &&
		gauge(t, s, servicesChecked, nil) > 0 &&
		gauge(t, s, servicesDrifted, nil) == 0 &&
		gauge(t, s, endpointsStale, nil) == 0 &&
		gauge(t, s, endpointsMissing, nil) == 0 &&
		gauge(t, s, driftAge, nil) == 0 &&
		s[serviceDrift] == nil &&
		gauge(t, s, success, rulesCollector) == 1
	if !ok {
		t.Errorf("%s: want a fresh view, checked > 0, no drift and the rules collector succeeding; scrape:\n%s", when, driftSummary(s))
	}
	return ok
}

// watchScrapes scrapes every scrapeEvery for d and hands each scrape to check.
func watchScrapes(t *testing.T, e *Exporter, d time.Duration, check func(s Scrape, at time.Time)) int {
	t.Helper()
	n := 0
	for end := time.Now().Add(d); ; {
		at := time.Now()
		check(e.Scrape(t), at)
		n++
		if time.Now().Add(scrapeEvery).After(end) {
			return n
		}
		time.Sleep(scrapeEvery)
	}
}

// waitConverged waits until the exporter has compared every service port of the API and sees
// no drift.
func waitConverged(t *testing.T, e *Exporter, cp *ControlPlane, what string) Scrape {
	t.Helper()
	want := float64(cp.apiServicePorts())
	return e.Poll(t, 15*time.Second, what, nil, func(s Scrape) (bool, string) {
		return gauge(t, s, viewFresh, nil) == 1 && gauge(t, s, servicesChecked, nil) == want &&
				gauge(t, s, servicesDrifted, nil) == 0 && s[serviceDrift] == nil &&
				gauge(t, s, success, rulesCollector) == 1,
			fmt.Sprintf("want %s %g\n%s", servicesChecked, want, driftSummary(s))
	})
}

// waitDriftSynced waits for the exporter's first comparison of the whole API.
func waitDriftSynced(t *testing.T, e *Exporter, cp *ControlPlane) {
	t.Helper()
	s := waitConverged(t, e, cp, "the exporter's API view synced and every service port checked")
	checkValue(t, s, "proxyhealth_proxy_mode", map[string]string{"mode": "iptables"}, 1)
	if gauge(t, s, lastHeard, nil) <= 0 {
		t.Errorf("%s missing once synced:\n%s", lastHeard, s.Series(lastHeard))
	}
}

// testHealthyChurn: a service's EndpointSlices rewritten up and down every second, and a
// service added and deleted, with a healthy kube-proxy: no scrape during or after the churn
// shows drift (every difference is kube-proxy's sync lag, well inside the grace period).
func testHealthyChurn(t *testing.T, cp *ControlPlane, e *Exporter) {
	const ns, name = "lab", "churn"
	cp.CreateService(httpService(ns, name, "10.96.0.60", nil))
	slice := func(part string, eps []LabEndpoint) *discoveryv1.EndpointSlice {
		return EndpointSlice(ns, name, name+"-"+part, httpSlicePorts, eps)
	}
	a, addrsA := remoteEndpoints(4, 1, 5)
	b, addrsB := remoteEndpoints(4, 101, 105)
	cp.ApplySlice(slice("1", a))
	cp.ApplySlice(slice("2", b))
	cp.WaitServicePortEndpoints(30*time.Second, ns+"/"+name+":http", "tcp", append(addrsA, addrsB...))
	waitConverged(t, e, cp, "lab/churn checked without drift")

	scrapes := 0
	watch := func(step string) {
		scrapes += watchScrapes(t, e, time.Second, func(s Scrape, _ time.Time) { checkNoDrift(t, s, "churn: "+step) })
	}
	steps := []struct {
		what string
		do   func()
	}{
		{"10 -> 12 endpoints", func() {
			eps, _ := remoteEndpoints(4, 1, 6)
			cp.ApplySlice(slice("1", eps))
			eps, _ = remoteEndpoints(4, 101, 106)
			cp.ApplySlice(slice("2", eps))
		}},
		{"12 -> 8 endpoints, 2 of them new", func() {
			eps, _ := remoteEndpoints(4, 3, 6)
			cp.ApplySlice(slice("1", eps))
			eps, _ = remoteEndpoints(4, 103, 106)
			cp.ApplySlice(slice("2", eps))
		}},
		{"service lab/churn-extra added", func() {
			cp.CreateService(httpService(ns, "churn-extra", "10.96.0.61", nil))
			eps, _ := remoteEndpoints(5, 1, 3)
			cp.ApplySlice(EndpointSlice(ns, "churn-extra", "churn-extra-1", httpSlicePorts, eps))
		}},
		{"8 -> 10 endpoints, all new in one slice", func() {
			eps, _ := remoteEndpoints(4, 11, 15)
			cp.ApplySlice(slice("1", eps))
			eps, _ = remoteEndpoints(4, 111, 115)
			cp.ApplySlice(slice("2", eps))
		}},
		{"service lab/churn-extra deleted", func() {
			cp.deleteService(ns, "churn-extra")
			cp.deleteSlice(ns, "churn-extra-1")
		}},
		{"one slice deleted, the other with all 10", func() {
			cp.deleteSlice(ns, name+"-2")
			eps, _ := remoteEndpoints(4, 11, 20)
			cp.ApplySlice(slice("1", eps))
		}},
	}
	start := time.Now()
	for _, st := range steps {
		st.do()
		watch(st.what)
	}
	_, final := remoteEndpoints(4, 11, 20)
	cp.WaitServicePortEndpoints(10*time.Second, ns+"/"+name+":http", "tcp", final)
	// Through the grace period after the last change, and a few checks beyond it.
	scrapes += watchScrapes(t, e, driftGrace+3*driftCheckInterval, func(s Scrape, _ time.Time) {
		checkNoDrift(t, s, "after the churn")
	})
	t.Logf("%d changes in %s, %d scrapes every %s during and after them: no drift in any",
		len(steps), time.Since(start).Round(time.Millisecond), scrapes, scrapeEvery)
	waitConverged(t, e, cp, "every service port checked after the churn")
}

// testKubeProxyDead is incident 3: kube-proxy's API connection is black-holed, the service's
// endpoints change in the API (2 deleted, 3 added), and the exporter reports exactly that
// service port with 2 stale and 3 missing endpoints once the grace period has passed, and
// nothing before. Healed, kube-proxy catches up and the drift goes. It returns a scrape taken
// while drifting.
func testKubeProxyDead(t *testing.T, cp *ControlPlane, e *Exporter) Scrape {
	const ns, name = "lab", "backend"
	cp.CreateService(httpService(ns, name, "10.96.0.50", nil))
	oldEps, oldAddrs := remoteEndpoints(3, 1, 10)
	cp.ApplySlice(EndpointSlice(ns, name, name+"-1", httpSlicePorts, oldEps))
	cp.WaitServicePortEndpoints(30*time.Second, ns+"/"+name+":http", "tcp", oldAddrs)
	waitConverged(t, e, cp, "lab/backend with 10 endpoints checked without drift")

	t.Logf("kube-proxy's fault proxy: %s", cp.Blackhole())
	t.Cleanup(func() { cp.Heal() })
	newEps, newAddrs := remoteEndpoints(3, 3, 13) // 1 and 2 deleted, 11..13 added
	// The exporter may see the change before the write's reply reaches the test: the grace
	// period runs from before the write at the earliest.
	sent := time.Now()
	cp.ApplySlice(EndpointSlice(ns, name, name+"-1", httpSlicePorts, newEps))
	changed := time.Now()

	stale, missing := driftLabels(ns, name, "stale"), driftLabels(ns, name, "missing")
	timeout := driftGrace + 2*driftCheckInterval + 2*time.Second
	s := e.Poll(t, timeout, "lab/backend drifting with 2 stale and 3 missing endpoints", nil, func(s Scrape) (bool, string) {
		if gauge(t, s, viewFresh, nil) != 1 {
			t.Errorf("the exporter's own view went stale while only kube-proxy's connection is dead:\n%s", driftSummary(s))
		}
		drifted := gauge(t, s, servicesDrifted, nil)
		if drifted != 0 && time.Since(sent) < driftGrace {
			t.Errorf("drift reported %s after the change was sent, before the %s grace period:\n%s",
				time.Since(sent).Round(time.Millisecond), driftGrace, driftSummary(s))
		}
		return drifted == 1 && gauge(t, s, serviceDrift, stale) == 2 && gauge(t, s, serviceDrift, missing) == 3, driftSummary(s)
	})
	t.Logf("drift reported %s after the change (grace %s, check interval %s)",
		time.Since(changed).Round(time.Millisecond), driftGrace, driftCheckInterval)
	checkValue(t, s, servicesDrifted, nil, 1)
	checkValue(t, s, endpointsStale, nil, 2)
	checkValue(t, s, endpointsMissing, nil, 3)
	checkValue(t, s, serviceDrift, stale, 2)
	checkValue(t, s, serviceDrift, missing, 3)
	checkValue(t, s, servicesChecked, nil, float64(cp.apiServicePorts()))
	checkValue(t, s, "proxyhealth_rules_drift_unlisted", nil, 0)
	checkValue(t, s, success, rulesCollector, 1)
	if n := len(s[serviceDrift].GetMetric()); n != 2 {
		t.Errorf("%s has %d series, want 2 (lab/backend stale and missing only):\n%s", serviceDrift, n, s.Series(serviceDrift))
	}
	// The oldest drift started when the exporter first saw the difference, after the change,
	// and counts only past the grace period.
	if age := gauge(t, s, driftAge, nil); age < driftGrace.Seconds() || age > time.Since(changed).Seconds()+0.5 {
		t.Errorf("%s = %g, want between %g (the grace period) and %g (since the change)",
			driftAge, age, driftGrace.Seconds(), time.Since(changed).Seconds())
	}
	// Still drifting a check later, with the same numbers (the drift stays: kube-proxy is stuck).
	s2 := e.Poll(t, 3*driftCheckInterval, "a later drift check", nil, func(s2 Scrape) (bool, string) {
		return gauge(t, s2, "proxyhealth_rules_last_check_timestamp_seconds", nil) >
			gauge(t, s, "proxyhealth_rules_last_check_timestamp_seconds", nil), ""
	})
	checkValue(t, s2, serviceDrift, stale, 2)
	checkValue(t, s2, serviceDrift, missing, 3)
	if gauge(t, s2, driftAge, nil) <= gauge(t, s, driftAge, nil) {
		t.Errorf("%s did not grow: %g then %g", driftAge, gauge(t, s, driftAge, nil), gauge(t, s2, driftAge, nil))
	}

	t.Logf("kube-proxy's fault proxy: %s", cp.Heal())
	healed := time.Now()
	e.Poll(t, 30*time.Second, "no drift once kube-proxy's connection is healed", nil, func(s Scrape) (bool, string) {
		return gauge(t, s, servicesDrifted, nil) == 0 && s[serviceDrift] == nil &&
			gauge(t, s, endpointsStale, nil) == 0 && gauge(t, s, endpointsMissing, nil) == 0, driftSummary(s)
	})
	t.Logf("drift gone %s after healing", time.Since(healed).Round(time.Millisecond))
	cp.WaitServicePortEndpoints(10*time.Second, ns+"/"+name+":http", "tcp", newAddrs)
	checkNoDrift(t, waitConverged(t, e, cp, "every service port checked after healing"), "after healing")
	return s
}

// testLocalAndZoneHints: drift is judged against this node's own expected endpoints. For an
// internalTrafficPolicy: Local service that is this node's endpoints only (its KUBE-SVL
// chain); for a service with zone hints, the endpoints hinted for this node's zone. While
// kube-proxy is black-holed, changes outside those sets (an endpoint on another node, one
// hinted for another zone) are no drift; changes inside them are, exactly.
func testLocalAndZoneHints(t *testing.T, cp *ControlPlane, e *Exporter) {
	const ns = "lab"
	local := corev1.ServiceInternalTrafficPolicyLocal
	preferZone := corev1.ServiceTrafficDistributionPreferSameZone
	here := func(ip string) LabEndpoint { return LabEndpoint{IP: ip, NodeName: labNodeName, Zone: labNodeZone} }
	there := func(ip string) LabEndpoint { return LabEndpoint{IP: ip, NodeName: "node-b", Zone: "zone-b"} }
	zoned := func(ip, node, zone string) LabEndpoint { return LabEndpoint{IP: ip, NodeName: node, Zone: zone} }
	hinted := func(name string, eps []LabEndpoint) *discoveryv1.EndpointSlice {
		s := EndpointSlice(ns, "zonal", name, httpSlicePorts, eps)
		for i := range s.Endpoints {
			s.Endpoints[i].Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: *s.Endpoints[i].Zone}}}
		}
		return s
	}
	waitLocal := func(want []string) {
		waitFor(t, 30*time.Second, fmt.Sprintf("lab/local-only:http programmed in KUBE-SVL with %v", want), func() (bool, string) {
			eps, found := LocalServicePortEndpoints(cp.IptablesSave("nat"), "lab/local-only:http", "tcp")
			return found && equalStrings(eps, sortedCopy(want)), fmt.Sprintf("found=%v %v", found, eps)
		})
	}

	cp.CreateService(httpService(ns, "local-only", "10.96.0.51", func(s *corev1.ServiceSpec) { s.InternalTrafficPolicy = &local }))
	cp.ApplySlice(EndpointSlice(ns, "local-only", "local-only-1", httpSlicePorts,
		[]LabEndpoint{here(podB), here(podB2), there("10.244.3.40"), there("10.244.3.41")}))
	cp.CreateService(httpService(ns, "zonal", "10.96.0.54", func(s *corev1.ServiceSpec) { s.TrafficDistribution = &preferZone }))
	cp.ApplySlice(hinted("zonal-1", []LabEndpoint{
		zoned("10.244.3.60", "node-c", labNodeZone), zoned("10.244.3.61", "node-b", "zone-b"), zoned("10.244.3.62", "node-c", labNodeZone),
	}))
	waitLocal([]string{podB + ":8080", podB2 + ":8080"})
	cp.WaitServicePortEndpoints(30*time.Second, "lab/zonal:http", "tcp", []string{"10.244.3.60:8080", "10.244.3.62:8080"})
	waitConverged(t, e, cp, "lab/local-only and lab/zonal checked without drift")

	t.Logf("kube-proxy's fault proxy: %s", cp.Blackhole())
	t.Cleanup(func() { cp.Heal() })

	// Changes that leave this node's expected sets alone: an endpoint on another node for
	// the Local service, one hinted for zone-b for the zonal one.
	cp.ApplySlice(EndpointSlice(ns, "local-only", "local-only-1", httpSlicePorts,
		[]LabEndpoint{here(podB), here(podB2), there("10.244.3.40"), there("10.244.3.41"), there("10.244.3.42")}))
	cp.ApplySlice(hinted("zonal-1", []LabEndpoint{
		zoned("10.244.3.60", "node-c", labNodeZone), zoned("10.244.3.61", "node-b", "zone-b"), zoned("10.244.3.62", "node-c", labNodeZone),
		zoned("10.244.3.63", "node-b", "zone-b"),
	}))
	n := watchScrapes(t, e, driftGrace+2*driftCheckInterval+time.Second, func(s Scrape, _ time.Time) {
		checkNoDrift(t, s, "black-holed, changes outside this node's expected endpoints")
	})
	t.Logf("%d scrapes over the grace period and two checks after changes outside this node's sets: no drift", n)

	// Changes inside them. Local: 10.244.1.4 gone, 10.244.1.5 and 10.244.1.6 added on this
	// node (and one more elsewhere): 1 stale, 2 missing. Zonal: both zone-a endpoints gone, one
	// new in zone-a (and one more in zone-b): 2 stale, 1 missing.
	// The exporter may see the changes before the writes' replies arrive.
	sent := time.Now()
	cp.ApplySlice(EndpointSlice(ns, "local-only", "local-only-1", httpSlicePorts,
		[]LabEndpoint{here(podB), here("10.244.1.5"), here("10.244.1.6"), there("10.244.3.40"), there("10.244.3.41"), there("10.244.3.43")}))
	cp.ApplySlice(hinted("zonal-1", []LabEndpoint{
		zoned("10.244.3.61", "node-b", "zone-b"), zoned("10.244.3.63", "node-b", "zone-b"),
		zoned("10.244.3.64", "node-c", labNodeZone), zoned("10.244.3.65", "node-b", "zone-b"),
	}))
	changed := time.Now()
	want := map[string]float64{
		fmtLabels(driftLabels(ns, "local-only", "stale")):   1,
		fmtLabels(driftLabels(ns, "local-only", "missing")): 2,
		fmtLabels(driftLabels(ns, "zonal", "stale")):        2,
		fmtLabels(driftLabels(ns, "zonal", "missing")):      1,
	}
	s := e.Poll(t, driftGrace+2*driftCheckInterval+2*time.Second, "lab/local-only and lab/zonal drifting", nil, func(s Scrape) (bool, string) {
		drifted := gauge(t, s, servicesDrifted, nil)
		if drifted != 0 && time.Since(sent) < driftGrace {
			t.Errorf("drift reported %s after the change was sent, before the %s grace period:\n%s",
				time.Since(sent).Round(time.Millisecond), driftGrace, driftSummary(s))
		}
		return drifted == 2 &&
			gauge(t, s, serviceDrift, driftLabels(ns, "local-only", "stale")) == 1 &&
			gauge(t, s, serviceDrift, driftLabels(ns, "local-only", "missing")) == 2 &&
			gauge(t, s, serviceDrift, driftLabels(ns, "zonal", "stale")) == 2 &&
			gauge(t, s, serviceDrift, driftLabels(ns, "zonal", "missing")) == 1, driftSummary(s)
	})
	t.Logf("drift reported %s after the change", time.Since(changed).Round(time.Millisecond))
	checkValue(t, s, servicesDrifted, nil, 2)
	checkValue(t, s, endpointsStale, nil, 3)
	checkValue(t, s, endpointsMissing, nil, 3)
	if fam := s[serviceDrift]; len(fam.GetMetric()) != len(want) {
		t.Errorf("%s has %d series, want %d:\n%s", serviceDrift, len(fam.GetMetric()), len(want), s.Series(serviceDrift))
	}
	for labels, v := range want {
		t.Logf("%s%s %g", serviceDrift, labels, v)
	}

	t.Logf("kube-proxy's fault proxy: %s", cp.Heal())
	waitLocal([]string{podB + ":8080", "10.244.1.5:8080", "10.244.1.6:8080"})
	cp.WaitServicePortEndpoints(30*time.Second, "lab/zonal:http", "tcp", []string{"10.244.3.64:8080"})
	e.Poll(t, 10*time.Second, "no drift once healed", nil, func(s Scrape) (bool, string) {
		return gauge(t, s, servicesDrifted, nil) == 0 && s[serviceDrift] == nil, driftSummary(s)
	})
	checkNoDrift(t, waitConverged(t, e, cp, "every service port checked after healing"), "after healing")
}

// testExporterConnectionDead: the exporter's own API connection dies (its fault proxy
// black-holed) while kube-proxy stays healthy and endpoints change. kube-proxy's rules are
// right and the exporter's view is old: the exporter must say its view is stale, never that
// kube-proxy is. Healed, the view is fresh again and there is no drift.
func testExporterConnectionDead(t *testing.T, cp *ControlPlane) {
	fp := cp.StartFaultProxy("exporter-fault-proxy", exporterProxyAddr, exporterControlAddr)
	kubeconfig := cp.readOnlyKubeconfig("proxyhealth-proxied.kubeconfig", exporterProxyAddr)
	e := cp.Lab.StartExporter("proxyhealth-proxied", ownProxyExporterPort, nil, driftExporterArgs(kubeconfig)...)
	waitConverged(t, e, cp, "the proxied exporter synced without drift")
	base := e.state(t)

	const ns, name = "lab", "backend"
	t.Logf("exporter's fault proxy: %s", fp.Blackhole(t))
	t.Cleanup(func() { fp.Heal(t) })
	blackholed := time.Now()
	// kube-proxy programs this; the exporter never hears of it while black-holed.
	after, afterAddrs := remoteEndpoints(3, 6, 16)
	cp.ApplySlice(EndpointSlice(ns, name, name+"-1", httpSlicePorts, after))
	cp.WaitServicePortEndpoints(10*time.Second, ns+"/"+name+":http", "tcp", afterAddrs)

	noFalseDrift := func(s Scrape, what string) {
		if v := gauge(t, s, servicesDrifted, nil); v > 0 || s[serviceDrift] != nil {
			t.Errorf("%s: drift reported while the exporter's own view is what is stale (%s after the black-hole):\n%s",
				what, time.Since(blackholed).Round(time.Millisecond), driftSummary(s))
		}
	}
	s := e.Poll(t, apiFreshWithin+apiProbeInterval+2*time.Second, "the exporter's view to go stale", nil, func(s Scrape) (bool, string) {
		noFalseDrift(s, "black-holed")
		return gauge(t, s, viewFresh, nil) == 0, driftSummary(s)
	})
	t.Logf("view stale %s after the black-hole (fresh-within %s, probe interval %s)", time.Since(blackholed).Round(time.Millisecond), apiFreshWithin, apiProbeInterval)
	checkValue(t, s, success, rulesCollector, 0)
	// Only the collector that needs the API fails; the rest serve.
	for _, c := range []string{"node", "conntrack", "kubeproxy"} {
		checkValue(t, s, success, map[string]string{"collector": c}, 1)
	}
	if heard := gauge(t, s, lastHeard, nil); heard <= 0 || float64(blackholed.UnixNano())/1e9-heard > apiProbeInterval.Seconds()+1 {
		t.Errorf("%s = %g, want within a probe interval before the black-hole at %g", lastHeard, heard, float64(blackholed.UnixNano())/1e9)
	}
	// Stale for longer than the grace period: still no drift, and no service port counted.
	watchScrapes(t, e, driftGrace+driftCheckInterval, func(s Scrape, _ time.Time) {
		noFalseDrift(s, "black-holed, view stale")
		if gauge(t, s, viewFresh, nil) != 0 || gauge(t, s, success, rulesCollector) != 0 {
			t.Errorf("the view should stay stale while black-holed:\n%s", driftSummary(s))
		}
	})
	s = e.Scrape(t)
	checkValue(t, s, servicesChecked, nil, 0)

	t.Logf("exporter's fault proxy: %s", fp.Heal(t))
	healed := time.Now()
	// Fresh again at the first probe; service ports are counted again from the next check.
	e.Poll(t, 2*apiProbeInterval+5*time.Second, "the exporter's view fresh again and checked", nil, func(s Scrape) (bool, string) {
		noFalseDrift(s, "healed")
		return gauge(t, s, viewFresh, nil) == 1 && gauge(t, s, success, rulesCollector) == 1 &&
			gauge(t, s, servicesChecked, nil) > 0, driftSummary(s)
	})
	t.Logf("view fresh again %s after healing", time.Since(healed).Round(time.Millisecond))
	// Through a grace period and a check beyond: the view caught up, nothing drifts.
	watchScrapes(t, e, driftGrace+2*driftCheckInterval, func(s Scrape, _ time.Time) { checkNoDrift(t, s, "after healing") })
	waitConverged(t, e, cp, "every service port checked after healing")
	// Nothing of the dead connection is left behind (faults_test.go's bounds).
	e.waitClean(t, base, 15*time.Second)
}

// testDriftScrapeMatchesReadme checks a scrape taken while a service drifted against the
// README: every exported family's type and label names, and every rules and API family
// present (the per-service drift series and the API's last-heard time included).
func testDriftScrapeMatchesReadme(t *testing.T, s Scrape) {
	ref := readmeReference(t)
	n := checkScrapeSignatures(t, s, ref)
	required := 0
	for name := range ref {
		if !strings.HasPrefix(name, "proxyhealth_rules_") && !strings.HasPrefix(name, "proxyhealth_api_") &&
			name != serviceDrift && name != "proxyhealth_proxy_mode" {
			continue
		}
		required++
		if _, ok := s[name]; !ok {
			t.Errorf("%s is documented but was not in the scrape taken while drifting", name)
		}
	}
	if required < 10 {
		t.Errorf("only %d rules and API families documented in docs/metrics.md", required)
	}
	t.Logf("%d proxyhealth_ families checked against docs/metrics.md, %d rules and API families required", n, required)
}
