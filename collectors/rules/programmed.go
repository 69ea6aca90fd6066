package rules

import (
	"net/netip"
	"strings"

	"github.com/proxyhealth/proxyhealth/internal/cluster"
	"github.com/proxyhealth/proxyhealth/internal/hostrules"
	"github.com/proxyhealth/proxyhealth/internal/ruleset"
)

// programmedRules is one read of what kube-proxy programmed for one IP family, whatever its
// mode: the endpoints of a service port's cluster and local chains.
type programmedRules interface {
	// chainsFor names the service port's cluster and local chains.
	chainsFor(n cluster.ServicePortName) (clusterChain, localChain string)
	// endpoints returns a chain's endpoints; nil when kube-proxy wrote no such chain.
	endpoints(chain string) []netip.AddrPort
	// serviceChains lists every service port chain in the rules: those no API service port
	// accounts for are rules of service ports the API does not have.
	serviceChains() []string
}

// programmed is kube-proxy's rules of one family as hostrules read them, with the chain names
// of the mode they were read in.
type programmed struct {
	table    *ruleset.ProxyTable
	nftables bool
}

func programmedByFamily(st *hostrules.State) map[bool]programmedRules {
	out := make(map[bool]programmedRules, len(st.Proxy))
	for ipv6, t := range st.Proxy {
		if t != nil {
			out[ipv6] = programmed{table: t, nftables: st.Mode == hostrules.ModeNFTables}
		}
	}
	return out
}

func (p programmed) chainsFor(n cluster.ServicePortName) (string, string) {
	if p.nftables {
		base := nftChainNameBase(n)
		return nftClusterChainPrefix + base, nftLocalChainPrefix + base
	}
	hash := portProtoHash(n.String(), strings.ToLower(n.Protocol))
	return "KUBE-SVC-" + hash, "KUBE-SVL-" + hash
}

func (p programmed) endpoints(chain string) []netip.AddrPort { return p.table.Chains[chain] }

func (p programmed) serviceChains() []string {
	out := make([]string, 0, len(p.table.Chains))
	for name := range p.table.Chains {
		out = append(out, name)
	}
	return out
}
