//go:build e2e

package e2e

import (
	"fmt"
	"net/netip"
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

	"github.com/proxyhealth/proxyhealth/internal/kubeproxynames"
	"github.com/proxyhealth/proxyhealth/internal/testsupport/nft"
)

// nftablesFixtureSuffix ends the name of the directory under testdata/ that
// TestCaptureNFTablesFixtures writes: kube-proxy-<version>-nftables.
const nftablesFixtureSuffix = "-nftables"

// TestCaptureNFTablesFixtures runs kube-proxy in nftables mode against the same Services and
// EndpointSlices as TestControlPlane's fixtures, plus one with ClientIP session affinity, and
// checks the shape it programs in `table ip kube-proxy`: each service port's chain named
// service-<hash>-<ns>/<name>/<proto>/<port> (local-... for the Local policy), endpoints inline in
// a numgen map, or, with session affinity, behind a numgen vmap of per-endpoint chains. With
// -update-fixtures it writes the table (JSON and text) and the API objects to
// testdata/kube-proxy-<version>-nftables/.
func TestCaptureNFTablesFixtures(t *testing.T) {
	requireKube(t)
	l := newLabRules(t, labRawRules)
	cp := StartControlPlane(t, l, ControlPlaneOptions{NoKubeProxy: true})
	start := time.Now()
	cp.StartKubeProxy(KubeProxyOptions{Mode: "nftables"})
	cp.WaitNFTServicePort(60*time.Second, "default", "kubernetes", "tcp", "https", false, []string{uplinkN + ":6443"})
	t.Logf("kube-proxy (nftables) programmed its first sync in %s", time.Since(start).Round(time.Millisecond))

	createNFTFixtureObjects(cp)

	// The two forms, read straight from the JSON.
	rs := cp.NFTKubeProxy()
	tb := rs.Table("ip", "kube-proxy")
	inline := tb.Chain(nftServiceChain("service-", "lab", "backend", "tcp", "http"))
	sticky := tb.Chain(nftServiceChain("service-", "lab", "sticky", "tcp", "http"))
	if inline == nil || sticky == nil {
		t.Fatalf("chains missing: backend %v, sticky %v", inline != nil, sticky != nil)
	}
	var inlineTargets, stickyJumps int
	for _, r := range inline.Rules {
		inlineTargets += len(r.DNATTargets())
		if len(r.JumpTargets()) > 0 && !strings.Contains(strings.Join(r.JumpTargets(), " "), "mark-for-masquerade") {
			t.Errorf("backend (no affinity) jumps to %v, want its endpoints inline", r.JumpTargets())
		}
	}
	for _, r := range sticky.Rules {
		if len(r.DNATTargets()) > 0 {
			t.Errorf("sticky (ClientIP affinity) has an inline dnat %v, want per-endpoint chains", r.DNATTargets())
		}
		for _, j := range r.JumpTargets() {
			if strings.HasPrefix(j, "endpoint-") {
				stickyJumps++
			}
		}
	}
	if inlineTargets != 11 {
		t.Errorf("backend: %d inline dnat targets, want 11", inlineTargets)
	}
	// One affinity goto and one vmap element per endpoint.
	if stickyJumps != 6 {
		t.Errorf("sticky: %d jumps to endpoint chains, want 6 (3 affinity gotos, 3 vmap elements)", stickyJumps)
	}

	if *updateFixtures {
		js := cp.Lab.MustExec(cp.Lab.Node, "nft", "-j", "list", "table", "ip", "kube-proxy")
		text := cp.Lab.MustExec(cp.Lab.Node, "nft", "list", "table", "ip", "kube-proxy")
		writeFixturesTo(cp, "kube-proxy-"+cp.Bins.Version+nftablesFixtureSuffix, map[string]string{
			"nft-list-table-ip-kube-proxy.json": js,
			"nft-list-table-ip-kube-proxy.nft":  text,
			"api-objects.json":                  apiObjects(cp),
		})
	}
}

// createNFTFixtureObjects writes the Services and EndpointSlices of TestControlPlane's capture
// (lab/backend and createShapeObjects) plus lab/sticky with ClientIP session affinity, and
// waits until kube-proxy's nftables table holds each as expected.
func createNFTFixtureObjects(cp *ControlPlane) {
	tcp := corev1.ProtocolTCP
	http := []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: tcp}}
	httpSlice := []discoveryv1.EndpointPort{SlicePort("http", tcp, 8080)}
	here := func(ip string) LabEndpoint { return LabEndpoint{IP: ip, NodeName: labNodeName, Zone: labNodeZone} }
	there := func(ip string) LabEndpoint { return LabEndpoint{IP: ip, NodeName: "node-b", Zone: "zone-b"} }

	// lab/backend with its endpoints after TestControlPlane's incident: 10.244.3.3-13.
	cp.CreateService(&corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "lab", Name: "backend"},
		Spec:       corev1.ServiceSpec{ClusterIP: "10.96.0.50", Ports: http},
	})
	var backend []LabEndpoint
	var backendAddrs []string
	for i := 3; i <= 13; i++ {
		ip := fmt.Sprintf("10.244.3.%d", i)
		backend = append(backend, there(ip))
		backendAddrs = append(backendAddrs, ip+":8080")
	}
	cp.ApplySlice(EndpointSlice("lab", "backend", "backend-1", httpSlice, backend))

	createShapeObjects(cp)

	// ClientIP session affinity: per-endpoint chains behind a numgen vmap, in both the cluster
	// chain and (externalTrafficPolicy: Local) the local chain.
	cp.CreateService(&corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "lab", Name: "sticky"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, ClusterIP: "10.96.0.55",
			SessionAffinity:       corev1.ServiceAffinityClientIP,
			ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal,
			Ports:                 []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), NodePort: 30081, Protocol: tcp}}},
	})
	cp.ApplySlice(EndpointSlice("lab", "sticky", "sticky-1", httpSlice,
		[]LabEndpoint{here(podB), there("10.244.3.70"), there("10.244.3.71")}))

	const wait = 30 * time.Second
	cp.WaitNFTServicePort(wait, "lab", "backend", "tcp", "http", false, backendAddrs)
	cp.WaitNFTServicePort(wait, "kube-system", "kube-dns", "udp", "dns", false, []string{podB + ":53", "10.244.3.30:53"})
	cp.WaitNFTServicePort(wait, "kube-system", "kube-dns", "tcp", "dns-tcp", false, []string{podB + ":53", "10.244.3.30:53"})
	cp.WaitNFTServicePort(wait, "kube-system", "kube-dns", "tcp", "metrics", false, []string{podB + ":9153", "10.244.3.30:9153"})
	cp.WaitNFTServicePort(wait, "lab", "local-only", "tcp", "http", true, []string{podB + ":8080", podB2 + ":8080"})
	cp.WaitNFTServicePort(wait, "lab", "web-nodeport", "tcp", "http", false, []string{podB + ":8080", "10.244.3.50:8080"})
	cp.WaitNFTServicePort(wait, "lab", "web-nodeport", "tcp", "http", true, []string{podB + ":8080"})
	cp.WaitNFTServicePort(wait, "lab", "zonal", "tcp", "http", false, []string{"10.244.3.60:8080", "10.244.3.62:8080"})
	cp.WaitNFTServicePort(wait, "lab", "sticky", "tcp", "http", false, []string{podB + ":8080", "10.244.3.70:8080", "10.244.3.71:8080"})
	cp.WaitNFTServicePort(wait, "lab", "sticky", "tcp", "http", true, []string{podB + ":8080"})
	// No chain for the Service without endpoints, nor a cluster chain for the local-only one.
	rs := cp.NFTKubeProxy()
	for _, c := range []string{nftServiceChain("service-", "lab", "empty", "tcp", "http"), nftServiceChain("service-", "lab", "local-only", "tcp", "http")} {
		if ch := rs.Table("ip", "kube-proxy").Chain(c); ch != nil && len(ch.Rules) > 0 {
			t := cp.t
			t.Errorf("chain %s has rules, want none", c)
		}
	}
}

// nftServiceChain is kubeproxynames.NFTServiceChains' cluster chain for prefix "service-",
// its local chain for "local-".
func nftServiceChain(prefix, ns, name, protocol, portName string) string {
	cluster, local := kubeproxynames.NFTServiceChains(ns, name, portName, protocol)
	switch prefix {
	case kubeproxynames.NFTClusterChainPrefix:
		return cluster
	case kubeproxynames.NFTLocalChainPrefix:
		return local
	}
	panic("nftServiceChain: no service port chain starts " + prefix)
}

// NFTKubeProxy parses `nft -j list table ip kube-proxy` of the node namespace; nil when the
// table does not exist (yet).
func (cp *ControlPlane) NFTKubeProxy() *nft.Ruleset {
	cp.t.Helper()
	return cp.NFTKubeProxyFamily("ip")
}

// NFTKubeProxyFamily is NFTKubeProxy for kube-proxy's table of a family: "ip" or "ip6".
func (cp *ControlPlane) NFTKubeProxyFamily(family string) *nft.Ruleset {
	cp.t.Helper()
	out, err := cp.Lab.Exec(cp.Lab.Node, "nft", "-j", "list", "table", family, "kube-proxy")
	if err != nil {
		return nil
	}
	rs, err := nft.Parse(strings.NewReader(out))
	if err != nil {
		cp.t.Fatalf("parsing nft -j list table %s kube-proxy: %v", family, err)
	}
	return rs
}

// NFTChainEndpoints returns the endpoints (ip:port, sorted) of a chain of table ip kube-proxy:
// its inline dnat targets and those of the chains it jumps to. found is false when the chain
// does not exist or has no rules (kube-proxy flushes a chain it no longer uses, then deletes
// it on a later sync).
func NFTChainEndpoints(rs *nft.Ruleset, chain string) (eps []string, found bool) {
	return NFTFamilyChainEndpoints(rs, "ip", chain)
}

// NFTFamilyChainEndpoints is NFTChainEndpoints in table <family> kube-proxy ("ip" or "ip6");
// IPv6 endpoints as "[ip]:port".
func NFTFamilyChainEndpoints(rs *nft.Ruleset, family, chain string) (eps []string, found bool) {
	tb := rs.Table(family, "kube-proxy")
	c := tb.Chain(chain)
	if c == nil || len(c.Rules) == 0 {
		return nil, false
	}
	seen := map[netip.AddrPort]bool{}
	add := func(aps []netip.AddrPort) {
		for _, ap := range aps {
			if !seen[ap] {
				seen[ap] = true
				eps = append(eps, ap.String())
			}
		}
	}
	for _, r := range c.Rules {
		add(r.DNATTargets())
		for _, j := range r.JumpTargets() {
			if ec := tb.Chain(j); ec != nil {
				for _, er := range ec.Rules {
					add(er.DNATTargets())
				}
			}
		}
	}
	sort.Strings(eps)
	return eps, true
}

// WaitNFTServicePort polls table ip kube-proxy until the service port's cluster chain (or,
// with local, its local chain) holds exactly want.
func (cp *ControlPlane) WaitNFTServicePort(timeout time.Duration, ns, name, protocol, portName string, local bool, want []string) {
	cp.t.Helper()
	cp.WaitNFTFamilyServicePort(timeout, "ip", ns, name, protocol, portName, local, want)
}

// WaitNFTFamilyServicePort is WaitNFTServicePort in table <family> kube-proxy ("ip" or "ip6").
func (cp *ControlPlane) WaitNFTFamilyServicePort(timeout time.Duration, family, ns, name, protocol, portName string, local bool, want []string) {
	cp.t.Helper()
	prefix := "service-"
	if local {
		prefix = "local-"
	}
	chain := nftServiceChain(prefix, ns, name, protocol, portName)
	want = sortedCopy(want)
	waitFor(cp.t, timeout, fmt.Sprintf("%s %s programmed with %d endpoints", family, chain, len(want)), func() (bool, string) {
		if cp.KubeProxy != nil && cp.KubeProxy.Exited() {
			cp.t.Fatalf("kube-proxy exited")
		}
		rs := cp.NFTKubeProxyFamily(family)
		if rs == nil {
			return false, "no table " + family + " kube-proxy"
		}
		got, found := NFTFamilyChainEndpoints(rs, family, chain)
		return found && equalStrings(got, want), fmt.Sprintf("found=%v endpoints=%v", found, got)
	})
}

// writeFixturesTo is writeFixtures into testdata/<dir>.
func writeFixturesTo(cp *ControlPlane, dir string, files map[string]string) {
	t := cp.t
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(root, "test", "e2e", "testdata", dir)
	if err := os.MkdirAll(path, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(path, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("fixtures written to %s", path)
}
