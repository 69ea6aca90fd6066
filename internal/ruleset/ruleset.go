// Package ruleset is the shape in which proxyhealth keeps what it read of a node's netfilter
// rules, whatever the backend they came from (iptables legacy through its socket options,
// iptables-nft and native nftables through nf_tables netlink): kube-proxy's service view of one
// IP family (ProxyTable) and the forward path's rules reduced to what the search for a
// conntrack INVALID drop needs (Graph). Readers fill these; the collectors only read them, so
// the drift check, the drop-rule check and flow attribution never see a backend's own format.
package ruleset

import (
	"net/netip"
)

// IP protocol numbers, as conntrack reports them.
const (
	ProtoTCP  uint8 = 6
	ProtoUDP  uint8 = 17
	ProtoSCTP uint8 = 132
)

// ProxyTable is one read of kube-proxy's rules of one IP family: the iptables-mode nat table
// (legacy or iptables-nft) or the nftables-mode table `ip kube-proxy` / `ip6 kube-proxy`.
type ProxyTable struct {
	// Chains maps each service port chain that has rules (iptables mode: KUBE-SVC-*,
	// KUBE-SVL-*; nftables mode: service-*, local-*) to the endpoints it DNATs to, directly
	// or through the endpoint chains it jumps to (KUBE-SEP-*, endpoint-*). Endpoints are
	// sorted and distinct. kube-proxy flushes a chain it stops using before deleting it, so
	// a chain without rules is left out.
	Chains map[string][]netip.AddrPort
	// Services lists the cluster IP service ports kube-proxy dispatches (the KUBE-SERVICES
	// rules that jump to a service chain, or the elements of the service-ips map), for
	// attributing flows to Services without an API.
	Services []Service
}

// Service is one cluster IP service port as kube-proxy's dispatch names it.
type Service struct {
	ClusterIP netip.Addr
	Port      uint16
	Protocol  uint8 // ProtoTCP, ProtoUDP or ProtoSCTP
	// Namespace, Name and PortName come from the rule comment ("ns/name:port cluster IP") in
	// iptables mode, or from the chain name in nftables mode. In iptables mode all three are
	// empty when kube-proxy left comments out (it does above 1,000 endpoints).
	Namespace, Name, PortName string
	// Chain is the service chain the dispatch jumps to.
	Chain string
}
