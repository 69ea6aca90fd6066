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
	// Chains are the port's chains found in the rules.
	Chains []string
	// ByChain is each of the port's chains the API wants or the rules hold, cluster first.
	ByChain []ChainEndpoints
}

// ChainEndpoints is one of a service port's chains side by side.
type ChainEndpoints struct {
	Chain Chains // ClusterChain or LocalChain
	// Name is the chain's name in kube-proxy's mode; empty when the rules were not read.
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
	if st != nil && (st.Mode == hostrules.ModeIPTables || st.Mode == hostrules.ModeNFTables) {
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
// byFamily is nil).
func portEndpoints(sp *cluster.ServicePort, byFamily map[bool]programmedRules) PortEndpoints {
	pe := PortEndpoints{Name: sp.Name, Port: sp.Port, ClusterIPs: slices.Clone(sp.ClusterIPs)}
	pe.Expected = distinctSorted(append(slices.Clone(sp.ClusterEndpoints), sp.LocalEndpoints...))
	want := [2][]netip.AddrPort{sp.ClusterEndpoints, sp.LocalEndpoints} // by portChains
	var byChain [2]ChainEndpoints
	for ch, chain := range portChains {
		byChain[ch] = ChainEndpoints{Chain: chain, Expected: distinctSorted(slices.Clone(want[ch]))}
	}
	compared := false
	for _, ipv6 := range []bool{false, true} {
		r := byFamily[ipv6]
		if r == nil {
			continue
		}
		names := [2]string{}
		names[0], names[1] = chainsFor(sp.Name, r.nftables())
		for ch, c := range names {
			bc := &byChain[ch]
			bc.Name = c
			eps, _ := r.chain(c)
			if eps != nil {
				if !slices.Contains(pe.Chains, c) {
					pe.Chains = append(pe.Chains, c)
				}
				pe.Programmed = append(pe.Programmed, eps...)
				bc.Programmed = append(bc.Programmed, eps...)
			}
			if !hasFamily(sp.ClusterIPs, ipv6) {
				continue // a family the port does not have is not compared, as in the check
			}
			compared = true
			stale, missing := diffEndpoints(eps, want[ch], ipv6)
			bc.Stale = append(bc.Stale, stale...)
			bc.Missing = append(bc.Missing, missing...)
			pe.Stale = append(pe.Stale, stale...)
			pe.Missing = append(pe.Missing, missing...)
		}
	}
	if pe.Programmed != nil {
		pe.Programmed = distinctSorted(pe.Programmed)
	}
	if compared {
		pe.Stale = distinctSorted(orEmpty(pe.Stale))
		pe.Missing = distinctSorted(orEmpty(pe.Missing))
	}
	for _, bc := range byChain {
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
