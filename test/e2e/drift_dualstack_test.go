//go:build e2e

package e2e

import (
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/proxyhealth/proxyhealth/internal/verdict"
)

// TestDriftDualStack is incident 3 on a dual-stack cluster, with kube-proxy in iptables and in
// nftables mode (a lab each): a RequireDualStack Service (IPv4 first) and a PreferDualStack one
// (IPv6 first), each with an IPv4 and an IPv6 EndpointSlice, programmed by the real kube-proxy
// in both families' rules (ip6tables' nat table, table ip6 kube-proxy). With kube-proxy's API
// connection black-holed, the first Service's IPv6 endpoints change (2 deleted, 3 added) and the
// second loses an IPv6 endpoint and gains an IPv4 one. The exporter's scrape counts exactly
// that, and its /status splits each finding's counts by family (by_family); healed, it all
// clears.
func TestDriftDualStack(t *testing.T) {
	requireKube(t)
	requireExporter(t)
	for _, mode := range []string{"iptables", "nftables"} {
		t.Run(mode, func(t *testing.T) { testDriftDualStack(t, mode) })
	}
}

// dualStackPort is one family's side of a dual-stack lab Service: what its rules must hold.
type dualStackPort struct {
	ipv6  bool
	addrs []string // ip:port, [ip]:port for IPv6
}

func testDriftDualStack(t *testing.T, mode string) {
	start := time.Now()
	l := newLabRules(t, labRawRules)
	cp := StartControlPlane(t, l, ControlPlaneOptions{NoKubeProxy: true, DualStack: true})
	cp.StartKubeProxy(KubeProxyOptions{Mode: mode})
	if mode == "nftables" {
		cp.WaitNFTServicePort(60*time.Second, "default", "kubernetes", "tcp", "https", false, []string{uplinkN + ":6443"})
	}
	kubeconfig := cp.readOnlyKubeconfig("proxyhealth.kubeconfig", apiserverAddr)
	e := l.StartExporter("proxyhealth", driftExporterPort, nil, driftExporterArgs(kubeconfig)...)
	s := waitConverged(t, e, cp, "the exporter's API view synced and every service port checked")
	checkValue(t, s, "proxyhealth_proxy_mode", map[string]string{"mode": mode}, 1)
	t.Logf("dual-stack control plane, kube-proxy (%s) and exporter synced in %s", mode, time.Since(start).Round(time.Millisecond))

	// waitProgrammed waits until kube-proxy's rules of one family hold exactly want for a
	// lab Service's http port.
	waitProgrammed := func(name string, p dualStackPort) {
		t.Helper()
		switch {
		case mode == "nftables" && p.ipv6:
			cp.WaitNFTFamilyServicePort(30*time.Second, "ip6", "lab", name, "tcp", "http", false, p.addrs)
		case mode == "nftables":
			cp.WaitNFTFamilyServicePort(30*time.Second, "ip", "lab", name, "tcp", "http", false, p.addrs)
		case p.ipv6:
			cp.WaitServicePortEndpoints6(30*time.Second, "lab/"+name+":http", "tcp", p.addrs)
		default:
			cp.WaitServicePortEndpoints(30*time.Second, "lab/"+name+":http", "tcp", p.addrs)
		}
	}
	// programmed reads what one family's rules hold for a lab Service's http port now.
	programmed := func(name string, ipv6 bool) []string {
		t.Helper()
		var eps []string
		switch {
		case mode == "nftables":
			family := "ip"
			if ipv6 {
				family = "ip6"
			}
			eps, _ = NFTFamilyChainEndpoints(cp.NFTKubeProxyFamily(family), family, nftServiceChain("service-", "lab", name, "tcp", "http"))
		case ipv6:
			eps, _ = ServicePortEndpoints(cp.Ip6tablesSave("nat"), "lab/"+name+":http", "tcp")
		default:
			eps, _ = ServicePortEndpoints(cp.IptablesSave("nat"), "lab/"+name+":http", "tcp")
		}
		return eps
	}

	const ns, require, prefer = "lab", "dual-require", "dual-prefer"
	cp.CreateService(httpService(ns, require, "10.96.0.70", func(spec *corev1.ServiceSpec) {
		spec.IPFamilyPolicy = ptrTo(corev1.IPFamilyPolicyRequireDualStack)
		spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
		spec.ClusterIPs = []string{"10.96.0.70", "fd00:10:96::70"}
	}))
	cp.CreateService(httpService(ns, prefer, "fd00:10:96::71", func(spec *corev1.ServiceSpec) {
		spec.IPFamilyPolicy = ptrTo(corev1.IPFamilyPolicyPreferDualStack)
		spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol, corev1.IPv4Protocol}
		spec.ClusterIPs = []string{"fd00:10:96::71", "10.96.0.71"}
	}))
	requireV4, requireV4Addrs := remoteEndpoints(5, 1, 3)
	requireV6, requireV6Addrs := remoteEndpoints6(5, 1, 3)
	preferV4, preferV4Addrs := remoteEndpoints(6, 1, 2)
	preferV6, preferV6Addrs := remoteEndpoints6(6, 1, 2)
	cp.ApplySlice(EndpointSlice(ns, require, require+"-v4", httpSlicePorts, requireV4))
	cp.ApplySlice(EndpointSlice(ns, require, require+"-v6", httpSlicePorts, requireV6))
	cp.ApplySlice(EndpointSlice(ns, prefer, prefer+"-v4", httpSlicePorts, preferV4))
	cp.ApplySlice(EndpointSlice(ns, prefer, prefer+"-v6", httpSlicePorts, preferV6))
	waitProgrammed(require, dualStackPort{false, requireV4Addrs})
	waitProgrammed(require, dualStackPort{true, requireV6Addrs})
	waitProgrammed(prefer, dualStackPort{false, preferV4Addrs})
	waitProgrammed(prefer, dualStackPort{true, preferV6Addrs})
	waitConverged(t, e, cp, "both dual-stack Services checked in both families without drift")

	t.Logf("kube-proxy's fault proxy: %s", cp.Blackhole())
	t.Cleanup(func() { cp.Heal() })
	// lab/dual-require: IPv6 ::1 and ::2 deleted, ::4 to ::6 added; IPv4 as it was.
	// lab/dual-prefer: IPv6 ::2 deleted; IPv4 10.244.6.3 added.
	newRequireV6, newRequireV6Addrs := remoteEndpoints6(5, 3, 6)
	newPreferV6, newPreferV6Addrs := remoteEndpoints6(6, 1, 1)
	newPreferV4, newPreferV4Addrs := remoteEndpoints(6, 1, 3)
	sent := time.Now()
	cp.ApplySlice(EndpointSlice(ns, require, require+"-v6", httpSlicePorts, newRequireV6))
	cp.ApplySlice(EndpointSlice(ns, prefer, prefer+"-v6", httpSlicePorts, newPreferV6))
	cp.ApplySlice(EndpointSlice(ns, prefer, prefer+"-v4", httpSlicePorts, newPreferV4))
	changed := time.Now()

	timeout := driftGrace + 2*driftCheckInterval + 2*time.Second
	s = e.Poll(t, timeout, "lab/dual-require 2 stale and 3 missing, lab/dual-prefer 1 and 1", nil, func(s Scrape) (bool, string) {
		drifted := gauge(t, s, servicesDrifted, nil)
		if drifted != 0 && time.Since(sent) < driftGrace {
			t.Errorf("drift reported %s after the change was sent, before the %s grace period:\n%s",
				time.Since(sent).Round(time.Millisecond), driftGrace, driftSummary(s))
		}
		return drifted == 2 &&
			gauge(t, s, serviceDrift, driftLabels(ns, require, "stale")) == 2 &&
			gauge(t, s, serviceDrift, driftLabels(ns, require, "missing")) == 3 &&
			gauge(t, s, serviceDrift, driftLabels(ns, prefer, "stale")) == 1 &&
			gauge(t, s, serviceDrift, driftLabels(ns, prefer, "missing")) == 1, driftSummary(s)
	})
	t.Logf("drift reported %s after the change (grace %s, check interval %s)",
		time.Since(changed).Round(time.Millisecond), driftGrace, driftCheckInterval)
	checkValue(t, s, endpointsStale, nil, 3)
	checkValue(t, s, endpointsMissing, nil, 4)
	checkValue(t, s, servicesChecked, nil, float64(cp.apiServicePorts()))
	checkValue(t, s, "proxyhealth_rules_orphan_chains", nil, 0)
	if n := len(s[serviceDrift].GetMetric()); n != 4 {
		t.Errorf("%s has %d series, want 4:\n%s", serviceDrift, n, s.Series(serviceDrift))
	}
	// The rules really are stale, in both families: still what was programmed before.
	for _, c := range []struct {
		name string
		p    dualStackPort
	}{
		{require, dualStackPort{false, requireV4Addrs}}, {require, dualStackPort{true, requireV6Addrs}},
		{prefer, dualStackPort{false, preferV4Addrs}}, {prefer, dualStackPort{true, preferV6Addrs}},
	} {
		if got := programmed(c.name, c.p.ipv6); !equalStrings(got, sortedCopy(c.p.addrs)) {
			t.Errorf("while black-holed lab/%s (IPv6 %v) should keep %v, got %v", c.name, c.p.ipv6, c.p.addrs, got)
		}
	}

	// /status: one stale_rules finding per Service, each endpoint named with its family.
	wantFindings := map[string]struct {
		stale, missing       []string
		programmed, expected int
		byFamily             []verdict.FamilyDrift
	}{
		require: {[]string{"[fd00:10:244:5::1]:8080", "[fd00:10:244:5::2]:8080"},
			[]string{"[fd00:10:244:5::4]:8080", "[fd00:10:244:5::5]:8080", "[fd00:10:244:5::6]:8080"}, 6, 7,
			[]verdict.FamilyDrift{{Family: "IPv6", StaleCount: 2, MissingCount: 3}}},
		prefer: {[]string{"[fd00:10:244:6::2]:8080"}, []string{"10.244.6.3:8080"}, 4, 4,
			[]verdict.FamilyDrift{{Family: "IPv4", MissingCount: 1}, {Family: "IPv6", StaleCount: 1}}},
	}
	var report labReport
	waitFor(t, 20*time.Second, "/status: stale_rules for both dual-stack Services", func() (bool, string) {
		report = e.status(t)
		n := 0
		for _, f := range report.Findings {
			if f.Cause == "stale_rules" {
				n++
			}
		}
		return n == 2, report.raw
	})
	for _, f := range report.Findings {
		if f.Cause != "stale_rules" || f.Service == nil {
			t.Errorf("/status: unexpected finding %s: %s", f.Cause, f.Summary)
			continue
		}
		want, ok := wantFindings[f.Service.Name]
		ev := f.Evidence
		if !ok || f.Service.Namespace != ns || f.Service.Port != 80 ||
			!slices.Equal(ev.Stale, want.stale) || !slices.Equal(ev.Missing, want.missing) ||
			ev.StaleCount != len(want.stale) || ev.MissingCount != len(want.missing) ||
			ev.Programmed != want.programmed || ev.Expected != want.expected || !slices.Equal(ev.ByFamily, want.byFamily) {
			t.Errorf("/status: %s finding %+v, want stale %v, missing %v, %d programmed, %d expected, by family %+v\n%s",
				f.Service.Name, ev, want.stale, want.missing, want.programmed, want.expected, want.byFamily, report.raw)
		}
		t.Logf("/status: %s", f.Summary)
	}

	t.Logf("kube-proxy's fault proxy: %s", cp.Heal())
	healed := time.Now()
	e.Poll(t, 30*time.Second, "no drift once kube-proxy's connection is healed", nil, func(s Scrape) (bool, string) {
		return gauge(t, s, servicesDrifted, nil) == 0 && s[serviceDrift] == nil &&
			gauge(t, s, endpointsStale, nil) == 0 && gauge(t, s, endpointsMissing, nil) == 0, driftSummary(s)
	})
	t.Logf("drift gone %s after healing", time.Since(healed).Round(time.Millisecond))
	waitProgrammed(require, dualStackPort{false, requireV4Addrs})
	waitProgrammed(require, dualStackPort{true, newRequireV6Addrs})
	waitProgrammed(prefer, dualStackPort{false, newPreferV4Addrs})
	waitProgrammed(prefer, dualStackPort{true, newPreferV6Addrs})
	checkNoDrift(t, waitConverged(t, e, cp, "every service port checked after healing"), "after healing")
	waitFor(t, 20*time.Second, "/status without stale_rules once healed", func() (bool, string) {
		r := e.status(t)
		return !slices.Contains(r.causes(), "stale_rules"), r.raw
	})
	testIPv6UnrepliedFlows(t, cp, e, mode)
	t.Logf("TestDriftDualStack/%s took %s", mode, time.Since(start).Round(time.Millisecond))
}

// testIPv6UnrepliedFlows is incident 1 in IPv6: pods A and B get IPv6 addresses on the node's
// bridge, lab/web6 (IPv6 only) has B as its endpoint, and with bridge-nf-call-ip6tables=0 B's
// replies to A bypass the node's conntrack, so A's connections to the IPv6 cluster IP stay
// unreplied. The exporter attributes them to lab/web6 with reason same_bridge, as it does IPv4
// flows (TestExporter/incident1_same_bridge): first as open unreplied flows, then exactly 3
// when they end.
func testIPv6UnrepliedFlows(t *testing.T, cp *ControlPlane, e *Exporter, mode string) {
	l := cp.Lab
	const gw6, podA6, podB6, vip6 = "fd00:10:244:1::1", "fd00:10:244:1::2", "fd00:10:244:1::3", "fd00:10:96::80"
	for _, ns := range []string{l.A, l.B} {
		l.MustExec(ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=0", "net.ipv6.conf.default.disable_ipv6=0")
	}
	l.MustExec(l.Node, "sysctl", "-qw", "net.ipv6.conf.all.forwarding=1")
	l.ip(l.Node, "addr", "add", gw6+"/64", "dev", "cni0", "nodad")
	l.ip(l.A, "addr", "add", podA6+"/64", "dev", "eth0", "nodad")
	l.ip(l.A, "-6", "route", "add", "default", "via", gw6)
	l.ip(l.B, "addr", "add", podB6+"/64", "dev", "eth0", "nodad")
	l.ServeTCP(l.B, "["+podB6+"]:"+podPort)

	const ns, name = "lab", "web6"
	cp.CreateService(httpService(ns, name, vip6, func(spec *corev1.ServiceSpec) {
		spec.IPFamilyPolicy = ptrTo(corev1.IPFamilyPolicySingleStack)
		spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol}
	}))
	cp.ApplySlice(EndpointSlice(ns, name, name+"-1", httpSlicePorts, []LabEndpoint{{IP: podB6, NodeName: labNodeName, Zone: labNodeZone}}))
	want := []string{"[" + podB6 + "]:" + podPort}
	if mode == "nftables" {
		cp.WaitNFTFamilyServicePort(30*time.Second, "ip6", ns, name, "tcp", "http", false, want)
	} else {
		cp.WaitServicePortEndpoints6(30*time.Second, ns+"/"+name+":http", "tcp", want)
	}
	vip := "[" + vip6 + "]:80"
	// With bridged IPv6 through the node's netfilter, the Service works.
	l.Sysctl("net.bridge.bridge-nf-call-ip6tables=1")
	if ok := l.Connect(l.A, vip, 1, 2*time.Second); ok != 1 {
		t.Fatalf("bridge-nf-call-ip6tables=1: the connection from A to lab/web6 failed")
	}

	web6 := map[string]string{"service_namespace": ns, "service_name": name, "service_port": "80", "protocol": "tcp", "reason": "same_bridge"}
	anyWeb6 := map[string]string{"service_name": name}
	s := e.Scrape(t)
	base, baseAny := s.Sum(unrepliedTotal, web6), s.Sum(unrepliedTotal, anyWeb6)
	l.Sysctl("net.bridge.bridge-nf-call-ip6tables=0")
	t.Cleanup(func() { l.Sysctl("net.bridge.bridge-nf-call-ip6tables=1") })
	const n = 3
	if ok := l.Connect(l.A, vip, n, 2*time.Second); ok != 0 {
		t.Fatalf("bridge-nf-call-ip6tables=0: %d of %d connections to lab/web6 succeeded, want 0", ok, n)
	}
	e.Poll(t, 5*time.Second, "open same_bridge unreplied IPv6 flows of lab/web6 >= 1", nil, func(s Scrape) (bool, string) {
		return s.Sum(openUnreplied, web6) >= 1, s.Series(openUnreplied)
	})
	// Expired IPv6 entries are reaped by a dump of that family.
	reap := func() { l.MustExec(l.Node, "conntrack", "-L", "-f", "ipv6") }
	s = e.Poll(t, 20*time.Second, fmt.Sprintf("%s of lab/web6 same_bridge to rise by %d", unrepliedTotal, n), reap, func(s Scrape) (bool, string) {
		return s.Sum(unrepliedTotal, web6)-base >= n, s.Series(unrepliedTotal)
	})
	if got := s.Sum(unrepliedTotal, web6) - base; got != n {
		t.Errorf("%s of lab/web6 same_bridge rose by %g, want exactly %d (one per connection)", unrepliedTotal, got, n)
	}
	if got := s.Sum(unrepliedTotal, anyWeb6) - baseAny; got != n {
		t.Errorf("all unreplied flows of lab/web6 rose by %g, want %d (all same_bridge):\n%s", got, n, s.Series(unrepliedTotal))
	}
}

// remoteEndpoints6 is remoteEndpoints in IPv6: fd00:10:244:<subnet>::<from..to> on node-b
// (zone-b), and their [ip]:8080 addresses.
func remoteEndpoints6(subnet, from, to int) ([]LabEndpoint, []string) {
	var eps []LabEndpoint
	var addrs []string
	for i := from; i <= to; i++ {
		ip := fmt.Sprintf("fd00:10:244:%d::%x", subnet, i)
		eps = append(eps, LabEndpoint{IP: ip, NodeName: "node-b", Zone: "zone-b"})
		addrs = append(addrs, "["+ip+"]:8080")
	}
	return eps, addrs
}
