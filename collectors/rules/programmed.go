package rules

import (
	"net/netip"

	"github.com/proxyhealth/proxyhealth/internal/cluster"
	"github.com/proxyhealth/proxyhealth/internal/hostrules"
	"github.com/proxyhealth/proxyhealth/internal/ipvs"
	"github.com/proxyhealth/proxyhealth/internal/kubeproxynames"
	"github.com/proxyhealth/proxyhealth/internal/ruleset"
)

// programmedRules is one read of what kube-proxy programmed for one IP family, whatever its
// mode. A mode holds a service port's endpoints in holders of its own (the cluster and local
// chains of the iptables and nftables modes, the virtual servers of the IPVS mode), each of
// which should hold one of the API's two lists of the port: a new mode is one more
// implementation, and the drift check compares each holder with its list.
type programmedRules interface {
	// holders appends to dst the holders of sp's endpoints in these rules for this family:
	// those the rules have, and those they should have and lack. st is the port's state, which
	// a mode may keep names in.
	holders(dst []holder, st *portState, sp *cluster.ServicePort, ipv6 bool) []holder
	// holderCount is how many service port holders the rules have: those no API service port
	// accounts for are rules of service ports the API does not have.
	holderCount() int
	// identity is a comparable value equal for two reads of the same rules, never for rules
	// that differ; nil when the rules cannot tell. A check reuses what the previous one found
	// of a port whose API entry and rules are the same again.
	identity() any
}

// holder is one chain (or virtual server) of a service port side by side with what the API
// says it should hold.
type holder struct {
	// list is which of the port's endpoint lists it holds: ClusterChain, or LocalChain for
	// the traffic a Local policy keeps on the node.
	list Chains
	// name is the chain's name; empty for a virtual server, named by server.
	name string
	// server is the virtual server's address, port and protocol (IPVS mode only): named
	// only where a difference or diagnose needs it, as most checks find none.
	server ipvs.Key
	// present is set when the rules have it; eps are its endpoints (nil when absent).
	present bool
	eps     []netip.AddrPort
	// want are the endpoints the API gives it, both families together (the comparison takes
	// those of the holder's family).
	want []netip.AddrPort
}

// label is the holder's name: the chain's, or the virtual server's ("10.96.0.10:53/UDP").
func (h *holder) label() string {
	if h.name == "" && h.server.Addr.IsValid() {
		return h.server.String()
	}
	return h.name
}

// chainRules are the iptables and nftables modes' rules: a service port's endpoints in its
// cluster and local chains, named by a hash of the port.
type chainRules interface {
	// nftables tells how the chains are named: as kube-proxy's nftables mode names them, else
	// as its iptables mode does.
	nftables() bool
	// chain returns a service port chain's endpoints, and whether the rules have the chain.
	chain(name string) (eps []netip.AddrPort, ok bool)
	// chainCount is how many service port chains the rules have.
	chainCount() int
	// identity is programmedRules's.
	identity() any
}

// byChains is chainRules as programmedRules: each port has its cluster chain, holding the
// API's cluster endpoints, and its local chain, holding the local ones. A chain kube-proxy
// does not write (no usable endpoints of its kind) is absent, and should be: one that should
// hold endpoints and is absent has them all missing.
type byChains struct{ chainRules }

func (b byChains) holders(dst []holder, st *portState, sp *cluster.ServicePort, _ bool) []holder {
	clusterChain, localChain := st.chainsFor(b.nftables())
	eps, ok := b.chain(clusterChain)
	dst = append(dst, holder{list: ClusterChain, name: clusterChain, present: ok, eps: eps, want: sp.ClusterEndpoints})
	eps, ok = b.chain(localChain)
	return append(dst, holder{list: LocalChain, name: localChain, present: ok, eps: eps, want: sp.LocalEndpoints})
}

func (b byChains) holderCount() int { return b.chainCount() }

// unchangedFor is deltaRules's: a followed table says which chains changed since the tables
// before it (ruleset.ProxyTable.Deltas).
func (b byChains) unchangedFor(st *portState, since any) bool {
	p, ok := b.chainRules.(programmed)
	if !ok {
		return false
	}
	q, ok := since.(programmed)
	if !ok || q.nft != p.nft || q.table.ID == 0 || st.chains[0] == "" || st.nftables != p.nft {
		return false
	}
	return !p.table.ChangedSince(q.table.ID, st.chains[0]) && !p.table.ChangedSince(q.table.ID, st.chains[1])
}

// programmed is kube-proxy's rules of one family as hostrules read them, with the chain names
// of the mode they were read in.
type programmed struct {
	table *ruleset.ProxyTable
	nft   bool
}

// programmedByFamily wraps st's rules: kube-proxy's chains, or its virtual servers.
func programmedByFamily(st *hostrules.State) map[bool]programmedRules {
	if st.Mode == hostrules.ModeIPVS {
		return virtualServersByFamily(st.IPVS)
	}
	out := make(map[bool]programmedRules, len(st.Proxy))
	for ipv6, t := range st.Proxy {
		if t != nil {
			out[ipv6] = byChains{programmed{table: t, nft: st.Mode == hostrules.ModeNFTables}}
		}
	}
	return out
}

// comparable reports whether st holds rules the drift check can compare.
func comparable(st *hostrules.State) bool {
	switch st.Mode {
	case hostrules.ModeIPTables, hostrules.ModeNFTables:
		return true
	case hostrules.ModeIPVS:
		return st.IPVS != nil
	}
	return false
}

func (p programmed) nftables() bool { return p.nft }

func (p programmed) chain(name string) ([]netip.AddrPort, bool) {
	eps, ok := p.table.Chains[name]
	return eps, ok
}

func (p programmed) chainCount() int { return len(p.table.Chains) }

// identity is the table's: hostrules publishes a new ProxyTable for each change and never
// modifies one.
func (p programmed) identity() any { return p }

// chainsFor names a service port's cluster and local chains, as kube-proxy's nftables mode
// names them or as its iptables mode does. kube-proxy names them by a hash of the service
// port, so a chain is found from the API's service port without reading rule comments, which
// kube-proxy leaves out above 1,000 endpoints.
func chainsFor(n cluster.ServicePortName, nftables bool) (clusterChain, localChain string) {
	if nftables {
		return kubeproxynames.NFTServiceChains(n.Namespace, n.Name, n.Port, n.Protocol)
	}
	return kubeproxynames.IPTablesServiceChains(n.Namespace, n.Name, n.Port, n.Protocol)
}
