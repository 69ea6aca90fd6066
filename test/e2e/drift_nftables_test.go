//go:build e2e

package e2e

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// TestDriftNFTables is TestDrift's incident 3 (kube_proxy_connection_dead) with kube-proxy in
// nftables mode: its API connection black-holed, a service's 10 endpoints become 11 in the API
// (2 deleted, 3 added), and the exporter's scrape shows exactly that service port drifting with
// 2 stale and 3 missing endpoints once the grace period has passed, and no drift once healed.
// Then the same for a service with ClientIP session affinity (per-endpoint chains). It asserts
// only on the exporter's scrape, besides waiting for kube-proxy's table. Last, a local
// endpoint taken out of a NodePort's local- chain only (testLocalChainJumpRemoved).
func TestDriftNFTables(t *testing.T) {
	requireKube(t)
	requireExporter(t)
	start := time.Now()
	l := newLabRules(t, labRawRules)
	cp := StartControlPlane(t, l, ControlPlaneOptions{NoKubeProxy: true})
	cp.StartKubeProxy(KubeProxyOptions{Mode: "nftables"})
	cp.WaitNFTServicePort(60*time.Second, "default", "kubernetes", "tcp", "https", false, []string{uplinkN + ":6443"})
	kubeconfig := cp.readOnlyKubeconfig("proxyhealth.kubeconfig", apiserverAddr)
	e := l.StartExporter("proxyhealth", driftExporterPort, nil, driftExporterArgs(kubeconfig)...)
	s := waitConverged(t, e, cp, "the exporter's API view synced and every service port checked")
	checkValue(t, s, "proxyhealth_proxy_mode", map[string]string{"mode": "nftables"}, 1)
	checkValue(t, s, "proxyhealth_proxy_mode", map[string]string{"mode": "iptables"}, 0)
	t.Logf("control plane, kube-proxy (nftables) and exporter synced in %s", time.Since(start).Round(time.Millisecond))

	const ns, name = "lab", "backend"
	cp.CreateService(httpService(ns, name, "10.96.0.50", nil))
	oldEps, oldAddrs := remoteEndpoints(3, 1, 10)
	cp.ApplySlice(EndpointSlice(ns, name, name+"-1", httpSlicePorts, oldEps))
	cp.WaitNFTServicePort(30*time.Second, ns, name, "tcp", "http", false, oldAddrs)
	waitConverged(t, e, cp, "lab/backend with 10 endpoints checked without drift")

	t.Logf("kube-proxy's fault proxy: %s", cp.Blackhole())
	t.Cleanup(func() { cp.Heal() })
	newEps, newAddrs := remoteEndpoints(3, 3, 13) // 1 and 2 deleted, 11..13 added
	// The exporter may see the change before the write's reply arrives.
	sent := time.Now()
	cp.ApplySlice(EndpointSlice(ns, name, name+"-1", httpSlicePorts, newEps))
	changed := time.Now()

	stale, missing := driftLabels(ns, name, "stale"), driftLabels(ns, name, "missing")
	timeout := driftGrace + 2*driftCheckInterval + 2*time.Second
	s = e.Poll(t, timeout, "lab/backend drifting with 2 stale and 3 missing endpoints", nil, func(s Scrape) (bool, string) {
		drifted := gauge(t, s, servicesDrifted, nil)
		if drifted != 0 && time.Since(sent) < driftGrace {
			t.Errorf("drift reported %s after the change was sent, before the %s grace period:\n%s",
				time.Since(sent).Round(time.Millisecond), driftGrace, driftSummary(s))
		}
		return drifted == 1 && gauge(t, s, serviceDrift, stale) == 2 && gauge(t, s, serviceDrift, missing) == 3, driftSummary(s)
	})
	t.Logf("drift reported %s after the change (grace %s, check interval %s)",
		time.Since(changed).Round(time.Millisecond), driftGrace, driftCheckInterval)
	checkValue(t, s, viewFresh, nil, 1)
	checkValue(t, s, servicesDrifted, nil, 1)
	checkValue(t, s, endpointsStale, nil, 2)
	checkValue(t, s, endpointsMissing, nil, 3)
	checkValue(t, s, servicesChecked, nil, float64(cp.apiServicePorts()))
	checkValue(t, s, "proxyhealth_rules_orphan_chains", nil, 0)
	checkValue(t, s, success, rulesCollector, 1)
	if n := len(s[serviceDrift].GetMetric()); n != 2 {
		t.Errorf("%s has %d series, want 2 (lab/backend stale and missing only):\n%s", serviceDrift, n, s.Series(serviceDrift))
	}
	// The table really is stale: still the old 10 endpoints.
	if got, found := NFTChainEndpoints(cp.NFTKubeProxy(), nftServiceChain("service-", ns, name, "tcp", "http")); !found || !equalStrings(got, sortedCopy(oldAddrs)) {
		t.Errorf("while black-holed kube-proxy's chain should keep the old 10 endpoints, got found=%v %v", found, got)
	}

	t.Logf("kube-proxy's fault proxy: %s", cp.Heal())
	healed := time.Now()
	e.Poll(t, 30*time.Second, "no drift once kube-proxy's connection is healed", nil, func(s Scrape) (bool, string) {
		return gauge(t, s, servicesDrifted, nil) == 0 && s[serviceDrift] == nil &&
			gauge(t, s, endpointsStale, nil) == 0 && gauge(t, s, endpointsMissing, nil) == 0, driftSummary(s)
	})
	t.Logf("drift gone %s after healing", time.Since(healed).Round(time.Millisecond))
	cp.WaitNFTServicePort(10*time.Second, ns, name, "tcp", "http", false, newAddrs)
	checkNoDrift(t, waitConverged(t, e, cp, "every service port checked after healing"), "after healing")

	// The other form: ClientIP session affinity puts each endpoint in a chain of its own behind
	// a numgen vmap. Black-holed again, one of its 3 endpoints replaced in the API: 1 stale,
	// 1 missing.
	const sticky = "sticky"
	cp.CreateService(httpService(ns, sticky, "10.96.0.55", func(spec *corev1.ServiceSpec) {
		spec.SessionAffinity = corev1.ServiceAffinityClientIP
	}))
	stickyEps, stickyAddrs := remoteEndpoints(6, 1, 3)
	cp.ApplySlice(EndpointSlice(ns, sticky, sticky+"-1", httpSlicePorts, stickyEps))
	cp.WaitNFTServicePort(30*time.Second, ns, sticky, "tcp", "http", false, stickyAddrs)
	waitConverged(t, e, cp, "lab/sticky with 3 endpoints checked without drift")
	t.Logf("kube-proxy's fault proxy: %s", cp.Blackhole())
	replaced, _ := remoteEndpoints(6, 2, 4)
	cp.ApplySlice(EndpointSlice(ns, sticky, sticky+"-1", httpSlicePorts, replaced))
	stale, missing = driftLabels(ns, sticky, "stale"), driftLabels(ns, sticky, "missing")
	s = e.Poll(t, timeout, "lab/sticky drifting with 1 stale and 1 missing endpoint", nil, func(s Scrape) (bool, string) {
		return gauge(t, s, servicesDrifted, nil) == 1 && gauge(t, s, serviceDrift, stale) == 1 && gauge(t, s, serviceDrift, missing) == 1, driftSummary(s)
	})
	checkValue(t, s, endpointsStale, nil, 1)
	checkValue(t, s, endpointsMissing, nil, 1)
	t.Logf("kube-proxy's fault proxy: %s", cp.Heal())
	e.Poll(t, 30*time.Second, "no drift once healed again", nil, func(s Scrape) (bool, string) {
		return gauge(t, s, servicesDrifted, nil) == 0 && s[serviceDrift] == nil, driftSummary(s)
	})
	checkNoDrift(t, waitConverged(t, e, cp, "every service port checked after healing again"), "after healing again")

	// One local endpoint's element taken out of the local- chain's map only.
	testLocalChainJumpRemoved(t, cp, e, true)
	t.Logf("TestDriftNFTables took %s", time.Since(start).Round(time.Millisecond))
}
