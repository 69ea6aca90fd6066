//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/proxyhealth/proxyhealth/internal/ipvs"
	"github.com/proxyhealth/proxyhealth/internal/ipvs/ipvstest"
	"github.com/proxyhealth/proxyhealth/internal/kpcapture"
)

// kubernetesVirtualServer is the default/kubernetes Service's virtual server: kube-proxy's
// first sync in IPVS mode writes it.
const kubernetesVirtualServer = "10.96.0.1:443/TCP"

// ipvsExporterArgs read IPVS at the lab's pace: IPVS sends no notification, and the exporter
// reads it when kube-proxy reports a sync (its metrics, polled) and at the resync interval.
func ipvsExporterArgs() []string {
	return []string{
		"--kubeproxy.poll-interval=500ms",
		"--netfilter.legacy-min-read-interval=500ms",
		"--netfilter.resync-interval=2s",
	}
}

// requireIPVS skips t unless the kernel has IPVS loaded: this machine's kernel has none, the
// kernel matrix's guests load it (make ipvs-lab).
func requireIPVS(t *testing.T) {
	t.Helper()
	ipvstest.RequireLoaded(t)
}

// VirtualServers reads the node namespace's IPVS virtual servers with their real servers, as
// the exporter reads them (labtool ipvs: internal/ipvs).
func (cp *ControlPlane) VirtualServers() []ipvs.VirtualServer {
	cp.t.Helper()
	return cp.IPVSState().VirtualServers
}

// IPVSState is VirtualServers with the addresses bound to kube-ipvs0, as the version matrix
// keeps them.
func (cp *ControlPlane) IPVSState() kpcapture.IPVSState {
	cp.t.Helper()
	out := cp.Lab.MustExec(cp.Lab.Node, labtoolBin, "ipvs", "/proc")
	var state kpcapture.IPVSState
	if err := json.Unmarshal([]byte(out), &state); err != nil {
		cp.t.Fatalf("labtool ipvs: %v\n%s", err, out)
	}
	return state
}

// weighted is, per virtual server ("10.96.0.10:53/UDP"), the real servers kube-proxy sends new
// connections to (weight above 0), "ip:port", sorted: its answer of what each should hold.
func weighted(servers []ipvs.VirtualServer) map[string][]string {
	out := map[string][]string{}
	for _, vs := range servers {
		eps := []string{}
		for _, rs := range vs.RealServers {
			if rs.Weight > 0 {
				eps = append(eps, rs.Addr.String())
			}
		}
		out[vs.Key.String()] = sortedCopy(eps)
	}
	return out
}

// WaitVirtualServer polls the node's IPVS until the virtual server key ("10.96.0.1:443/TCP")
// sends to exactly want (any order), and returns what it read.
func (cp *ControlPlane) WaitVirtualServer(timeout time.Duration, key string, want []string) []ipvs.VirtualServer {
	cp.t.Helper()
	want = sortedCopy(want)
	var servers []ipvs.VirtualServer
	waitFor(cp.t, timeout, fmt.Sprintf("virtual server %s with real servers %v", key, want), func() (bool, string) {
		if cp.KubeProxy != nil && cp.KubeProxy.Exited() {
			cp.t.Fatalf("kube-proxy exited")
		}
		servers = cp.VirtualServers()
		got, ok := weighted(servers)[key]
		return ok && equalStrings(got, want), fmt.Sprintf("found=%v %v", ok, got)
	})
	return servers
}

// TestDriftCutOffIPVS is TestDriftCutOff in kube-proxy's IPVS mode, where each Service port is
// a virtual server per address (here the cluster IP) holding its endpoints as real servers.
// The drift the exporter reports while kube-proxy is cut off from the API is held to
// kube-proxy's own answer: per virtual server, the real servers it sent to while cut off and
// those it sends to once healed. The Services are TestDriftCutOff's, in the shapes IPVS mode
// programs differently:
//
//   - cutoff/local-only, internalTrafficPolicy: Local with remote endpoints only: its virtual
//     server holds none (IPVS mode's fall back to the cluster endpoints, kubernetes#97081,
//     finds none for a port whose traffic all follows the Local policy); while cut off a ready
//     endpoint on this node is added and a remote one turns not ready: 1 missing;
//   - cutoff/two-families, an IPv4 slice (port 8787) and an IPv6 one this node ignores; while
//     cut off the IPv4 slice loses its remote endpoint: 1 stale;
//   - cutoff/renumbered, internalTrafficPolicy: Local, endpoints serving and terminating, one
//     on this node; while cut off its port is renumbered from 80 to 6015: virtual servers are
//     keyed by port number, so the one at 6015 is missing with its endpoint and the one at 80
//     is an orphan (proxyhealth_rules_orphan_chains).
//
// Then draining: a real TCP connection held open through a Service's virtual server to one of
// its endpoints, and that endpoint removed. kube-proxy keeps the real server at weight 0 while
// the connection lasts, and the exporter does not call it stale.
//
// The kernel of this machine may have no IPVS; the kernel matrix's guests run this test with
// the control plane inside (make ipvs-lab).
func TestDriftCutOffIPVS(t *testing.T) {
	requireKube(t)
	requireExporter(t)
	requireIPVS(t)
	start := time.Now()
	l := newLabRules(t, labRawRules)
	cp := StartControlPlane(t, l, ControlPlaneOptions{NoKubeProxy: true})
	cp.StartKubeProxy(KubeProxyOptions{Mode: "ipvs"})
	kubeconfig := cp.readOnlyKubeconfig("proxyhealth.kubeconfig", apiserverAddr)
	e := l.StartExporter("proxyhealth", driftExporterPort, nil, append(driftExporterArgs(kubeconfig), ipvsExporterArgs()...)...)
	s := waitConverged(t, e, cp, "the exporter's API view synced and every service port checked")
	checkValue(t, s, "proxyhealth_proxy_mode", map[string]string{"mode": "ipvs"}, 1)
	_, metrics, err := cp.KubeProxyGet(kubeProxyMetrics, "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^kubernetes_build_info\{.*git_version="([^"]*)"`).FindStringSubmatch(metrics)
	if m == nil {
		t.Fatalf("kube-proxy's metrics have no kubernetes_build_info")
	}
	e.WaitValue(t, 10*time.Second, "proxyhealth_kubeproxy_build_info", map[string]string{"version": m[1]}, 1)
	t.Logf("control plane (%s), kube-proxy %s (ipvs) and exporter synced in %s", cp.Bins.Version, m[1], time.Since(start).Round(time.Millisecond))

	local := func(ip string) LabEndpoint { return LabEndpoint{IP: ip, NodeName: labNodeName, Zone: "zone-a"} }
	remote := func(ip string) LabEndpoint { return LabEndpoint{IP: ip, NodeName: "node-b", Zone: "zone-b"} }
	itpLocal := func(spec *corev1.ServiceSpec) {
		spec.InternalTrafficPolicy = ptrTo(corev1.ServiceInternalTrafficPolicyLocal)
	}
	vips := map[string]string{"10.96.0.71": "local-only", "10.96.0.72": "two-families", "10.96.0.73": "renumbered"}

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

	waitFor(t, 30*time.Second, "kube-proxy's virtual servers for the cutoff Services", func() (bool, string) {
		got := weighted(cp.VirtualServers())
		want := map[string][]string{
			"10.96.0.71:80/TCP": {},
			"10.96.0.72:80/TCP": {"10.244.8.1:8787", "10.244.8.2:8787"},
			"10.96.0.73:80/TCP": {"10.244.9.1:8080"},
		}
		for k, w := range want {
			if !equalStrings(got[k], w) {
				return false, fmt.Sprintf("%v", got)
			}
		}
		return true, ""
	})
	waitConverged(t, e, cp, "the cutoff Services checked without drift")
	orphansBefore := gauge(t, e.Scrape(t), orphanChains, nil)

	t.Logf("kube-proxy's fault proxy: %s", cp.Blackhole())
	t.Cleanup(func() { cp.Heal() })
	cp.ApplySlice(EndpointSlice(cutoffNS, "local-only", "local-only-1", httpSlicePorts,
		[]LabEndpoint{remote("10.244.7.1"), {IP: "10.244.7.2", NodeName: "node-b", Zone: "zone-b", NotReady: true}, local("10.244.7.3")}))
	cp.ApplySlice(EndpointSlice(cutoffNS, "two-families", "two-families-v4", v4Ports, []LabEndpoint{local("10.244.8.1")}))
	cp.renumberPort(cutoffNS, "renumbered", 6015)

	// What the exporter reports, once every change has lasted the grace period and IPVS has
	// been read since.
	want := map[string]staleMissing{"local-only": {0, 1}, "two-families": {1, 0}, "renumbered": {0, 1}}
	var reported map[string]staleMissing
	s = e.Poll(t, driftGrace+2*driftCheckInterval+30*time.Second, "the three cutoff Services drifting", nil, func(s Scrape) (bool, string) {
		reported = driftByService(s, cutoffNS)
		return gauge(t, s, servicesDrifted, nil) == 3 && mapsEqual(reported, want) && gauge(t, s, orphanChains, nil) == orphansBefore+1,
			driftSummary(s) + "\n" + s.Series(orphanChains)
	})
	checkValue(t, s, serviceDrift, map[string]string{"service_namespace": cutoffNS, "service_name": "renumbered",
		"service_port": "6015", "protocol": "tcp", "kind": "missing"}, 1)
	reportedOrphans := gauge(t, s, orphanChains, nil) - orphansBefore
	frozen := weighted(cp.VirtualServers())
	t.Logf("while cut off: virtual servers %v, the exporter's drift %v and %g new orphan", frozen, reported, reportedOrphans)

	t.Logf("kube-proxy's fault proxy: %s", cp.Heal())
	e.Poll(t, 60*time.Second, "no drift once kube-proxy's connection is healed", nil, func(s Scrape) (bool, string) {
		return gauge(t, s, servicesDrifted, nil) == 0 && s[serviceDrift] == nil && gauge(t, s, orphanChains, nil) == orphansBefore, driftSummary(s)
	})
	checkNoDrift(t, waitConverged(t, e, cp, "every service port checked after healing"), "after healing")
	healed := weighted(cp.VirtualServers())

	// kube-proxy's own answer, per virtual server of the cutoff Services: what it holds once
	// healed and did not while cut off (missing), the reverse (stale), and the virtual servers
	// it had while cut off and deleted once healed (orphans).
	own := map[string]staleMissing{}
	ownOrphans := 0
	for key, eps := range frozen {
		name, ok := vips[strings.Split(key, ":")[0]]
		if !ok {
			continue
		}
		h, kept := healed[key]
		if !kept {
			ownOrphans++
			continue
		}
		d := own[name]
		for _, ep := range eps {
			if !slices.Contains(h, ep) {
				d.stale++
			}
		}
		own[name] = d
	}
	for key, eps := range healed {
		name, ok := vips[strings.Split(key, ":")[0]]
		if !ok {
			continue
		}
		d := own[name]
		for _, ep := range eps {
			if !slices.Contains(frozen[key], ep) {
				d.missing++
			}
		}
		own[name] = d
	}
	for name := range own {
		if own[name] == (staleMissing{}) {
			delete(own, name)
		}
	}
	if !mapsEqual(reported, own) || reportedOrphans != float64(ownOrphans) {
		t.Errorf("while kube-proxy was cut off the exporter reported %v and %g orphans; kube-proxy's virtual servers went from %v to %v once healed (%v, %d orphans)",
			reported, reportedOrphans, frozen, healed, own, ownOrphans)
	}
	t.Logf("healed: virtual servers %v", healed)

	t.Run("draining", func(t *testing.T) { testIPVSDraining(t, cp.In(t), e) })
	t.Logf("TestDriftCutOffIPVS took %s", time.Since(start).Round(time.Millisecond))
}

const orphanChains = "proxyhealth_rules_orphan_chains"

// testIPVSDraining holds a TCP connection open from the remote node C through a Service's
// virtual server to one of its endpoints (a server in B that keeps connections), removes that
// endpoint from the Service, and checks that kube-proxy keeps the real server at weight 0 with
// the connection on it while the exporter, having read IPVS since, reports no drift for longer
// than the grace period.
func testIPVSDraining(t *testing.T, cp *ControlPlane, e *Exporter) {
	l := cp.Lab
	const name, vip = "draining", "10.96.0.74"
	key := vip + ":80/TCP"
	server := l.Start(l.B, "serve-hold", labtoolBin, "serve-hold", "0.0.0.0:"+podPort)
	waitFor(t, 5*time.Second, "serve-hold ready", func() (bool, string) {
		b, _ := os.ReadFile(server.log)
		return strings.Contains(string(b), "ready"), string(b)
	})
	here := func(ip string) LabEndpoint { return LabEndpoint{IP: ip, NodeName: labNodeName, Zone: labNodeZone} }
	cp.CreateService(httpService(cutoffNS, name, vip, nil))
	cp.ApplySlice(EndpointSlice(cutoffNS, name, name+"-1", httpSlicePorts, []LabEndpoint{here(podB), here(podB2)}))
	cp.WaitVirtualServer(30*time.Second, key, []string{podB + ":" + podPort, podB2 + ":" + podPort})
	waitConverged(t, e, cp, "cutoff/draining checked without drift")

	held := l.Start(l.C, "hold", labtoolBin, "hold", vip+":80", "--for", "5m")
	waitFor(t, 15*time.Second, "a connection from C through "+key+" established", func() (bool, string) {
		b, _ := os.ReadFile(held.log)
		return holdRE.Match(b), string(b)
	})
	var endpoint, other string
	waitFor(t, 10*time.Second, "IPVS counting the connection on one real server of "+key, func() (bool, string) {
		for _, vs := range cp.VirtualServers() {
			if vs.Key.String() != key {
				continue
			}
			for _, rs := range vs.RealServers {
				if rs.ActiveConns > 0 {
					endpoint = rs.Addr.Addr().String()
				}
			}
			return endpoint != "", fmt.Sprintf("%+v", vs.RealServers)
		}
		return false, "no virtual server " + key
	})
	other = podB
	if endpoint == podB {
		other = podB2
	}
	t.Logf("the held connection goes to %s", endpoint)

	cp.ApplySlice(EndpointSlice(cutoffNS, name, name+"-1", httpSlicePorts, []LabEndpoint{here(other)}))
	var drain ipvs.RealServer
	waitFor(t, 30*time.Second, "kube-proxy keeping "+endpoint+" at weight 0 while its connection lasts", func() (bool, string) {
		for _, vs := range cp.VirtualServers() {
			if vs.Key.String() != key {
				continue
			}
			for _, rs := range vs.RealServers {
				if rs.Addr.Addr().String() == endpoint {
					drain = rs
					return rs.Weight == 0 && rs.ActiveConns > 0, fmt.Sprintf("%+v", vs.RealServers)
				}
			}
			return false, fmt.Sprintf("%+v", vs.RealServers)
		}
		return false, "no virtual server " + key
	})
	drained := time.Now()
	t.Logf("kube-proxy keeps %s at weight %d with %d active connection(s)", drain.Addr, drain.Weight, drain.ActiveConns)

	// Once the exporter has read IPVS twice since the weight went to 0, for longer than the
	// grace period no scrape shows drift. Before that read it may rightly report the endpoint
	// stale: kube-proxy kept it at its full weight for as long as its sync took, which under
	// emulation can outlast the grace period.
	reads := func(s Scrape) float64 {
		return s.Sum("proxyhealth_netfilter_reads_total", map[string]string{"source": "ipvs"})
	}
	base := reads(e.Scrape(t))
	e.Poll(t, 30*time.Second, "the exporter reading IPVS twice after the weight went to 0", nil, func(s Scrape) (bool, string) {
		return reads(s) >= base+2, s.Series("proxyhealth_netfilter_reads_total")
	})
	n := watchScrapes(t, e, driftGrace+3*driftCheckInterval, func(s Scrape, _ time.Time) { checkNoDrift(t, s, "draining") })
	// kube-proxy still drains it: the check above saw the real server at weight 0 throughout.
	still := false
	for _, vs := range cp.VirtualServers() {
		for _, rs := range vs.RealServers {
			if vs.Key.String() == key && rs.Addr == drain.Addr && rs.Weight == 0 && rs.ActiveConns > 0 {
				still = true
			}
		}
	}
	if !still {
		t.Errorf("%s stopped draining during the check: it proved nothing", drain.Addr)
	}
	t.Logf("no drift in %d scrapes over %s while %s drained", n, time.Since(drained).Round(time.Millisecond), drain.Addr)
}
