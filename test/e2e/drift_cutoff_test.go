//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyhealth/proxyhealth/internal/cluster"
	"github.com/proxyhealth/proxyhealth/internal/proxyversion"
)

// TestDriftCutOff holds the drift the exporter reports while kube-proxy is cut off from the
// API to kube-proxy's own answer: the difference between the rules it kept while cut off and
// the rules it writes once healed, per Service. The Services are the three kube-proxy v1.37.2
// in nftables mode was reported to disagree on (issue 20, item 4):
//
//   - cutoff/local-only, internalTrafficPolicy: Local with remote endpoints only (no local
//     chain); while cut off a ready endpoint on this node is added and a remote one turns not
//     ready: 1 missing;
//   - cutoff/two-families, a ClusterIP Service with an IPv4 slice (port http = 8787, one of its
//     two endpoints on this node) and an IPv6 slice (port http = 8080, which this IPv4 node
//     ignores); while cut off the IPv4 slice loses its remote endpoint: 1 stale, and kube-proxy
//     v1.37 then programs the one endpoint left as a plain `dnat to`, no numgen map;
//   - cutoff/renumbered, internalTrafficPolicy: Local whose endpoints are all serving and
//     terminating, one on this node; while cut off its slice is deleted and its port renumbered
//     from 80 to 6015: 1 stale, reported for port 6015 (the chains are named by the port's name).
//
// In each, a chain on one side of the cut-off holds a single endpoint, which kube-proxy v1.37's
// nftables mode writes as a plain `dnat to ADDR:PORT` rather than a numgen map (the test logs
// those chains): a reader of the rules that knows only the map finds no endpoint there. The
// exporter reads kube-proxy's version from its metrics (proxyhealth_kubeproxy_build_info).
//
// One subtest per proxy mode, each with its own lab. Run against other kube-proxy versions
// with PROXYHEALTH_KUBE_VERSION or PROXYHEALTH_KUBE_BIN (test/kubelab).
func TestDriftCutOff(t *testing.T) {
	requireKube(t)
	requireExporter(t)
	for _, mode := range []string{"nftables", "iptables"} {
		t.Run(mode, func(t *testing.T) { testDriftCutOff(t, mode) })
	}
}

const cutoffNS = "cutoff"

// cutoffServices are the Services of TestDriftCutOff, in the order they are reported.
var cutoffServices = []string{"local-only", "two-families", "renumbered"}

func testDriftCutOff(t *testing.T, mode string) {
	start := time.Now()
	l := newLabRules(t, labRawRules)
	cp := StartControlPlane(t, l, ControlPlaneOptions{NoKubeProxy: true})
	cp.StartKubeProxy(KubeProxyOptions{Mode: mode})
	if mode == "nftables" {
		cp.WaitNFTServicePort(60*time.Second, "default", "kubernetes", "tcp", "https", false, []string{uplinkN + ":6443"})
	}
	kubeconfig := cp.readOnlyKubeconfig("proxyhealth.kubeconfig", apiserverAddr)
	e := l.StartExporter("proxyhealth", driftExporterPort, nil, driftExporterArgs(kubeconfig)...)
	waitConverged(t, e, cp, "the exporter's API view synced and every service port checked")
	t.Logf("control plane (%s), kube-proxy (%s) and exporter synced in %s", cp.Bins.Version, mode, time.Since(start).Round(time.Millisecond))

	// The exporter reads kube-proxy's version from its metrics, as kube-proxy reports it.
	_, metrics, err := cp.KubeProxyGet(kubeProxyMetrics, "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^kubernetes_build_info\{.*git_version="([^"]*)"`).FindStringSubmatch(metrics)
	if m == nil {
		t.Fatalf("kube-proxy's metrics have no kubernetes_build_info")
	}
	t.Logf("kube-proxy reports version %s", m[1])
	e.WaitValue(t, 10*time.Second, "proxyhealth_kubeproxy_build_info", map[string]string{"version": m[1]}, 1)
	// /status notes a version outside the tested ones, or one it cannot place (the lab's
	// builds without version stamps).
	body, err := e.l.Get(e.l.Node, strings.TrimSuffix(e.URL, "/metrics")+"/status")
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := proxyversion.Parse(m[1]); ok && v.Tested() == strings.Contains(body, `"notes"`) {
		t.Errorf("kube-proxy %s (tested: %v); /status: %s", m[1], ok && v.Tested(), body)
	}
	if _, ok := proxyversion.Parse(m[1]); !ok && !strings.Contains(body, "which proxyhealth cannot place") {
		t.Errorf("kube-proxy %s: /status has no note of it: %s", m[1], body)
	}

	local := func(ip string) LabEndpoint { return LabEndpoint{IP: ip, NodeName: labNodeName, Zone: "zone-a"} }
	remote := func(ip string) LabEndpoint { return LabEndpoint{IP: ip, NodeName: "node-b", Zone: "zone-b"} }
	itpLocal := func(spec *corev1.ServiceSpec) {
		spec.InternalTrafficPolicy = ptrTo(corev1.ServiceInternalTrafficPolicyLocal)
	}

	cp.CreateService(httpService(cutoffNS, "local-only", "10.96.0.71", itpLocal))
	cp.ApplySlice(EndpointSlice(cutoffNS, "local-only", "local-only-1", httpSlicePorts,
		[]LabEndpoint{remote("10.244.7.1"), remote("10.244.7.2")}))

	cp.CreateService(httpService(cutoffNS, "two-families", "10.96.0.72", nil))
	v4Ports := []discoveryv1.EndpointPort{SlicePort("http", corev1.ProtocolTCP, 8787)}
	cp.ApplySlice(EndpointSlice(cutoffNS, "two-families", "two-families-v4", v4Ports,
		[]LabEndpoint{local("10.244.8.1"), remote("10.244.8.2")}))
	v6 := EndpointSlice(cutoffNS, "two-families", "two-families-v6", httpSlicePorts, []LabEndpoint{remote("fd00:10:244:8::1")})
	v6.AddressType = discoveryv1.AddressTypeIPv6
	cp.ApplySlice(v6)

	cp.CreateService(httpService(cutoffNS, "renumbered", "10.96.0.73", itpLocal))
	cp.ApplySlice(terminating(EndpointSlice(cutoffNS, "renumbered", "renumbered-1", httpSlicePorts,
		[]LabEndpoint{local("10.244.9.1"), remote("10.244.9.2")})))

	waitFor(t, 30*time.Second, "kube-proxy's rules for the cutoff Services", func() (bool, string) {
		got := cp.cutoffRules(mode)
		want := map[string][]string{
			"local-only":   {},
			"two-families": {"10.244.8.1:8787", "10.244.8.2:8787"},
			"renumbered":   {"10.244.9.1:8080"},
		}
		for _, name := range cutoffServices {
			if !equalStrings(got[name], want[name]) {
				return false, fmt.Sprintf("%v", got)
			}
		}
		return true, ""
	})
	waitConverged(t, e, cp, "the cutoff Services checked without drift")

	t.Logf("kube-proxy's fault proxy: %s", cp.Blackhole())
	t.Cleanup(func() { cp.Heal() })
	cp.ApplySlice(EndpointSlice(cutoffNS, "local-only", "local-only-1", httpSlicePorts,
		[]LabEndpoint{remote("10.244.7.1"), {IP: "10.244.7.2", NodeName: "node-b", Zone: "zone-b", NotReady: true}, local("10.244.7.3")}))
	cp.ApplySlice(EndpointSlice(cutoffNS, "two-families", "two-families-v4", v4Ports, []LabEndpoint{local("10.244.8.1")}))
	cp.deleteSlice(cutoffNS, "renumbered-1")
	cp.renumberPort(cutoffNS, "renumbered", 6015)

	// What the exporter reports, once every change has lasted the grace period.
	want := map[string]staleMissing{"local-only": {0, 1}, "two-families": {1, 0}, "renumbered": {1, 0}}
	timeout := driftGrace + 2*driftCheckInterval + 5*time.Second
	var reported map[string]staleMissing
	s := e.Poll(t, timeout, "the three cutoff Services drifting", nil, func(s Scrape) (bool, string) {
		reported = driftByService(s, cutoffNS)
		return gauge(t, s, servicesDrifted, nil) == 3 && mapsEqual(reported, want), driftSummary(s)
	})
	checkValue(t, s, serviceDrift, map[string]string{"service_namespace": cutoffNS, "service_name": "renumbered",
		"service_port": "6015", "protocol": "tcp", "kind": "stale"}, 1)
	frozen := cp.cutoffRules(mode)
	t.Logf("while cut off: rules %v, the exporter's drift %v", frozen, reported)
	if mode == "nftables" {
		out, _ := cp.Lab.Exec(cp.Lab.Node, "nft", "list", "chain", "ip", "kube-proxy", nftServiceChain("local-", cutoffNS, "renumbered", "tcp", "http"))
		t.Logf("while cut off: %s", out)
	}

	t.Logf("kube-proxy's fault proxy: %s", cp.Heal())
	e.Poll(t, 30*time.Second, "no drift once kube-proxy's connection is healed", nil, func(s Scrape) (bool, string) {
		return gauge(t, s, servicesDrifted, nil) == 0 && s[serviceDrift] == nil, driftSummary(s)
	})
	checkNoDrift(t, waitConverged(t, e, cp, "every service port checked after healing"), "after healing")
	healed := cp.cutoffRules(mode)

	// kube-proxy's own answer: what its healed rules hold that its frozen ones did not
	// (missing while cut off), and the reverse (stale).
	for _, name := range cutoffServices {
		var own staleMissing
		for _, ep := range frozen[name] {
			if !slices.Contains(healed[name], ep) {
				own.stale++
			}
		}
		for _, ep := range healed[name] {
			if !slices.Contains(frozen[name], ep) {
				own.missing++
			}
		}
		if reported[name] != own {
			t.Errorf("%s/%s: the exporter reported %+v while kube-proxy was cut off; kube-proxy's rules went from %v to %v once healed (%+v)",
				cutoffNS, name, reported[name], frozen[name], healed[name], own)
		}
	}
	t.Logf("healed: rules %v", healed)
	if mode == "nftables" {
		// kube-proxy v1.37 writes a chain with one endpoint as a plain `dnat to`, v1.36 as a
		// numgen map of one element, v1.34 as a numgen vmap to one endpoint chain.
		for _, c := range []string{nftServiceChain("local-", cutoffNS, "local-only", "tcp", "http"), nftServiceChain("service-", cutoffNS, "two-families", "tcp", "http")} {
			out, _ := cp.Lab.Exec(cp.Lab.Node, "nft", "list", "chain", "ip", "kube-proxy", c)
			t.Logf("healed: %s", out)
		}
	}
	t.Logf("TestDriftCutOff/%s took %s", mode, time.Since(start).Round(time.Millisecond))
}

// staleMissing is one Service's drift: endpoints in the rules and not in the API, and the
// reverse.
type staleMissing struct{ stale, missing int }

// driftByService sums proxyhealth_service_drift_endpoints per Service of namespace ns.
func driftByService(s Scrape, ns string) map[string]staleMissing {
	out := map[string]staleMissing{}
	for _, m := range s[serviceDrift].GetMetric() {
		labels := map[string]string{}
		for _, lp := range m.GetLabel() {
			labels[lp.GetName()] = lp.GetValue()
		}
		if labels["service_namespace"] != ns {
			continue
		}
		d := out[labels["service_name"]]
		switch labels["kind"] {
		case "stale":
			d.stale += int(m.GetGauge().GetValue())
		case "missing":
			d.missing += int(m.GetGauge().GetValue())
		}
		out[labels["service_name"]] = d
	}
	return out
}

func mapsEqual[K comparable, V comparable](a, b map[K]V) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// cutoffRules reads kube-proxy's rules for the cutoff Services' port http: per Service the
// endpoints of its cluster and local chains together (ip:port, sorted, distinct).
func (cp *ControlPlane) cutoffRules(mode string) map[string][]string {
	cp.t.Helper()
	out := map[string][]string{}
	if mode == "nftables" {
		rs := cp.NFTKubeProxy()
		for _, name := range cutoffServices {
			eps := []string{}
			if rs != nil {
				for _, prefix := range []string{"service-", "local-"} {
					got, _ := NFTChainEndpoints(rs, nftServiceChain(prefix, cutoffNS, name, "tcp", "http"))
					eps = append(eps, got...)
				}
			}
			out[name] = slices.Compact(sortedCopy(eps))
		}
		return out
	}
	nat := cp.IptablesSave("nat")
	for _, name := range cutoffServices {
		portName := cutoffNS + "/" + name + ":http"
		cluster, _ := ServicePortEndpoints(nat, portName, "tcp")
		local, _ := LocalServicePortEndpoints(nat, portName, "tcp")
		out[name] = slices.Compact(sortedCopy(append(cluster, local...)))
	}
	return out
}

// terminating marks every endpoint of s serving and terminating (not ready), as the
// EndpointSlice controller marks a terminating pod that still passes its readiness probe.
func terminating(s *discoveryv1.EndpointSlice) *discoveryv1.EndpointSlice {
	for i := range s.Endpoints {
		s.Endpoints[i].Conditions = discoveryv1.EndpointConditions{Ready: ptrTo(false), Serving: ptrTo(true), Terminating: ptrTo(true)}
	}
	return s
}

// renumberPort gives the Service's only port the number port.
func (cp *ControlPlane) renumberPort(ns, name string, port int32) {
	cp.t.Helper()
	ctx := context.Background()
	api := cp.Client.CoreV1().Services(ns)
	svc, err := api.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		cp.t.Fatalf("getting Service %s/%s: %v", ns, name, err)
	}
	svc.Spec.Ports[0].Port = port
	if _, err := api.Update(ctx, svc, metav1.UpdateOptions{}); err != nil {
		cp.t.Fatalf("renumbering Service %s/%s: %v", ns, name, err)
	}
}

// TestDuplicateEndpointAsKubeProxyVersion holds the API view's version-dependent rule to the
// real kube-proxy: an endpoint listed in two slices of an internalTrafficPolicy: Local Service,
// ready on another node in one and serving-terminating on this node in the other. kube-proxy
// v1.34 and v1.35 keep the copy on this node (the local chain falls back to it); v1.36 and
// later keep the ready one (no local endpoint). The lab's kube-proxy reports no version (its
// build has no version stamps), so the model's version is the lab's (cp.Bins.Version:
// PROXYHEALTH_KUBE_VERSION, or the default); both modes read the same EndpointSlice cache, so
// iptables mode alone.
func TestDuplicateEndpointAsKubeProxyVersion(t *testing.T) {
	requireKube(t)
	l := newLabRules(t, labRawRules)
	cp := StartControlPlane(t, l, ControlPlaneOptions{})
	version, ok := proxyversion.Parse(cp.Bins.Version)
	if !ok {
		t.Fatalf("the lab's version %q does not parse", cp.Bins.Version)
	}
	const ns, name = "dup", "moved"
	svc := cp.CreateService(httpService(ns, name, "10.96.0.81", func(spec *corev1.ServiceSpec) {
		spec.InternalTrafficPolicy = ptrTo(corev1.ServiceInternalTrafficPolicyLocal)
	}))
	apiSlices := []*discoveryv1.EndpointSlice{
		cp.ApplySlice(EndpointSlice(ns, name, name+"-a", httpSlicePorts, []LabEndpoint{
			{IP: "10.244.10.1", NodeName: "node-b", Zone: "zone-b"}, {IP: "10.244.10.2", NodeName: "node-b", Zone: "zone-b"}})),
		cp.ApplySlice(terminating(EndpointSlice(ns, name, name+"-b", httpSlicePorts, []LabEndpoint{
			{IP: "10.244.10.1", NodeName: labNodeName, Zone: "zone-a"}}))),
	}
	ports := cluster.ServicePortsFor(version, svc, apiSlices, labNodeName, "zone-a")
	if len(ports) != 1 {
		t.Fatalf("the model computes %d ports", len(ports))
	}
	want := []string{}
	for _, ep := range ports[0].LocalEndpoints {
		want = append(want, ep.String())
	}
	if version.Before(proxyversion.Version{Major: 1, Minor: 36}) != (len(want) == 1) {
		t.Fatalf("the model as %v computes the local endpoints %v", version, want)
	}
	// A marker Service programmed after the slices: once its chain is there, kube-proxy has
	// applied the slices too.
	cp.CreateService(httpService(ns, "marker", "10.96.0.82", nil))
	cp.ApplySlice(EndpointSlice(ns, "marker", "marker-1", httpSlicePorts, []LabEndpoint{{IP: "10.244.10.9", NodeName: "node-b", Zone: "zone-b"}}))
	nat := cp.WaitServicePortEndpoints(30*time.Second, ns+"/marker:http", "tcp", []string{"10.244.10.9:8080"})
	got, _ := LocalServicePortEndpoints(nat, ns+"/"+name+":http", "tcp")
	if !equalStrings(got, want) {
		t.Errorf("kube-proxy %s programmed the local endpoints %v; the model as %v computes %v", cp.Bins.Version, got, version, want)
	}
	t.Logf("kube-proxy %s: local endpoints %v, as the model computes", cp.Bins.Version, got)
}
