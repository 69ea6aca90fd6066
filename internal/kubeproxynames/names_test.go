package kubeproxynames

import (
	"net/netip"
	"strings"
	"testing"
)

// These chain names are the ones kube-proxy writes on every cluster, and the ones the real
// kube-proxy v1.36.3 wrote in the captures under collectors/rules/testdata.
func TestIPTablesChainNamesAreKubeProxys(t *testing.T) {
	for _, tc := range []struct {
		namespace, name, port, protocol string
		want                            string
	}{
		{"kube-system", "kube-dns", "dns", "UDP", "KUBE-SVC-TCOU7JCQXEZGVUNU"},
		{"kube-system", "kube-dns", "dns-tcp", "TCP", "KUBE-SVC-ERIFXISQEP7F7OF4"},
		{"default", "kubernetes", "https", "TCP", "KUBE-SVC-NPX46M4PTMTKRN6Y"},
	} {
		cluster, local := IPTablesServiceChains(tc.namespace, tc.name, tc.port, tc.protocol)
		if cluster != tc.want {
			t.Errorf("IPTablesServiceChains(%s/%s:%s %s) cluster = %s, want %s", tc.namespace, tc.name, tc.port, tc.protocol, cluster, tc.want)
		}
		if !strings.HasPrefix(local, "KUBE-SVL-") || local[9:] != cluster[9:] {
			t.Errorf("IPTablesServiceChains(%s/%s:%s %s) local = %s, want KUBE-SVL- and the same hash", tc.namespace, tc.name, tc.port, tc.protocol, local)
		}
	}
	// -A KUBE-SVC-FEK7IJ3KIWHUKSBD -m comment --comment "lab/web-nodeport:http -> 10.244.1.3:8080" ... -j KUBE-SEP-HUGL6XOLN2FXI7EB
	if got := IPTablesEndpointChain("lab", "web-nodeport", "http", "TCP", netip.MustParseAddrPort("10.244.1.3:8080")); got != "KUBE-SEP-HUGL6XOLN2FXI7EB" {
		t.Errorf("IPTablesEndpointChain(lab/web-nodeport:http 10.244.1.3:8080) = %s, want KUBE-SEP-HUGL6XOLN2FXI7EB", got)
	}
	if c, _ := IPTablesServiceChains("lab", "web-nodeport", "http", "TCP"); c != "KUBE-SVC-FEK7IJ3KIWHUKSBD" {
		t.Errorf("lab/web-nodeport:http: %s, want KUBE-SVC-FEK7IJ3KIWHUKSBD", c)
	}
}

func TestNFTChainNamesAreKubeProxys(t *testing.T) {
	for _, tc := range []struct {
		namespace, name, port, protocol string
		cluster, local                  string
	}{
		{"kube-system", "kube-dns", "dns", "UDP", "service-FY5PMXPG-kube-system/kube-dns/udp/dns", "local-FY5PMXPG-kube-system/kube-dns/udp/dns"},
		{"default", "kubernetes", "https", "TCP", "service-2QRHZV4L-default/kubernetes/tcp/https", "local-2QRHZV4L-default/kubernetes/tcp/https"},
		{"lab", "local-only", "http", "TCP", "service-ZUQNRLBF-lab/local-only/tcp/http", "local-ZUQNRLBF-lab/local-only/tcp/http"},
	} {
		if c, l := NFTServiceChains(tc.namespace, tc.name, tc.port, tc.protocol); c != tc.cluster || l != tc.local {
			t.Errorf("NFTServiceChains(%s/%s:%s %s) = %s, %s; want %s, %s", tc.namespace, tc.name, tc.port, tc.protocol, c, l, tc.cluster, tc.local)
		}
	}
	// An unnamed port: the name ends in "/", as kube-proxy's does.
	if c, _ := NFTServiceChains("a", "b", "", "SCTP"); !strings.HasSuffix(c, "-a/b/sctp/") {
		t.Errorf("unnamed port: %s", c)
	}
	for ep, want := range map[string]string{
		"10.244.1.3:8080":  "endpoint-4M7KHNGR-lab/sticky/tcp/http__10.244.1.3/8080",
		"10.244.3.70:8080": "endpoint-2G6RHCPA-lab/sticky/tcp/http__10.244.3.70/8080",
	} {
		if got := NFTEndpointChain("lab", "sticky", "http", "TCP", netip.MustParseAddrPort(ep)); got != want {
			t.Errorf("NFTEndpointChain(lab/sticky:http %s) = %s, want %s", ep, got, want)
		}
	}
	// An IPv6 address's colons, which a chain name may not hold, are written as dots.
	if got := NFTEndpointChain("lab", "sticky", "http", "TCP", netip.MustParseAddrPort("[fd00::1:3]:8080")); !strings.HasSuffix(got, "-lab/sticky/tcp/http__fd00..1.3/8080") {
		t.Errorf("IPv6 endpoint: %s", got)
	}
}

// Names longer than kube-proxy's limit are cut as it cuts them, keeping the hash of the whole.
func TestNFTChainNameTruncated(t *testing.T) {
	long := strings.Repeat("n", 300)
	c, l := NFTServiceChains("ns", long, "p", "TCP")
	if len(c) != len("service-")+nftChainNameBaseMax || !strings.HasSuffix(c, "nnn...") {
		t.Errorf("cluster chain of a long name: %d characters, %q", len(c), c[len(c)-8:])
	}
	if l[len("local-"):] != c[len("service-"):] {
		t.Errorf("local chain base %q differs from cluster chain base %q", l, c)
	}
}

func TestChainPredicates(t *testing.T) {
	for _, tc := range []struct {
		name                                             string
		iptService, iptEndpoint, nftService, nftEndpoint bool
	}{
		{"KUBE-SVC-TCOU7JCQXEZGVUNU", true, false, false, false},
		{"KUBE-SVL-TCOU7JCQXEZGVUNU", true, false, false, false},
		{"KUBE-SEP-HUGL6XOLN2FXI7EB", false, true, false, false},
		{"KUBE-SERVICES", false, false, false, false},
		{"KUBE-EXT-TCOU7JCQXEZGVUNU", false, false, false, false},
		{"service-FY5PMXPG-kube-system/kube-dns/udp/dns", false, false, true, false},
		{"local-FY5PMXPG-kube-system/kube-dns/udp/dns", false, false, true, false},
		{"endpoint-4M7KHNGR-lab/sticky/tcp/http__10.244.1.3/8080", false, false, false, true},
		{"external-FY5PMXPG-kube-system/kube-dns/udp/dns", false, false, false, false},
		// kube-proxy's fixed chains: no "/".
		{"service-endpoints-check", false, false, false, false},
		{"services", false, false, false, false},
		{"", false, false, false, false},
	} {
		b := []byte(tc.name)
		if got := IsIPTablesServiceChain(tc.name); got != tc.iptService || IsIPTablesServiceChainBytes(b) != got {
			t.Errorf("IsIPTablesServiceChain(%q) = %v, want %v", tc.name, got, tc.iptService)
		}
		if got := IsIPTablesEndpointChain(tc.name); got != tc.iptEndpoint || IsIPTablesEndpointChainBytes(b) != got {
			t.Errorf("IsIPTablesEndpointChain(%q) = %v, want %v", tc.name, got, tc.iptEndpoint)
		}
		if got := IsNFTServiceChain(tc.name); got != tc.nftService || IsNFTServiceChainBytes(b) != got {
			t.Errorf("IsNFTServiceChain(%q) = %v, want %v", tc.name, got, tc.nftService)
		}
		if got := IsNFTEndpointChain(tc.name); got != tc.nftEndpoint || IsNFTEndpointChainBytes(b) != got {
			t.Errorf("IsNFTEndpointChain(%q) = %v, want %v", tc.name, got, tc.nftEndpoint)
		}
	}
}

// The chains built from a service port are the ones the predicates tell, and the nftables
// service chain's name gives the service port back.
func TestBuiltNamesAreRecognised(t *testing.T) {
	ep := netip.MustParseAddrPort("[fd00::5]:53")
	ic, il := IPTablesServiceChains("kube-system", "kube-dns", "dns", "UDP")
	if !IsIPTablesServiceChain(ic) || !IsIPTablesServiceChain(il) || !IsIPTablesEndpointChain(IPTablesEndpointChain("kube-system", "kube-dns", "dns", "UDP", ep)) {
		t.Errorf("iptables chains not recognised: %s, %s", ic, il)
	}
	nc, nl := NFTServiceChains("kube-system", "kube-dns", "dns", "UDP")
	if !IsNFTServiceChain(nc) || !IsNFTServiceChain(nl) || !IsNFTEndpointChain(NFTEndpointChain("kube-system", "kube-dns", "dns", "UDP", ep)) {
		t.Errorf("nftables chains not recognised: %s, %s", nc, nl)
	}
	for _, c := range []string{nc, nl} {
		if ns, n, p, ok := ParseNFTServiceChain(c); !ok || ns != "kube-system" || n != "kube-dns" || p != "dns" {
			t.Errorf("ParseNFTServiceChain(%s) = %q, %q, %q, %v", c, ns, n, p, ok)
		}
	}
}

func TestParseServiceComment(t *testing.T) {
	for _, tc := range []struct {
		comment                   string
		namespace, name, portName string
	}{
		{"kube-system/kube-dns:dns cluster IP", "kube-system", "kube-dns", "dns"},
		{"default/kubernetes cluster IP", "default", "kubernetes", ""}, // an unnamed port
		{"lab/web:http external IP", "", "", ""},
		{"kube-system/kube-dns:dns -> 10.244.1.3:53", "", "", ""},
		{"kube-dns cluster IP", "", "", ""},
		{"/kube-dns cluster IP", "", "", ""},
		{"kube-system/ cluster IP", "", "", ""},
		{"", "", "", ""},
	} {
		ns, n, p := ParseServiceComment(tc.comment)
		if ns != tc.namespace || n != tc.name || p != tc.portName {
			t.Errorf("ParseServiceComment(%q) = %q, %q, %q; want %q, %q, %q", tc.comment, ns, n, p, tc.namespace, tc.name, tc.portName)
		}
		if bns, bn, bp := ParseServiceCommentBytes([]byte(tc.comment)); bns != ns || bn != n || bp != p {
			t.Errorf("ParseServiceCommentBytes(%q) = %q, %q, %q; ParseServiceComment says %q, %q, %q", tc.comment, bns, bn, bp, ns, n, p)
		}
	}
}

func TestParseNFTServiceChain(t *testing.T) {
	for _, tc := range []struct {
		chain                     string
		namespace, name, portName string
		ok                        bool
	}{
		{"service-FY5PMXPG-kube-system/kube-dns/udp/dns", "kube-system", "kube-dns", "dns", true},
		{"local-ZUQNRLBF-lab/local-only/tcp/http", "lab", "local-only", "http", true},
		{"service-OUFW3EVS-a/b/sctp/", "a", "b", "", true}, // an unnamed port
		{"service-endpoints-check", "", "", "", false},
		{"endpoint-4M7KHNGR-lab/sticky/tcp/http__10.244.1.3/8080", "", "", "", false},
		{"service", "", "", "", false},
		{"service-FY5PMXPG", "", "", "", false},
	} {
		ns, n, p, ok := ParseNFTServiceChain(tc.chain)
		if ns != tc.namespace || n != tc.name || p != tc.portName || ok != tc.ok {
			t.Errorf("ParseNFTServiceChain(%q) = %q, %q, %q, %v; want %q, %q, %q, %v", tc.chain, ns, n, p, ok, tc.namespace, tc.name, tc.portName, tc.ok)
		}
	}
}

// The []byte variants run once per rule in the netlink and socket-option readers.
func TestBytesVariantsDoNotAllocate(t *testing.T) {
	svc := []byte("service-FY5PMXPG-kube-system/kube-dns/udp/dns")
	sep := []byte("KUBE-SEP-HUGL6XOLN2FXI7EB")
	other := []byte("kube-system/kube-dns:dns -> 10.244.1.3:53")
	n := testing.AllocsPerRun(100, func() {
		_ = IsNFTServiceChainBytes(svc) && IsNFTEndpointChainBytes(svc)
		_ = IsIPTablesServiceChainBytes(sep) || IsIPTablesEndpointChainBytes(sep)
		_, _, _ = ParseServiceCommentBytes(other)
	})
	if n != 0 {
		t.Errorf("%v allocations, want none", n)
	}
	comment := []byte("kube-system/kube-dns:dns cluster IP")
	if n := testing.AllocsPerRun(100, func() { _, _, _ = ParseServiceCommentBytes(comment) }); n > 1 {
		t.Errorf("ParseServiceCommentBytes of a service comment: %v allocations, want at most one", n)
	}
}
