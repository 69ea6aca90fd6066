//go:build linux

package main

import (
	"bytes"
	"fmt"
	"net/netip"

	"github.com/proxyhealth/proxyhealth/bench/internal/synthcluster"
	"github.com/proxyhealth/proxyhealth/internal/kubeproxynames"
)

// natRules writes the nat table the way kube-proxy v1.36's iptables mode writes it
// (pkg/proxy/iptables/proxier.go syncProxyRules) for bench/internal/synthcluster's ClusterIP
// services, the ones part 4 loads into the API, in iptables-restore format: chain declarations, then its fixed rules, a KUBE-SERVICES jump per service port, a
// KUBE-MARK-MASQ rule for off-cluster sources in each KUBE-SVC chain, one
// "statistic --mode random" jump per endpoint, and in each KUBE-SEP chain a hairpin
// KUBE-MARK-MASQ and the DNAT. Every rule carries its comment; kube-proxy itself leaves the
// per-endpoint comments out once a node has more than 1,000 endpoints (its "large cluster
// mode"), so real tables at this scale are about a quarter smaller: this is the larger case.
func natRules(services, endpoints int) []byte {
	return natRulesRange(0, services, services, endpoints)
}

// natRulesChunks is natRules cut into restore files of chunk services each, for
// `iptables-restore --noflush` one after the other: only the first declares the fixed chains
// (declaring an existing chain would flush it), only the last ends KUBE-SERVICES.
// iptables-nft-restore's time grows faster than linearly with the chains in one file (0.7 s
// for 5,500 chains, 17 s for 22,000, over ten minutes for 110,000 on a 2-core machine), and
// linearly over such chunks.
func natRulesChunks(services, endpoints, chunk int) [][]byte {
	var out [][]byte
	for lo := 0; lo < services; lo += chunk {
		out = append(out, natRulesRange(lo, min(lo+chunk, services), services, endpoints))
	}
	return out
}

// natRulesRange writes services [lo, hi) of services.
func natRulesRange(lo, hi, services, endpoints int) []byte {
	var chains, rules bytes.Buffer
	chains.Grow((hi - lo) * (1 + endpoints) * 30)
	rules.Grow((hi - lo) * (150 + endpoints*330))
	chains.WriteString("*nat\n")
	if lo == 0 {
		writeFixed(&chains, &rules)
	}
	for s := lo; s < hi; s++ {
		writeService(&chains, &rules, s, endpoints)
	}
	if hi == services {
		rules.WriteString("-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS\n")
	}
	rules.WriteString("COMMIT\n")
	out := chains.Bytes()
	return append(out, rules.Bytes()...)
}

func writeFixed(chains, rules *bytes.Buffer) {
	chains.WriteString("\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n")
	chains.WriteString(":KUBE-SERVICES - [0:0]\n:KUBE-NODEPORTS - [0:0]\n:KUBE-POSTROUTING - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n")
	rules.WriteString("-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n")
	rules.WriteString("-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n")
	rules.WriteString("-A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING\n")
	rules.WriteString("-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN\n")
	rules.WriteString("-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000\n")
	rules.WriteString("-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully\n")
	rules.WriteString("-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000\n")
}

func writeService(chains, rules *bytes.Buffer, s, endpoints int) {
	ns, svcName := synthcluster.Namespace(s), synthcluster.Name(s)
	name := ns + "/" + svcName + ":" + synthcluster.PortName
	vip := synthcluster.VIP(s)
	svc, _ := kubeproxynames.IPTablesServiceChains(ns, svcName, synthcluster.PortName, "TCP")
	fmt.Fprintf(chains, ":%s - [0:0]\n", svc)
	fmt.Fprintf(rules, "-A KUBE-SERVICES -m comment --comment \"%s cluster IP\" -m tcp -p tcp -d %s --dport %d -j %s\n", name, vip, synthcluster.Port, svc)
	fmt.Fprintf(rules, "-A %s -m comment --comment \"%s cluster IP\" -m tcp -p tcp -d %s --dport %d ! -s %s -j KUBE-MARK-MASQ\n", svc, name, vip, synthcluster.Port, synthcluster.ClusterCIDR)
	for e := range endpoints {
		ip := synthcluster.EndpointIP(s, e, endpoints)
		addrPort := netip.AddrPortFrom(ip, synthcluster.PodPort)
		ep := addrPort.String()
		sep := kubeproxynames.IPTablesEndpointChain(ns, svcName, synthcluster.PortName, "TCP", addrPort)
		fmt.Fprintf(chains, ":%s - [0:0]\n", sep)
		if left := endpoints - e; left > 1 {
			fmt.Fprintf(rules, "-A %s -m comment --comment \"%s -> %s\" -m statistic --mode random --probability %0.10f -j %s\n", svc, name, ep, 1/float64(left), sep)
		} else {
			fmt.Fprintf(rules, "-A %s -m comment --comment \"%s -> %s\" -j %s\n", svc, name, ep, sep)
		}
		fmt.Fprintf(rules, "-A %s -m comment --comment %s -s %s -j KUBE-MARK-MASQ\n", sep, name, ip)
		fmt.Fprintf(rules, "-A %s -m comment --comment %s -m tcp -p tcp -j DNAT --to-destination %s\n", sep, name, ep)
	}
}
