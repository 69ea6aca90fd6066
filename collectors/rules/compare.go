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
	// Expected and Programmed are sorted and distinct. Programmed is nil when the rules hold
	// no chain for the port (or were not read).
	Expected   []netip.AddrPort
	Programmed []netip.AddrPort
	// Chains are the port's chains found in the rules.
	Chains []string
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
		pe := PortEndpoints{Name: sp.Name, Port: sp.Port, ClusterIPs: slices.Clone(sp.ClusterIPs)}
		pe.Expected = distinctSorted(append(slices.Clone(sp.ClusterEndpoints), sp.LocalEndpoints...))
		for _, ipv6 := range []bool{false, true} {
			r := byFamily[ipv6]
			if r == nil {
				continue
			}
			clusterChain, localChain := chainsFor(sp.Name, r.nftables())
			for _, c := range []string{clusterChain, localChain} {
				if eps, _ := r.chain(c); eps != nil {
					pe.Chains = append(pe.Chains, c)
					pe.Programmed = append(pe.Programmed, eps...)
				}
			}
		}
		if pe.Programmed != nil {
			pe.Programmed = distinctSorted(pe.Programmed)
		}
		out = append(out, pe)
	}
	return out
}

func distinctSorted(eps []netip.AddrPort) []netip.AddrPort {
	slices.SortFunc(eps, netip.AddrPort.Compare)
	return slices.Compact(eps)
}
