package rules

import (
	"net/netip"

	"github.com/proxyhealth/proxyhealth/internal/cluster"
	"github.com/proxyhealth/proxyhealth/internal/hostrules"
	"github.com/proxyhealth/proxyhealth/internal/kubeproxynames"
	"github.com/proxyhealth/proxyhealth/internal/ruleset"
)

// programmedRules is one read of what kube-proxy programmed for one IP family, whatever its
// mode: the endpoints of its service port chains, named as chainsFor names them.
type programmedRules interface {
	// nftables tells how the chains are named: as kube-proxy's nftables mode names them, else
	// as its iptables mode does.
	nftables() bool
	// chain returns a service port chain's endpoints, and whether the rules have the chain.
	chain(name string) (eps []netip.AddrPort, ok bool)
	// chainCount is how many service port chains the rules have: those no API service port
	// accounts for are rules of service ports the API does not have.
	chainCount() int
	// identity is a comparable value equal for two reads of the same rules, never for rules
	// that differ; nil when the rules cannot tell. A check reuses what the previous one found
	// of a port whose API entry and rules are the same again.
	identity() any
}

// programmed is kube-proxy's rules of one family as hostrules read them, with the chain names
// of the mode they were read in.
type programmed struct {
	table *ruleset.ProxyTable
	nft   bool
}

// programmedByFamily wraps st's rules.
func programmedByFamily(st *hostrules.State) map[bool]programmedRules {
	out := make(map[bool]programmedRules, len(st.Proxy))
	for ipv6, t := range st.Proxy {
		if t != nil {
			out[ipv6] = programmed{table: t, nft: st.Mode == hostrules.ModeNFTables}
		}
	}
	return out
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
