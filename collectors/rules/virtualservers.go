package rules

import (
	"net/netip"

	"github.com/proxyhealth/proxyhealth/internal/cluster"
	"github.com/proxyhealth/proxyhealth/internal/ipvs"
)

// virtualServers are kube-proxy's IPVS mode's rules of one family, read by internal/ipvs. Its
// IPVS proxier (pkg/proxy/ipvs/proxier.go, syncProxyRules and syncEndpoint; the same from v1.34
// to v1.37) writes, per service port, a virtual server on the cluster IP, one on each external
// IP and VIP-mode load-balancer IP, and one on each node address at the node port. Each holds
// the port's cluster endpoints, or, where a Local traffic policy applies (internal for the
// cluster IP, external for the others), its local ones; and when the port has no local
// endpoint in this family, the cluster endpoints after all (kubernetes#97081), where the
// iptables and nftables modes drop the traffic instead. Session affinity makes a virtual
// server persistent, without changing its real servers.
//
// A node port's virtual servers are those at the node port on an address not bound to
// kube-ipvs0 (ipvs.Table.NodePortServers): which node addresses kube-proxy uses depends on
// --nodeport-addresses and the node's interfaces, so one it lacks is not looked for, but each
// it has is compared.
type virtualServers struct {
	table *ipvs.Table
	ipv6  bool
	count int // the table's virtual servers of this family
}

// virtualServersByFamily wraps t by family: a family is compared once kube-proxy has programmed
// something of it (a virtual server, or an address on kube-ipvs0), as its proxier of that
// family runs only on a node with addresses of it. Nil t (not read) compares nothing.
func virtualServersByFamily(t *ipvs.Table) map[bool]programmedRules {
	out := map[bool]programmedRules{}
	if t == nil {
		return out
	}
	var count [2]int
	var bound [2]bool
	for i := range t.Servers {
		count[familyIndex(t.Servers[i].Addr.Is6())]++
	}
	for a := range t.Bound {
		bound[familyIndex(a.Is6())] = true
	}
	for fam := range count {
		if count[fam] > 0 || bound[fam] {
			out[fam == 1] = virtualServers{table: t, ipv6: fam == 1, count: count[fam]}
		}
	}
	return out
}

func (v virtualServers) holders(dst []holder, _ *portState, sp *cluster.ServicePort, ipv6 bool) []holder {
	proto := sp.Name.Protocol
	internal, internalList := ipvsWant(sp, sp.InternalLocal, ipv6)
	for _, ip := range sp.ClusterIPs {
		if ip.Is6() == ipv6 {
			dst = v.add(dst, ipvs.Key{Addr: ip, Port: sp.Port, Protocol: proto}, internalList, internal, true)
		}
	}
	if len(sp.ExternalIPs) == 0 && sp.NodePort == 0 {
		return dst
	}
	external, externalList := ipvsWant(sp, sp.ExternalLocal, ipv6)
	for _, ip := range sp.ExternalIPs {
		if ip.Is6() == ipv6 {
			dst = v.add(dst, ipvs.Key{Addr: ip, Port: sp.Port, Protocol: proto}, externalList, external, true)
		}
	}
	if sp.NodePort != 0 {
		var nodePorts [4]*ipvs.VirtualServer
		for _, vs := range v.table.NodePortServers(nodePorts[:0], sp.NodePort, proto, ipv6) {
			dst = v.add(dst, vs.Key, externalList, external, false)
		}
	}
	return dst
}

// add appends the holder of the virtual server k, which should hold want (the port's list
// list); one the rules lack only if expected.
func (v virtualServers) add(dst []holder, k ipvs.Key, list Chains, want []netip.AddrPort, expected bool) []holder {
	eps := v.table.Serving(k)
	if eps == nil && !expected {
		return dst
	}
	return append(dst, holder{list: list, server: k, present: eps != nil, eps: eps, want: want})
}

// ipvsWant is the endpoints a virtual server of sp holds in family ipv6 (syncEndpoint): with
// onlyLocal, the local endpoints if the family has any, else the cluster endpoints; without,
// the cluster endpoints. list names the policy the server follows: LocalChain with onlyLocal.
func ipvsWant(sp *cluster.ServicePort, onlyLocal, ipv6 bool) (want []netip.AddrPort, list Chains) {
	if !onlyLocal {
		return sp.ClusterEndpoints, ClusterChain
	}
	for _, ep := range sp.LocalEndpoints {
		if ep.Addr().Unmap().Is6() == ipv6 {
			return sp.LocalEndpoints, LocalChain
		}
	}
	return sp.ClusterEndpoints, LocalChain
}

func (v virtualServers) holderCount() int { return v.count }

// identity is the table's and the family's: hostrules publishes a new table for each read and
// never modifies one.
func (v virtualServers) identity() any { return v }
