package rules

import (
	"net/netip"
	"slices"

	"github.com/proxyhealth/proxyhealth/internal/cluster"
	"github.com/proxyhealth/proxyhealth/internal/hostrules"
)

// PortEndpoints is one service port side by side: the endpoints the API wants kube-proxy to
// program on this node, and those its rules hold, both families together.
type PortEndpoints struct {
	Name       cluster.ServicePortName
	Port       uint16
	ClusterIPs []netip.Addr
	// Expected and Programmed are sorted and distinct, over the port's chains. Programmed is
	// nil when the rules hold no chain for the port (or were not read).
	Expected   []netip.AddrPort
	Programmed []netip.AddrPort
	// Stale and Missing are the differences now, each chain compared with what it should
	// hold as the drift check compares them: an endpoint is stale when a chain holds it
	// without cause, missing when a chain that should hold it lacks it. Sorted, each once;
	// nil when the rules were not read.
	Stale, Missing []netip.AddrPort
	// Chains are the port's chains (or IPVS virtual servers) found in the rules.
	Chains []string
	// ByChain is each of the port's chains (or virtual servers) the API wants or the rules
	// hold, cluster first.
	ByChain []ChainEndpoints
}

// ChainEndpoints is one of a service port's chains (or IPVS virtual servers) side by side.
type ChainEndpoints struct {
	// Chain is which of the port's lists it holds: ClusterChain, or LocalChain where a Local
	// traffic policy applies.
	Chain Chains
	// Name is the chain's name in kube-proxy's mode, or the virtual server
	// ("10.96.0.10:53/UDP"); empty when the rules were not read.
	Name string
	// Expected are the endpoints the chain should hold, Programmed those it holds (nil when
	// the rules have no such chain, or were not read), Stale and Missing the differences.
	// Sorted and distinct, both families together.
	Expected, Programmed, Stale, Missing []netip.AddrPort
}

// ServiceEndpoints returns, per port of the Service namespace/name in snap, what the API
// expects on this node and what kube-proxy's rules in st hold; nil when snap has no such
// Service. It compares as the drift check does, without a grace period.
func ServiceEndpoints(snap *cluster.Snapshot, st *hostrules.State, namespace, name string) []PortEndpoints {
	var byFamily map[bool]programmedRules
	if st != nil && comparable(st) {
		byFamily = programmedByFamily(st)
	}
	var out []PortEndpoints
	for _, sp := range snap.Ports {
		if sp.Name.Namespace != namespace || sp.Name.Name != name {
			continue
		}
		out = append(out, portEndpoints(sp, byFamily))
	}
	return out
}

// portEndpoints is ServiceEndpoints for one port, with the rules of each family (none when
// byFamily is nil). ByChain has one entry per holder, a chain's two families together: the
// cluster and local chains, or each virtual server.
func portEndpoints(sp *cluster.ServicePort, byFamily map[bool]programmedRules) PortEndpoints {
	pe := PortEndpoints{Name: sp.Name, Port: sp.Port, ClusterIPs: slices.Clone(sp.ClusterIPs)}
	pe.Expected = distinctSorted(append(slices.Clone(sp.ClusterEndpoints), sp.LocalEndpoints...))
	var byHolder []ChainEndpoints
	at := func(list Chains, name string) *ChainEndpoints {
		for i := range byHolder {
			if byHolder[i].Name == name && byHolder[i].Chain == list {
				return &byHolder[i]
			}
		}
		byHolder = append(byHolder, ChainEndpoints{Chain: list, Name: name})
		return &byHolder[len(byHolder)-1]
	}
	compared := false
	st := &portState{name: sp.Name}
	var hs []holder
	for _, ipv6 := range []bool{false, true} {
		r := byFamily[ipv6]
		if r == nil {
			continue
		}
		hs = r.holders(hs[:0], st, sp, ipv6)
		for _, h := range hs {
			name := h.label()
			bc := at(h.list, name)
			bc.Expected = append(bc.Expected, h.want...)
			if h.eps != nil {
				if !slices.Contains(pe.Chains, name) {
					pe.Chains = append(pe.Chains, name)
				}
				pe.Programmed = append(pe.Programmed, h.eps...)
				bc.Programmed = append(bc.Programmed, h.eps...)
			}
			if !hasFamily(sp.ClusterIPs, ipv6) {
				continue // a family the port does not have is not compared, as in the check
			}
			compared = true
			stale, missing := diffEndpoints(h.eps, h.want, ipv6)
			bc.Stale = append(bc.Stale, stale...)
			bc.Missing = append(bc.Missing, missing...)
			pe.Stale = append(pe.Stale, stale...)
			pe.Missing = append(pe.Missing, missing...)
		}
	}
	if byHolder == nil {
		// The rules were not read: the port's two lists as the API gives them, unnamed.
		byHolder = []ChainEndpoints{{Chain: ClusterChain, Expected: slices.Clone(sp.ClusterEndpoints)},
			{Chain: LocalChain, Expected: slices.Clone(sp.LocalEndpoints)}}
	}
	if pe.Programmed != nil {
		pe.Programmed = distinctSorted(pe.Programmed)
	}
	if compared {
		pe.Stale = distinctSorted(orEmpty(pe.Stale))
		pe.Missing = distinctSorted(orEmpty(pe.Missing))
	}
	// Cluster first, each list's holders in the order the rules gave them.
	slices.SortStableFunc(byHolder, func(a, b ChainEndpoints) int { return int(a.Chain) - int(b.Chain) })
	for _, bc := range byHolder {
		bc.Expected = distinctSorted(bc.Expected)
		if len(bc.Expected) == 0 && bc.Programmed == nil {
			continue // a chain kube-proxy should not write and did not
		}
		if bc.Programmed != nil {
			bc.Programmed = distinctSorted(bc.Programmed)
		}
		bc.Stale, bc.Missing = distinctSorted(bc.Stale), distinctSorted(bc.Missing)
		pe.ByChain = append(pe.ByChain, bc)
	}
	return pe
}

// orEmpty is eps, or an empty list for nil: compared, with nothing found.
func orEmpty(eps []netip.AddrPort) []netip.AddrPort {
	if eps == nil {
		return []netip.AddrPort{}
	}
	return eps
}

func distinctSorted(eps []netip.AddrPort) []netip.AddrPort {
	slices.SortFunc(eps, netip.AddrPort.Compare)
	return slices.Compact(eps)
}
