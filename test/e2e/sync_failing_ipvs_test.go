//go:build e2e

package e2e

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/proxyhealth/proxyhealth/internal/testsupport/prereq"
)

// TestSyncFailingIPVS is TestSyncFailing in kube-proxy's IPVS mode, on a node that lacks the
// xt_ipvs match module (kubernetes#142068): the test takes xt_ipvs out of the guest's module
// tree before anything loads it, and TestSyncFailing's wrapper of iptables-restore adds
// `-m ipvs` to what kube-proxy restores, so every restore fails as on such a node. kube-proxy's
// IPVS proxier needs xt_ipvs itself only for a LoadBalancer Service whose source ranges leave
// out the node, which the lab has none of.
//
// kube-proxy's IPVS sync programs the virtual servers, their real servers, kube-ipvs0's
// addresses and the ipsets before the restore, so they follow the API whatever the restore
// does; only its iptables rules fail. The lab's Service "reach" has its endpoint on the remote
// node C, which binds the Service's cluster IP like every IPVS node's kube-ipvs0 does:
//
//   - new node (every restore fails from kube-proxy's start): the virtual servers are there and
//     the drift check finds none of them wrong, but kube-proxy's chains are empty. A connection
//     from a Pod (A) through the cluster IP works; one from the node's own address (source: the
//     cluster IP) and one from outside to the NodePort (no masquerade: the endpoint answers the
//     client directly) fail. The verdict is critical, names kube_proxy_sync_failing with the
//     count, since when, kube-proxy's error and a remedy that loads xt_ipvs, and does not say
//     the node has none of its Service rules. The module loaded, the next sync applies with no
//     restart: healthy, and both connections work.
//   - mid-life (restores fail once the rules were programmed): endpoints change and a Service
//     is deleted. The virtual servers follow the endpoints (no drift), the deleted Service's
//     virtual server stays (an orphan), and the rules written before keep traffic flowing: a
//     warning that says so. The module loaded again, it clears.
//
// The kernel of this machine has no IPVS; the IPVS lab's guests run this test (make ipvs-lab).
func TestSyncFailingIPVS(t *testing.T) {
	requireKube(t)
	requireExporter(t)
	requireIPVS(t)
	xtIPVS := hideKernelModule(t, "xt_ipvs")
	start := time.Now()
	l := newLabRules(t, labRawRules)
	cp := StartControlPlane(t, l, ControlPlaneOptions{NoKubeProxy: true})
	fault := newSyncFault(t, cp.Dir, "iptables")
	kubeconfig := cp.readOnlyKubeconfig("proxyhealth.kubeconfig", apiserverAddr)

	// reach: NodePort, its endpoint on the remote node C, which serves it and, as an IPVS
	// node, holds the cluster IP on an interface of its own.
	const ns, reachVIP, reachNodePort, reachPort = "lab", "10.96.0.85", 30085, 8081
	server := l.Start(l.C, "serve-reach", labtoolBin, "serve-tcp", fmt.Sprintf("%s:%d", podC, reachPort))
	waitFor(t, 10*time.Second, "serve-tcp ready in C", func() (bool, string) {
		b, _ := os.ReadFile(server.log)
		return strings.Contains(string(b), "ready"), string(b)
	})
	l.ip(l.C, "addr", "add", reachVIP+"/32", "dev", "lo")
	// The lab leaves loopback untracked (labRawRules); the node's own connections to a cluster
	// IP go out through lo too (the address is local, on kube-ipvs0) and need conntrack for
	// kube-proxy's masquerade, as on any node.
	l.MustExec(l.Node, "iptables", "-t", "raw", "-I", "OUTPUT", "1", "-d", reachVIP+"/32", "-j", "ACCEPT")
	reachPorts := []discoveryv1.EndpointPort{SlicePort("http", corev1.ProtocolTCP, reachPort)}
	cp.CreateService(httpService(ns, "reach", reachVIP, func(s *corev1.ServiceSpec) {
		s.Type = corev1.ServiceTypeNodePort
		s.Ports = []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(reachPort), NodePort: reachNodePort, Protocol: corev1.ProtocolTCP}}
	}))
	cp.ApplySlice(EndpointSlice(ns, "reach", "reach-1", reachPorts, []LabEndpoint{{IP: podC, NodeName: "node-b", Zone: "zone-b"}}))
	// dns: the endpoints that change mid-life; gone: the Service deleted mid-life.
	eps, _ := remoteEndpoints(5, 1, 10)
	cp.CreateService(httpService(ns, "dns", "10.96.0.80", nil))
	cp.ApplySlice(EndpointSlice(ns, "dns", "dns-1", httpSlicePorts, eps))
	goneEps, _ := remoteEndpoints(6, 1, 1)
	cp.CreateService(httpService(ns, "gone", "10.96.0.86", nil))
	cp.ApplySlice(EndpointSlice(ns, "gone", "gone-1", httpSlicePorts, goneEps))

	fault.fail(t, true)
	cp.StartKubeProxy(KubeProxyOptions{Mode: "ipvs", ToolsFirst: fault.dir, NoWaitFirstSync: true,
		ExtraArgs: []string{"--ipvs-sync-period=5s"}})
	e := l.StartExporter("proxyhealth", syncFailingExporterPort, nil,
		append(driftExporterArgs(kubeconfig), append(kubeProxyExporterArgs(cp), // with ipvsExporterArgs' IPVS reads
			"--netfilter.legacy-min-read-interval=500ms", "--netfilter.resync-interval=2s", "--status.window=1m")...)...)

	wantError := "Extension ipvs revision 0 not supported, missing kernel module?"
	wantRemedy := `the iptables-restore extension "ipvs" is not supported by this node's kernel: load its kernel module (for a match, modprobe xt_ipvs)`
	// The connections the test makes fail while the rules are missing, and the exporter may
	// rightly tell them as unreplied flows (a warning) for the status window: the verdict is
	// judged by kube_proxy_sync_failing, the other findings logged.
	check := func(what string, r syncFailingReport, neverApplied bool, severity string, want []string) {
		t.Helper()
		i := r.finding("kube_proxy_sync_failing")
		if i < 0 {
			t.Errorf("%s: no kube_proxy_sync_failing: %s", what, r.raw)
			return
		}
		f, sf := r.Findings[i], r.syncFailures(i)
		if f.Severity != severity || r.Verdict != severity || sf == nil {
			t.Errorf("%s: verdict %s, finding %s %s, want %s:\n%s", what, r.Verdict, f.Severity, f.Cause, severity, r.raw)
			return
		}
		for j, other := range r.Findings {
			if j != i {
				t.Logf("%s: also %s (%s): %s", what, other.Cause, other.Severity, other.Summary)
			}
		}
		if sf.Tool != "iptables-restore" || !strings.Contains(sf.Error, wantError) || sf.NeverApplied != neverApplied ||
			sf.Failed < 1 || sf.Total < sf.Failed || sf.Since.IsZero() || !strings.Contains(sf.Remedy, wantRemedy) {
			t.Errorf("%s: sync failures %+v", what, sf)
		}
		// The guest's kube-proxy runs an IPv6 proxier beside the IPv4 one, whose syncs apply
		// (the wrapper fails iptables-restore, not ip6tables-restore): once one has, the
		// finding names the failing family.
		rules := "kube-proxy cannot apply its iptables rules: "
		switch {
		case slices.Equal(sf.IPFamilies, []string{"IPv4"}):
			rules = "kube-proxy cannot apply its IPv4 iptables rules: "
		case len(sf.IPFamilies) > 0:
			t.Errorf("%s: failing IP families %v, want IPv4 or none named", what, sf.IPFamilies)
		}
		for _, w := range append(want, rules, wantError, wantRemedy, "restarting kube-proxy does not help") {
			if !strings.Contains(f.Summary, w) {
				t.Errorf("%s: summary %q\nwant %q in it", what, f.Summary, w)
			}
		}
		for _, not := range []string{"none of its Service rules", "no Service or endpoint change reaches", "queued change", "restart kube-proxy on this node"} {
			if strings.Contains(f.Summary, not) {
				t.Errorf("%s: summary %q says %q", what, f.Summary, not)
			}
		}
		t.Logf("%s: %s: %s", what, f.Severity, f.Summary)
		t.Logf("%s: %d failed in a row (kube-proxy's total %d) since %s", what, sf.Failed, sf.Total, sf.Since.Format(time.RFC3339))
	}
	reachVS, dnsVS, goneVS := reachVIP+":80/TCP", "10.96.0.80:80/TCP", "10.96.0.86:80/TCP"
	nodeToVIP := connection{l.Node, "from the node's own address to the cluster IP", fmt.Sprintf("%s:80", reachVIP)}
	outsideToNodePort := connection{l.C, "from outside (C) to the NodePort", fmt.Sprintf("%s:%d", uplinkN, reachNodePort)}
	podToVIP := connection{l.A, "from Pod A to the cluster IP", fmt.Sprintf("%s:80", reachVIP)}

	// The new node.
	r := e.waitForSyncFailingStatus(t, 120*time.Second, "/status: kube_proxy_sync_failing with kube-proxy's error", func(r syncFailingReport) bool {
		i := r.finding("kube_proxy_sync_failing")
		return r.Verdict == "critical" && i >= 0 && r.syncFailures(i) != nil && r.syncFailures(i).Error != ""
	})
	t.Logf("new node: critical %s after the lab started", time.Since(start).Round(time.Second))
	check("new node", r, true, "critical", []string{
		"every sync since it started",
		"its IPVS virtual servers are programmed, but none of its iptables rules since it started; on a new or rebooted node its chains are empty",
	})
	vs := weighted(cp.VirtualServers())
	if !equalStrings(vs[reachVS], []string{fmt.Sprintf("%s:%d", podC, reachPort)}) || len(vs[dnsVS]) != 10 || len(vs[goneVS]) != 1 {
		t.Errorf("new node: kube-proxy's virtual servers %v: want them programmed although every restore fails", vs)
	}
	s := waitConverged(t, e, cp, "the exporter comparing every virtual server, with no drift")
	checkValue(t, s, "proxyhealth_proxy_mode", map[string]string{"mode": "ipvs"}, 1)
	if nat := cp.IptablesSave("nat"); strings.Contains(nat, "-A KUBE-SERVICES") || strings.Contains(nat, "-A KUBE-POSTROUTING") {
		t.Errorf("new node: kube-proxy's nat chains are not empty:\n%s", nat)
	}
	podToVIP.want(t, true)
	nodeToVIP.want(t, false)
	outsideToNodePort.want(t, false)

	// The module loaded: the next sync (every --ipvs-sync-period in IPVS mode) applies.
	xtIPVS.load(t)
	mended := time.Now()
	r = waitSyncsApply(t, e)
	t.Logf("new node mended: %s %s after xt_ipvs was loaded", r.Verdict, time.Since(mended).Round(time.Millisecond))
	nodeToVIP.want(t, true)
	outsideToNodePort.want(t, true)

	// Mid-life: the wrapper's rule taken out by a sync, xt_ipvs unloaded and hidden again, then
	// every restore fails while endpoints change and a Service is deleted.
	fault.fail(t, false)
	waitFor(t, 30*time.Second, "a sync without the wrapper's -m ipvs rule", func() (bool, string) {
		nat := cp.IptablesSave("nat")
		return !strings.Contains(nat, "-m ipvs"), nat
	})
	xtIPVS.unload(t)
	fault.fail(t, true)
	failing := time.Now()
	newEps, newAddrs := remoteEndpoints(5, 6, 13) // 1..5 deleted, 11..13 added
	cp.ApplySlice(EndpointSlice(ns, "dns", "dns-1", httpSlicePorts, newEps))
	orphansBefore := gauge(t, e.Scrape(t), orphanChains, nil)
	cp.deleteService(ns, "gone")
	r = e.waitForSyncFailingStatus(t, 90*time.Second, "/status: kube_proxy_sync_failing, mid-life", func(r syncFailingReport) bool {
		i := r.finding("kube_proxy_sync_failing")
		return i >= 0 && r.syncFailures(i) != nil && r.syncFailures(i).Error != "" && !r.syncFailures(i).NeverApplied
	})
	t.Logf("mid-life: %s %s after the restores started failing", r.Verdict, time.Since(failing).Round(time.Second))
	check("mid-life", r, false, "warning", []string{
		"its IPVS virtual servers still follow Service and endpoint changes, but its iptables rules stay as they were",
		"deleted Services keep their virtual servers",
	})
	vs = weighted(cp.VirtualServers())
	if !equalStrings(vs[dnsVS], sortedCopy(newAddrs)) || len(vs[goneVS]) != 1 {
		t.Errorf("mid-life: kube-proxy's virtual servers %v: want %s to follow the API (%v) and %s, deleted, kept", vs, dnsVS, newAddrs, goneVS)
	}
	e.Poll(t, 30*time.Second, "no drift, the deleted Service's virtual server an orphan", nil, func(s Scrape) (bool, string) {
		return gauge(t, s, servicesDrifted, nil) == 0 && gauge(t, s, orphanChains, nil) == orphansBefore+1, driftSummary(s) + "\n" + s.Series(orphanChains)
	})
	nodeToVIP.want(t, true)
	outsideToNodePort.want(t, true)

	xtIPVS.load(t)
	mended = time.Now()
	r = waitSyncsApply(t, e)
	t.Logf("mid-life mended: %s %s after xt_ipvs was loaded", r.Verdict, time.Since(mended).Round(time.Millisecond))
	e.Poll(t, 30*time.Second, "the deleted Service's virtual server removed", nil, func(s Scrape) (bool, string) {
		return gauge(t, s, orphanChains, nil) == orphansBefore, s.Series(orphanChains)
	})
	t.Logf("TestSyncFailingIPVS took %s", time.Since(start).Round(time.Millisecond))
	if t.Failed() {
		t.Logf("kube-proxy's failed syncs as logged:\n%s", lastLines(grepLines(cp.KubeProxyLog(), "Failed to execute iptables-restore", "\t", " > "), 20))
	}
}

// waitSyncsApply waits until the verdict no longer tells failing syncs or stale rules, and is
// not critical: what is left is at most the unreplied flows of the connections the test made
// fail, a warning, for the status window.
func waitSyncsApply(t *testing.T, e *Exporter) syncFailingReport {
	t.Helper()
	r := e.waitForSyncFailingStatus(t, 60*time.Second, "/status: kube_proxy_sync_failing cleared once the restore applies", func(r syncFailingReport) bool {
		return r.Verdict != "critical" && r.Verdict != "unknown" && r.finding("kube_proxy_sync_failing") < 0 && r.finding("stale_rules") < 0
	})
	for _, f := range r.Findings {
		t.Logf("left: %s (%s): %s", f.Cause, f.Severity, f.Summary)
	}
	return r
}

// finding is the index of the first finding of cause, or -1.
func (r syncFailingReport) finding(cause string) int {
	for i, f := range r.Findings {
		if f.Cause == cause {
			return i
		}
	}
	return -1
}

// connection is a TCP connection the lab tries through a Service: from namespace ns to addr.
type connection struct {
	ns, what, addr string
}

// want checks that the connection succeeds (within the lab's bound, tried until then) or
// fails (one try, given the whole bound).
func (c connection) want(t *testing.T, ok bool) {
	t.Helper()
	timeout := 3 * time.Second * waitScale
	try := func() (bool, string) {
		out, err := runCmd(exec.Command("ip", "netns", "exec", c.ns, labtoolBin, "connect", c.addr, "--timeout", timeout.String()))
		if err != nil {
			t.Fatalf("labtool connect %s: %v: %s", c.addr, err, out)
		}
		return strings.Contains(out, "succeeded 1 of 1"), strings.TrimSpace(out)
	}
	if ok {
		waitFor(t, 20*time.Second, "a connection "+c.what+" ("+c.addr+")", try)
		t.Logf("connection %s (%s): works", c.what, c.addr)
		return
	}
	if works, out := try(); works {
		t.Errorf("connection %s (%s) works; want it to fail: %s", c.what, c.addr, out)
		return
	}
	t.Logf("connection %s (%s): fails", c.what, c.addr)
}

// kernelModule is a module the test took out of the kernel's module tree, as on a node that
// lacks it.
type kernelModule struct {
	name, path string
}

// hideKernelModule takes module name out of the module tree (renamed beside it), so that
// neither modprobe nor the kernel's own module requests can load it, and puts it back when t
// ends. It must not be loaded already: one loaded by an earlier test is unloaded first.
func hideKernelModule(t *testing.T, name string) *kernelModule {
	t.Helper()
	out, err := run("modinfo", "-n", name)
	if err != nil {
		prereq.Skipf(t, "kernel module %s not found (modinfo -n %s): %v: %s", name, name, err, out)
	}
	m := &kernelModule{name: name, path: strings.TrimSpace(out)}
	m.unload(t)
	t.Cleanup(func() {
		if err := os.Rename(m.hidden(), m.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Errorf("putting %s back: %v", m.path, err)
		}
	})
	return m
}

func (m *kernelModule) hidden() string { return m.path + ".hidden-by-test" }

// unload unloads the module if it is loaded and hides it. The kernel lets go of a module a
// rule used once the rule is gone, not always at once: rmmod is tried until then.
func (m *kernelModule) unload(t *testing.T) {
	t.Helper()
	waitFor(t, 10*time.Second, "rmmod "+m.name, func() (bool, string) {
		if _, err := os.Stat("/sys/module/" + m.name); errors.Is(err, os.ErrNotExist) {
			return true, ""
		}
		out, err := run("rmmod", m.name)
		return err == nil, fmt.Sprintf("%v: %s", err, out)
	})
	if err := os.Rename(m.path, m.hidden()); err != nil {
		t.Fatalf("hiding %s: %v", m.path, err)
	}
}

// load puts the module back and loads it: the remedy the verdict names.
func (m *kernelModule) load(t *testing.T) {
	t.Helper()
	if err := os.Rename(m.hidden(), m.path); err != nil {
		t.Fatalf("putting %s back: %v", m.path, err)
	}
	if out, err := run("modprobe", m.name); err != nil {
		t.Fatalf("modprobe %s: %v: %s", m.name, err, out)
	}
}
