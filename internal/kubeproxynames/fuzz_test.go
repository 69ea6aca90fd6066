package kubeproxynames

import (
	"strings"
	"testing"
)

// FuzzParseServiceComment holds the comment parser's two variants to one answer, and its
// answer to the comment kube-proxy would write for it.
func FuzzParseServiceComment(f *testing.F) {
	for _, c := range []string{"kube-system/kube-dns:dns cluster IP", "default/kubernetes cluster IP", "a/b:c:d cluster IP", "/ cluster IP", "lab/web:http external IP"} {
		f.Add(c)
	}
	f.Fuzz(func(t *testing.T, c string) {
		ns, n, p := ParseServiceComment(c)
		if bns, bn, bp := ParseServiceCommentBytes([]byte(c)); bns != ns || bn != n || bp != p {
			t.Fatalf("ParseServiceCommentBytes(%q) = %q, %q, %q; ParseServiceComment says %q, %q, %q", c, bns, bn, bp, ns, n, p)
		}
		if ns == "" {
			if n != "" || p != "" {
				t.Fatalf("ParseServiceComment(%q) = %q, %q, %q: a name without a namespace", c, ns, n, p)
			}
			return
		}
		if strings.Contains(ns, "/") || strings.Contains(n, ":") {
			t.Fatalf("ParseServiceComment(%q) = %q, %q, %q", c, ns, n, p)
		}
		if again := servicePortName(ns, n, p) + " cluster IP"; again != c && p != "" {
			t.Fatalf("ParseServiceComment(%q) = %q, %q, %q, which kube-proxy writes as %q", c, ns, n, p, again)
		}
	})
}

// FuzzNFTChainNames holds the predicates' two variants to one answer, and builds the chains of
// the service port the parser reads from a name, which must give it back.
func FuzzNFTChainNames(f *testing.F) {
	for _, c := range []string{"service-FY5PMXPG-kube-system/kube-dns/udp/dns", "local-ZUQNRLBF-lab/local-only/tcp/http", "endpoint-4M7KHNGR-lab/sticky/tcp/http__10.244.1.3/8080", "service-endpoints-check", "KUBE-SVC-TCOU7JCQXEZGVUNU", "KUBE-SEP-HUGL6XOLN2FXI7EB"} {
		f.Add(c)
	}
	f.Fuzz(func(t *testing.T, name string) {
		b := []byte(name)
		if IsNFTServiceChain(name) != IsNFTServiceChainBytes(b) || IsNFTEndpointChain(name) != IsNFTEndpointChainBytes(b) ||
			IsIPTablesServiceChain(name) != IsIPTablesServiceChainBytes(b) || IsIPTablesEndpointChain(name) != IsIPTablesEndpointChainBytes(b) {
			t.Fatalf("%q: the string and []byte predicates disagree", name)
		}
		ns, n, p, ok := ParseNFTServiceChain(name)
		if !ok {
			return
		}
		c, _ := NFTServiceChains(ns, n, p, "tcp")
		if len(c) >= len(NFTClusterChainPrefix)+nftChainNameBaseMax {
			return // cut: kube-proxy's names never are
		}
		if gns, gn, gp, gok := ParseNFTServiceChain(c); !gok || gns != ns || gn != n || gp != p {
			t.Fatalf("%q: parsed as %q, %q, %q, whose chain %q parses as %q, %q, %q, %v", name, ns, n, p, c, gns, gn, gp, gok)
		}
	})
}
