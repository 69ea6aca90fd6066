//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/proxyhealth/proxyhealth/internal/kpcapture"
	"github.com/proxyhealth/proxyhealth/internal/kubeproxynames"
	"github.com/proxyhealth/proxyhealth/internal/testsupport/nft"
)

// TestCaptureKubeProxyRules runs the lab's kube-proxy (the version the lab runs, see
// test/kube/VERSION and PROXYHEALTH_KUBE_VERSION) in each mode of kpcapture.Modes, on a
// dual-stack lab, against one fixed set of Services and EndpointSlices (capturePorts), and
// checks that both families' rules hold what capturePorts says. With -update-fixtures it writes
// the rules and that expectation to collectors/rules/testdata/kube-proxy-matrix/<version>/<mode>/
// (and the API objects to <version>/), from which `test/kube/capture.sh` makes the recordings
// the readers' unit tests decode.
func TestCaptureKubeProxyRules(t *testing.T) {
	requireKube(t)
	for _, mode := range kpcapture.Modes {
		t.Run(mode, func(t *testing.T) { captureKubeProxyRules(t, mode) })
	}
}

// capturePort is one service port of the capture and what kube-proxy must program for it, per
// family: the cluster chain's and the local chain's endpoints, nil for a chain it does not have.
type capturePort struct {
	ns, name, portName, protocol string
	families                     map[bool]captureFamily // by IPv6
}

type captureFamily struct {
	clusterIP      string
	cluster, local []string
}

// capturePorts is what createCaptureObjects writes, as kube-proxy must program it on lab-node.
var capturePorts = []capturePort{
	{"default", "kubernetes", "https", "tcp", map[bool]captureFamily{false: {"10.96.0.1", []string{uplinkN + ":6443"}, nil}}},
	{"lab", "backend", "http", "tcp", map[bool]captureFamily{false: {"10.96.0.50", ipPorts("10.244.3.%d", 1, 5, 8080), nil}}},
	{"kube-system", "kube-dns", "dns", "udp", map[bool]captureFamily{false: {"10.96.0.10", []string{podB + ":53", "10.244.3.30:53"}, nil}}},
	{"kube-system", "kube-dns", "dns-tcp", "tcp", map[bool]captureFamily{false: {"10.96.0.10", []string{podB + ":53", "10.244.3.30:53"}, nil}}},
	// internalTrafficPolicy: Local: the local chain only.
	{"lab", "local-only", "http", "tcp", map[bool]captureFamily{false: {"10.96.0.51", nil, []string{podB + ":8080", podB2 + ":8080"}}}},
	// NodePort, externalTrafficPolicy: Local and ClientIP session affinity: both chains.
	{"lab", "sticky", "http", "tcp", map[bool]captureFamily{false: {"10.96.0.55", []string{podB + ":8080", "10.244.3.70:8080", "10.244.3.71:8080"}, []string{podB + ":8080"}}}},
	// RequireDualStack, IPv4 first.
	{"lab", "dual", "http", "tcp", map[bool]captureFamily{
		false: {"10.96.0.70", ipPorts("10.244.5.%d", 1, 3, 8080), nil},
		true:  {"fd00:10:96::70", []string{"[fd00:10:244:1::3]:8080", "[fd00:10:244:5::1]:8080", "[fd00:10:244:5::2]:8080"}, nil},
	}},
	// PreferDualStack, IPv6 first, internalTrafficPolicy: Local.
	{"lab", "dual-local", "http", "tcp", map[bool]captureFamily{
		false: {"10.96.0.71", nil, []string{podB + ":8080"}},
		true:  {"fd00:10:96::71", nil, []string{"[fd00:10:244:1::3]:8080"}},
	}},
}

// ipPorts is "ip:port" for the addresses format (one %d) from..to.
func ipPorts(format string, from, to, port int) []string {
	var out []string
	for i := from; i <= to; i++ {
		out = append(out, fmt.Sprintf(format+":%d", i, port))
	}
	return out
}

// createCaptureObjects writes the Services and EndpointSlices of capturePorts, and lab/empty
// (no endpoints: no chain at all).
func createCaptureObjects(cp *ControlPlane) {
	tcp, udp := corev1.ProtocolTCP, corev1.ProtocolUDP
	local := corev1.ServiceInternalTrafficPolicyLocal
	http := []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: tcp}}
	httpSlice := []discoveryv1.EndpointPort{SlicePort("http", tcp, 8080)}
	here := func(ip string) LabEndpoint { return LabEndpoint{IP: ip, NodeName: labNodeName, Zone: labNodeZone} }
	there := func(ip string) LabEndpoint { return LabEndpoint{IP: ip, NodeName: "node-b", Zone: "zone-b"} }
	svc := func(ns, name string, spec corev1.ServiceSpec) {
		cp.CreateService(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: spec})
	}

	svc("lab", "backend", corev1.ServiceSpec{ClusterIP: "10.96.0.50", Ports: http})
	backend, _ := remoteEndpoints(3, 1, 5)
	cp.ApplySlice(EndpointSlice("lab", "backend", "backend-1", httpSlice, backend))

	svc("kube-system", "kube-dns", corev1.ServiceSpec{ClusterIP: "10.96.0.10", Ports: []corev1.ServicePort{
		{Name: "dns", Port: 53, TargetPort: intstr.FromInt32(53), Protocol: udp},
		{Name: "dns-tcp", Port: 53, TargetPort: intstr.FromInt32(53), Protocol: tcp},
	}})
	cp.ApplySlice(EndpointSlice("kube-system", "kube-dns", "kube-dns-1",
		[]discoveryv1.EndpointPort{SlicePort("dns", udp, 53), SlicePort("dns-tcp", tcp, 53)},
		[]LabEndpoint{here(podB), there("10.244.3.30")}))

	svc("lab", "local-only", corev1.ServiceSpec{ClusterIP: "10.96.0.51", InternalTrafficPolicy: &local, Ports: http})
	cp.ApplySlice(EndpointSlice("lab", "local-only", "local-only-1", httpSlice,
		[]LabEndpoint{here(podB), here(podB2), there("10.244.3.40")}))

	svc("lab", "sticky", corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, ClusterIP: "10.96.0.55",
		SessionAffinity:       corev1.ServiceAffinityClientIP,
		ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal,
		Ports:                 []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), NodePort: 30081, Protocol: tcp}}})
	cp.ApplySlice(EndpointSlice("lab", "sticky", "sticky-1", httpSlice,
		[]LabEndpoint{here(podB), there("10.244.3.70"), there("10.244.3.71")}))

	svc("lab", "dual", corev1.ServiceSpec{ClusterIP: "10.96.0.70", ClusterIPs: []string{"10.96.0.70", "fd00:10:96::70"},
		IPFamilyPolicy: ptrTo(corev1.IPFamilyPolicyRequireDualStack), IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol},
		Ports: http})
	dual4, _ := remoteEndpoints(5, 1, 3)
	dual6, _ := remoteEndpoints6(5, 1, 2)
	cp.ApplySlice(EndpointSlice("lab", "dual", "dual-v4", httpSlice, dual4))
	cp.ApplySlice(EndpointSlice("lab", "dual", "dual-v6", httpSlice, append(dual6, here("fd00:10:244:1::3"))))

	svc("lab", "dual-local", corev1.ServiceSpec{ClusterIP: "fd00:10:96::71", ClusterIPs: []string{"fd00:10:96::71", "10.96.0.71"},
		IPFamilyPolicy: ptrTo(corev1.IPFamilyPolicyPreferDualStack), IPFamilies: []corev1.IPFamily{corev1.IPv6Protocol, corev1.IPv4Protocol},
		InternalTrafficPolicy: &local, Ports: http})
	cp.ApplySlice(EndpointSlice("lab", "dual-local", "dual-local-v4", httpSlice, []LabEndpoint{here(podB), there("10.244.6.1")}))
	cp.ApplySlice(EndpointSlice("lab", "dual-local", "dual-local-v6", httpSlice, []LabEndpoint{here("fd00:10:244:1::3"), there("fd00:10:244:6::1")}))

	svc("lab", "empty", corev1.ServiceSpec{ClusterIP: "10.96.0.53", Ports: http})
}

// captureExpected is what capturePorts says one mode's rules hold.
func captureExpected(version, mode string) *kpcapture.Expected {
	e := &kpcapture.Expected{Version: version, Mode: mode, Families: map[string]*kpcapture.FamilyExpected{}}
	for _, ipv6 := range []bool{false, true} {
		fe := &kpcapture.FamilyExpected{Chains: map[string][]string{}}
		for _, p := range capturePorts {
			f, ok := p.families[ipv6]
			if !ok {
				continue
			}
			var clusterChain, localChain string
			if mode == kpcapture.NFTables {
				clusterChain = nftServiceChain("service-", p.ns, p.name, p.protocol, p.portName)
				localChain = nftServiceChain("local-", p.ns, p.name, p.protocol, p.portName)
			} else {
				clusterChain, localChain = kubeproxynames.IPTablesServiceChains(p.ns, p.name, p.portName, p.protocol)
			}
			if f.cluster != nil {
				fe.Chains[clusterChain] = sortedCopy(f.cluster)
			}
			if f.local != nil {
				fe.Chains[localChain] = sortedCopy(f.local)
			}
			port := uint16(80)
			switch p.portName {
			case "https":
				port = 443
			case "dns", "dns-tcp":
				port = 53
			}
			fe.Services = append(fe.Services, kpcapture.Service{ClusterIP: f.clusterIP, Port: port, Protocol: p.protocol,
				Chains: []string{clusterChain, localChain}})
		}
		e.Families[kpcapture.Family(ipv6)] = fe
	}
	return e
}

func captureKubeProxyRules(t *testing.T, mode string) {
	start := time.Now()
	l := newLabRules(t, labRawRules)
	cp := StartControlPlane(t, l, ControlPlaneOptions{NoKubeProxy: true, DualStack: true})
	opts := KubeProxyOptions{Mode: "iptables"}
	switch mode {
	case kpcapture.IPTablesLegacy:
		opts.IPTablesBackend = "legacy"
	case kpcapture.IPTablesNFT:
		opts.IPTablesBackend = "nft"
	case kpcapture.NFTables:
		opts.Mode = "nftables"
	}
	cp.StartKubeProxy(opts)
	createCaptureObjects(cp)
	want := captureExpected(cp.Bins.Version, mode)

	// Every chain of both families as kube-proxy's own text dumps show them.
	var rules map[bool]string
	read := func() map[bool]string {
		out := map[bool]string{}
		for _, ipv6 := range []bool{false, true} {
			var args []string
			switch {
			case mode == kpcapture.NFTables:
				family := "ip"
				if ipv6 {
					family = "ip6"
				}
				args = []string{"nft", "-j", "list", "table", family, "kube-proxy"}
			case ipv6:
				args = []string{"ip6tables-" + opts.IPTablesBackend + "-save", "-t", "nat"}
			default:
				args = []string{"iptables-" + opts.IPTablesBackend + "-save", "-t", "nat"}
			}
			// Not there yet (before kube-proxy's first sync of the family): nothing.
			if text, err := cp.Lab.Exec(cp.Lab.Node, args...); err == nil {
				out[ipv6] = text
			}
		}
		return out
	}
	waitFor(t, 60*time.Second, fmt.Sprintf("kube-proxy (%s) programmed the capture's Services in both families", mode), func() (bool, string) {
		if cp.KubeProxy.Exited() {
			t.Fatalf("kube-proxy exited")
		}
		rules = read()
		var diffs []string
		for _, ipv6 := range []bool{false, true} {
			got := textServiceChains(t, mode, ipv6, rules[ipv6])
			if d := diffChains(got, want.Families[kpcapture.Family(ipv6)].Chains); d != "" {
				diffs = append(diffs, kpcapture.Family(ipv6)+": "+d)
			}
		}
		return len(diffs) == 0, strings.Join(diffs, "\n")
	})
	t.Logf("kube-proxy %s (%s) programmed the capture in %s", cp.Bins.Version, mode, time.Since(start).Round(time.Millisecond))

	if !*updateFixtures {
		return
	}
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	versionDir := filepath.Join(root, kpcapture.Dir, cp.Bins.Version)
	dir := filepath.Join(versionDir, mode)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	expected, err := json.MarshalIndent(want, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		filepath.Join(dir, kpcapture.ExpectedFile):           string(expected) + "\n",
		filepath.Join(versionDir, kpcapture.APIObjectsFile):  apiObjects(cp),
		filepath.Join(dir, kpcapture.RulesFile(mode, false)): stripSaveStamps(rules[false]),
		filepath.Join(dir, kpcapture.RulesFile(mode, true)):  stripSaveStamps(rules[true]),
	}
	for path, content := range files {
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("capture written to %s", dir)
}

// textServiceChains reads every service port chain with rules, and its endpoints, from one
// family's text dump: iptables-save's nat table (KUBE-SVC-*, KUBE-SVL-*) or nft's JSON
// (service-*, local-*).
func textServiceChains(t *testing.T, mode string, ipv6 bool, text string) map[string][]string {
	out := map[string][]string{}
	if mode == kpcapture.NFTables {
		if strings.TrimSpace(text) == "" {
			return out
		}
		family := "ip"
		if ipv6 {
			family = "ip6"
		}
		rs, err := nft.Parse(strings.NewReader(text))
		if err != nil {
			t.Fatalf("parsing nft -j list table %s kube-proxy: %v", family, err)
		}
		for _, c := range rs.Table(family, "kube-proxy").Chains {
			// service-<hash>-<ns>/<name>/<proto>/<port>, not kube-proxy's own chains
			// (service-endpoints-check, ...).
			if (strings.HasPrefix(c.Name, "service-") || strings.HasPrefix(c.Name, "local-")) && strings.Contains(c.Name, "/") {
				if eps, found := NFTFamilyChainEndpoints(rs, family, c.Name); found {
					out[c.Name] = eps
				}
			}
		}
		return out
	}
	for _, line := range strings.Split(text, "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || f[0] != "-A" || (!strings.HasPrefix(f[1], "KUBE-SVC-") && !strings.HasPrefix(f[1], "KUBE-SVL-")) {
			continue
		}
		if _, ok := out[f[1]]; ok {
			continue
		}
		eps := []string{}
		seen := map[string]bool{}
		for _, l := range strings.Split(text, "\n") {
			g := strings.Fields(l)
			if len(g) < 2 || g[0] != "-A" || g[1] != f[1] || !strings.Contains(l, "-j KUBE-SEP-") {
				continue
			}
			sep := g[len(g)-1]
			for _, sl := range strings.Split(text, "\n") {
				if m := dnatRE.FindStringSubmatch(sl); m != nil && strings.HasPrefix(sl, "-A "+sep+" ") && !seen[m[1]] {
					seen[m[1]] = true
					eps = append(eps, m[1])
				}
			}
		}
		sort.Strings(eps)
		out[f[1]] = eps
	}
	return out
}

// diffChains says how got differs from want, "" when it does not.
func diffChains(got, want map[string][]string) string {
	var diffs []string
	for c, w := range want {
		if g, ok := got[c]; !ok || !equalStrings(g, w) {
			diffs = append(diffs, fmt.Sprintf("%s: %v (found %v), want %v", c, g, ok, w))
		}
	}
	for c, g := range got {
		if _, ok := want[c]; !ok {
			diffs = append(diffs, fmt.Sprintf("%s: %v, not expected", c, g))
		}
	}
	sort.Strings(diffs)
	return strings.Join(diffs, "; ")
}

// TestCaptureKubeProxyIPVS is TestCaptureKubeProxyRules for kube-proxy's IPVS mode, which needs
// a kernel with IPVS (the kernel matrix's guests: make ipvs-lab): the same Services on a
// dual-stack lab, each cluster IP's virtual server holding what capturePorts says (the local
// endpoints where internalTrafficPolicy: Local leaves only those). With -update-fixtures it
// writes the virtual servers and kube-ipvs0's addresses, as the exporter reads them, to
// collectors/rules/testdata/kube-proxy-matrix/<version>/ipvs/ (CAPTURE=1 test/vm/ipvs-lab.sh
// brings them out of the guest), which the rules collector's tests compare with the version's
// API objects.
func TestCaptureKubeProxyIPVS(t *testing.T) {
	requireKube(t)
	requireIPVS(t)
	start := time.Now()
	l := newLabRules(t, labRawRules)
	cp := StartControlPlane(t, l, ControlPlaneOptions{NoKubeProxy: true, DualStack: true})
	cp.StartKubeProxy(KubeProxyOptions{Mode: "ipvs"})
	createCaptureObjects(cp)

	want := map[string][]string{}
	for _, p := range capturePorts {
		for _, f := range p.families {
			port := "80"
			switch p.portName {
			case "https":
				port = "443"
			case "dns", "dns-tcp":
				port = "53"
			}
			eps := f.cluster
			if eps == nil {
				eps = f.local
			}
			key := strings.ToUpper(p.protocol)
			if strings.Contains(f.clusterIP, ":") {
				key = "[" + f.clusterIP + "]:" + port + "/" + key
			} else {
				key = f.clusterIP + ":" + port + "/" + key
			}
			want[key] = sortedCopy(eps)
		}
	}
	var state kpcapture.IPVSState
	waitFor(t, 60*time.Second, "kube-proxy (ipvs) programmed the capture's Services in both families", func() (bool, string) {
		if cp.KubeProxy.Exited() {
			t.Fatalf("kube-proxy exited")
		}
		state = cp.IPVSState()
		got := weighted(state.VirtualServers)
		var diffs []string
		for key, w := range want {
			if g, ok := got[key]; !ok || !equalStrings(g, w) {
				diffs = append(diffs, fmt.Sprintf("%s: %v (found %v), want %v", key, g, ok, w))
			}
		}
		sort.Strings(diffs)
		return len(diffs) == 0, strings.Join(diffs, "\n")
	})
	t.Logf("kube-proxy %s (ipvs) programmed the capture in %s: %d virtual servers, %d addresses on kube-ipvs0",
		cp.Bins.Version, time.Since(start).Round(time.Millisecond), len(state.VirtualServers), len(state.Bound))

	if !*updateFixtures {
		return
	}
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, kpcapture.Dir, cp.Bins.Version, kpcapture.IPVS)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := json.MarshalIndent(state, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, kpcapture.IPVSFile), append(b, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("capture written to %s", dir)
}
