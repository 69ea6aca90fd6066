package cluster

import (
	"net/netip"
	"slices"
)

// endpoint is kube-proxy's BaseEndpointInfo (pkg/proxy/endpoint.go) reduced to what
// CategorizeEndpoints reads.
type endpoint struct {
	addr        netip.AddrPort
	local       bool // on this node (EndpointSliceCache.isLocal)
	ready       bool
	serving     bool
	terminating bool
	// Nil when the endpoint has no hint of that kind: kube-proxy tells "no hints" from
	// "hints for other zones" by the set's length.
	zoneHints []string
	nodeHints []string
}

// trafficPolicy is the part of kube-proxy's BaseServicePortInfo (pkg/proxy/serviceport.go)
// that decides which endpoint lists a service port uses. It is per IP family: a Service's
// external IPs and load-balancer VIPs count only for the proxier of their own family.
type trafficPolicy struct {
	internalLocal        bool // internalTrafficPolicy: Local
	externalLocal        bool // externalTrafficPolicy: Local on an externally accessible type
	externallyAccessible bool // node port, or an external IP or VIP of this family
}

// usesClusterEndpoints is BaseServicePortInfo.UsesClusterEndpoints: even with
// externalTrafficPolicy Local, an externally reachable port needs cluster endpoints for
// short-circuited traffic from the node itself.
func (p trafficPolicy) usesClusterEndpoints() bool {
	return !p.internalLocal || p.externallyAccessible
}

// usesLocalEndpoints is BaseServicePortInfo.UsesLocalEndpoints.
func (p trafficPolicy) usesLocalEndpoints() bool {
	return p.internalLocal || (p.externalLocal && p.externallyAccessible)
}

// Topology modes of kube-proxy's topologyModeFromHints (the Service's trafficDistribution
// values it maps hints to).
const (
	topologyNone     = ""
	topologySameZone = "PreferSameZone"
	topologySameNode = "PreferSameNode"
)

// categorizeEndpoints is kube-proxy's CategorizeEndpoints (pkg/proxy/topology.go; the same in
// effect from v1.34 to v1.37)
// without the parts no chain depends on (allReachableEndpoints, hasAnyEndpoints): cluster
// holds what goes into the cluster chain (KUBE-SVC-*, or the nftables service- chain), local
// what goes into the local chain (KUBE-SVL-*, or local-). Either is nil when the port does not
// use that kind of endpoints, or has none of it.
//
// Usable means ready, falling back to serving-and-terminating when there is none: for the
// cluster list when no ready endpoint exists anywhere (topology never leaves a ready endpoint
// out entirely, see topologyModeFromHints), for the local list when no ready endpoint exists
// on this node. Topology hints filter the cluster list only.
func categorizeEndpoints(eps []endpoint, policy trafficPolicy, nodeName, zone string) (cluster, local []endpoint) {
	if len(eps) == 0 {
		return nil, nil
	}
	if policy.usesClusterEndpoints() {
		mode := topologyModeFromHints(eps, nodeName, zone)
		cluster = filterEndpoints(eps, func(ep endpoint) bool {
			return ep.ready && availableForTopology(ep, mode, nodeName, zone)
		})
		if len(cluster) == 0 {
			cluster = filterEndpoints(eps, func(ep endpoint) bool {
				return ep.serving && ep.terminating
			})
		}
	}
	if !policy.usesLocalEndpoints() {
		return cluster, nil
	}
	var localReady, localServingTerminating bool
	for _, ep := range eps {
		if !ep.local {
			continue
		}
		if ep.ready {
			localReady = true
		} else if ep.serving && ep.terminating {
			localServingTerminating = true
		}
	}
	switch {
	case localReady:
		local = filterEndpoints(eps, func(ep endpoint) bool { return ep.local && ep.ready })
	case localServingTerminating:
		local = filterEndpoints(eps, func(ep endpoint) bool { return ep.local && ep.serving && ep.terminating })
	}
	return cluster, local
}

// topologyModeFromHints is kube-proxy's function of that name. Only ready endpoints count.
// Node hints win when every ready endpoint has one and one names this node; otherwise zone
// hints when every ready endpoint has one and one names this node's zone; otherwise no
// filtering. The PreferSameTrafficDistribution gate that guards node hints is GA and locked on
// since v1.35, so node hints are always honoured here.
func topologyModeFromHints(eps []endpoint, nodeName, zone string) string {
	hasReady := false
	allNodeHints, forNode := true, false
	allZoneHints, forZone := true, false
	for _, ep := range eps {
		if !ep.ready {
			continue
		}
		hasReady = true
		if len(ep.nodeHints) == 0 {
			allNodeHints = false
		} else if slices.Contains(ep.nodeHints, nodeName) {
			forNode = true
		}
		if len(ep.zoneHints) == 0 {
			allZoneHints = false
		} else if slices.Contains(ep.zoneHints, zone) {
			forZone = true
		}
	}
	switch {
	case !hasReady:
		return topologyNone
	case allNodeHints && forNode:
		return topologySameNode
	case allZoneHints && forZone:
		return topologySameZone
	}
	return topologyNone
}

// availableForTopology is kube-proxy's function of that name.
func availableForTopology(ep endpoint, mode, nodeName, zone string) bool {
	switch mode {
	case topologyNone:
		return true
	case topologySameNode:
		return slices.Contains(ep.nodeHints, nodeName)
	case topologySameZone:
		return slices.Contains(ep.zoneHints, zone)
	}
	return false
}

// filterEndpoints returns the endpoints of eps that keep accepts: eps itself when it
// accepts all of them (the usual case, which then allocates nothing; nobody modifies the
// result).
func filterEndpoints(eps []endpoint, keep func(endpoint) bool) []endpoint {
	n := 0
	for _, ep := range eps {
		if keep(ep) {
			n++
		}
	}
	switch n {
	case 0:
		return nil
	case len(eps):
		return eps
	}
	out := make([]endpoint, 0, n)
	for _, ep := range eps {
		if keep(ep) {
			out = append(out, ep)
		}
	}
	return out
}
