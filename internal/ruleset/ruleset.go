// Package ruleset is the shape in which proxyhealth keeps what it read of a node's netfilter
// rules, whatever the backend they came from (iptables legacy through its socket options,
// iptables-nft and native nftables through nf_tables netlink): kube-proxy's service view of one
// IP family (ProxyTable) and the forward path's rules reduced to what the search for a
// conntrack INVALID drop needs (Graph). Readers fill these; the collectors only read them, so
// the drift check, the drop-rule check and flow attribution never see a backend's own format.
package ruleset

import (
	"net/netip"
	"sync/atomic"
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
	// ID numbers the tables a reader that follows changes derives one from another (NextID);
	// 0 for a table read whole.
	ID uint64
	// Deltas say how Chains differs from the tables this one was derived from, the nearest
	// first: a reader of a table with a given ID learns what changed since without comparing
	// every chain.
	Deltas []Delta
}

// Delta is what changed in a ProxyTable's Chains since the table numbered Since: the chains
// named in Changed were added, changed or removed; every other chain is the same.
type Delta struct {
	Since   uint64
	Changed map[string]struct{}
}

// ChangedSince reports whether Chains may differ from those of the table numbered id in chain
// name: true unless a Delta since id says it is the same.
func (t *ProxyTable) ChangedSince(id uint64, name string) bool {
	if id == 0 {
		return true
	}
	if id == t.ID {
		return false
	}
	for _, d := range t.Deltas {
		if d.Since == id {
			_, changed := d.Changed[name]
			return changed
		}
	}
	return true
}

// Content is the table without its derivation (ID, Deltas): two reads of the same rules have
// the same Content, whichever way they were read.
func (t *ProxyTable) Content() *ProxyTable {
	if t == nil {
		return nil
	}
	return &ProxyTable{Chains: t.Chains, Services: t.Services}
}

var lastID atomic.Uint64

// NextID returns a ProxyTable ID not given out before in this process.
func NextID() uint64 { return lastID.Add(1) }

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
