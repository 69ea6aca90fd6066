package rules

import (
	"iter"
	"maps"
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
	// serviceChains yields every service port chain in the rules: those no API service port
	// accounts for are rules of service ports the API does not have.
	serviceChains() iter.Seq[string]
}

// programmed is kube-proxy's rules of one family as hostrules read them, with the chain names
// of the mode they were read in.
type programmed struct {
	table    *ruleset.ProxyTable
	nftables bool
	// names, when set, remembers chain names across checks; it belongs to one goroutine.
	names *chainNames
}

// programmedByFamily wraps st's rules; names may be nil (no names remembered).
func programmedByFamily(st *hostrules.State, names *chainNames) map[bool]programmedRules {
	out := make(map[bool]programmedRules, len(st.Proxy))
	for ipv6, t := range st.Proxy {
		if t != nil {
			out[ipv6] = programmed{table: t, nftables: st.Mode == hostrules.ModeNFTables, names: names}
		}
	}
	return out
}

func (p programmed) chainsFor(n cluster.ServicePortName) (string, string) {
	if p.names == nil {
		return chainsFor(n, p.nftables)
	}
	return p.names.lookup(n, p.nftables)
}

func chainsFor(n cluster.ServicePortName, nftables bool) (string, string) {
	if nftables {
		base := nftChainNameBase(n)
		return nftClusterChainPrefix + base, nftLocalChainPrefix + base
	}
	hash := portProtoHash(n.String(), strings.ToLower(n.Protocol))
	return "KUBE-SVC-" + hash, "KUBE-SVL-" + hash
}

func (p programmed) endpoints(chain string) []netip.AddrPort { return p.table.Chains[chain] }

func (p programmed) serviceChains() iter.Seq[string] { return maps.Keys(p.table.Chains) }

// chainNames remembers service ports' chain names: kube-proxy names them by a SHA-256 of the
// port's name, and a drift check at 10,000 ports would otherwise hash every one again. It
// forgets everything once it holds twice the ports of the last check, so ports gone from the
// API do not pile up.
type chainNames struct {
	byPort map[chainNameKey][2]string
}

type chainNameKey struct {
	name     cluster.ServicePortName
	nftables bool
}

func newChainNames() *chainNames { return &chainNames{byPort: map[chainNameKey][2]string{}} }

func (c *chainNames) lookup(n cluster.ServicePortName, nftables bool) (string, string) {
	k := chainNameKey{n, nftables}
	if pair, ok := c.byPort[k]; ok {
		return pair[0], pair[1]
	}
	cl, lo := chainsFor(n, nftables)
	c.byPort[k] = [2]string{cl, lo}
	return cl, lo
}

// checked tells the cache how many service ports the check that just ended compared.
func (c *chainNames) checked(ports int) {
	if len(c.byPort) > 2*ports+64 {
		clear(c.byPort)
	}
}
