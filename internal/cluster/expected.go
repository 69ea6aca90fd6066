package cluster

import (
	"cmp"
	"net/netip"
	"slices"
	"unique"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	utilnet "k8s.io/utils/net"
)

// ServicePorts computes, for one Service and its EndpointSlices (others are ignored), each
// service port as kube-proxy v1.36's iptables and nftables proxiers program it on the node
// nodeName whose topology.kubernetes.io/zone label is zone ("" when it has none). It returns
// nil for Services kube-proxy does not program (ShouldSkipService, or no cluster IP).
//
// It converts the objects to the compact forms the view keeps and computes from those, as
// the view does.
func ServicePorts(svc *corev1.Service, endpointSlices []*discoveryv1.EndpointSlice, nodeName, zone string) []ServicePort {
	slices := make([]*sliceInfo, len(endpointSlices))
	for i, s := range endpointSlices {
		slices[i] = newSliceInfo(s)
	}
	return servicePorts(newServiceInfo(svc), slices, newThisNode(nodeName, zone))
}

// thisNode is the node the expected endpoints are computed for.
type thisNode struct {
	name   string
	handle unique.Handle[string] // zero when name is "": no endpoint is then local
	zone   string                // "" when the node has no zone label
}

func newThisNode(name, zone string) thisNode {
	n := thisNode{name: name, zone: zone}
	if name != "" {
		n.handle = unique.Make(name)
	}
	return n
}

// servicePorts is ServicePorts on the compact forms.
//
// kube-proxy runs one proxier per IP family, each seeing only its family's cluster IP and
// EndpointSlices of its address type; topology hints and the terminating fallback are
// therefore decided per family, and the families' results are listed together here.
func servicePorts(svc *serviceInfo, endpointSlices []*sliceInfo, node thisNode) []ServicePort {
	if svc.skip || len(svc.families) == 0 {
		return nil
	}
	families := svc.families
	endpointsByFamily := make([]map[portKey]*portSet, len(families))
	for i, f := range families {
		endpointsByFamily[i] = endpointsByPort(svc, endpointSlices, f.family, node)
	}
	namespace := svc.key.namespace.Value()
	ports := make([]ServicePort, 0, len(svc.ports))
	for _, p := range svc.ports {
		sp := ServicePort{
			Name: ServicePortName{
				Namespace: namespace,
				Name:      svc.key.name,
				Port:      p.name.Value(),
				Protocol:  string(p.protocol),
			},
			Port:          p.port,
			InternalLocal: svc.internalLocal,
			ExternalLocal: svc.externalLocal,
			ClusterIPs:    make([]netip.Addr, 0, len(families)),
		}
		var only []netip.AddrPort
		for i, f := range families {
			sp.ClusterIPs = append(sp.ClusterIPs, f.clusterIP)
			policy := trafficPolicy{
				internalLocal:        svc.internalLocal,
				externalLocal:        svc.externalLocal,
				externallyAccessible: p.nodePort || f.externalIPs || f.loadBalancerVIPs,
			}
			var eps []endpoint
			if set := endpointsByFamily[i][portKey{p.name, p.protocol}]; set != nil {
				eps, only = set.eps, set.only
			}
			cluster, local := categorizeEndpoints(eps, policy, node.name, node.zone)
			sp.ClusterEndpoints = appendAddrs(sp.ClusterEndpoints, cluster)
			sp.LocalEndpoints = appendAddrs(sp.LocalEndpoints, local)
		}
		sp.ClusterEndpoints = sortAddrs(sp.ClusterEndpoints)
		sp.LocalEndpoints = sortAddrs(sp.LocalEndpoints)
		// Usually every endpoint of the port's one slice is in the cluster chain: publish the
		// slice's own list rather than a copy of it (both are immutable). Only one family can
		// have contributed then.
		if len(families) == 1 && len(only) > 0 && slices.Equal(sp.ClusterEndpoints, only) {
			sp.ClusterEndpoints = only
		}
		ports = append(ports, sp)
	}
	return ports
}

// shouldSkipService is kube-proxy's proxyutil.ShouldSkipService (pkg/proxy/util/utils.go):
// headless Services (clusterIP None or empty) and ExternalName Services are not proxied. The
// service-proxy-name label is filtered when listing, as kube-proxy does (see informers.go).
func shouldSkipService(svc *corev1.Service) bool {
	if svc.Spec.ClusterIP == "" || svc.Spec.ClusterIP == corev1.ClusterIPNone {
		return true
	}
	return svc.Spec.Type == corev1.ServiceTypeExternalName
}

// externallyAccessibleType is apiservice.ExternallyAccessible (pkg/api/v1/service/util.go),
// which gates ExternalPolicyLocal.
func externallyAccessibleType(svc *corev1.Service) bool {
	switch svc.Spec.Type {
	case corev1.ServiceTypeLoadBalancer, corev1.ServiceTypeNodePort:
		return true
	case corev1.ServiceTypeClusterIP:
		return len(svc.Spec.ExternalIPs) > 0
	}
	return false
}

// familyInfo is what one family's proxier knows about a Service.
type familyInfo struct {
	family    corev1.IPFamily
	clusterIP netip.Addr
	// Whether the Service has external IPs or VIP-mode load-balancer ingress IPs of this
	// family (newBaseServiceInfo filters both by family; ExternallyAccessible reads them).
	externalIPs      bool
	loadBalancerVIPs bool
}

// clusterIPsByFamily is proxyutil.GetClusterIPByFamily applied to each family, in the
// Service's own family order (primary first); a family whose cluster IP does not parse is
// left out, as kube-proxy could not program it either.
func clusterIPsByFamily(svc *corev1.Service) []familyInfo {
	var out []familyInfo
	add := func(family corev1.IPFamily, ip string) {
		addr, ok := parseIP(ip)
		if !ok || familyOf(addr) != family {
			return
		}
		fi := familyInfo{family: familyOf(addr), clusterIP: addr} // the constant, not the decoded string
		for _, e := range svc.Spec.ExternalIPs {
			if a, ok := parseIP(e); ok && familyOf(a) == family {
				fi.externalIPs = true
			}
		}
		for _, ing := range svc.Status.LoadBalancer.Ingress {
			if ing.IP == "" || (ing.IPMode != nil && *ing.IPMode != corev1.LoadBalancerIPModeVIP) {
				continue // proxyutil.IsVIPMode: only VIP-mode ingress IPs get rules
			}
			if a, ok := parseIP(ing.IP); ok && familyOf(a) == family {
				fi.loadBalancerVIPs = true
			}
		}
		out = append(out, fi)
	}
	if len(svc.Spec.IPFamilies) == 0 {
		// Before dual-stack fields were set (version skew): the single ClusterIP's family.
		if addr, ok := parseIP(svc.Spec.ClusterIP); ok {
			add(familyOf(addr), svc.Spec.ClusterIP)
		}
		return out
	}
	for i, family := range svc.Spec.IPFamilies {
		if i < len(svc.Spec.ClusterIPs) {
			add(family, svc.Spec.ClusterIPs[i])
		}
	}
	return out
}

// portKey is kube-proxy's ServicePortName without the Service: endpoints belong to the
// service port whose name and protocol equal the EndpointSlice port's.
type portKey struct {
	name     unique.Handle[string]
	protocol corev1.Protocol
}

// endpointsByPort is EndpointSliceCache.endpointInfoByServicePort and addEndpoints
// (pkg/proxy/endpointslicecache.go) for one family: the endpoints of every slice of that
// address type (EndpointsChangeTracker.EndpointSliceUpdate ignores the others, FQDN
// included), grouped by port name and protocol and deduplicated by IP and port.
//
// A slice port without a name (nil, not "") or without a port number is ignored, and so is
// an endpoint whose first address does not parse (newSliceInfo leaves both out). Only an
// endpoint's first address counts.
//
// An endpoint listed twice (it moves between slices, or a new pod reuses a terminating pod's
// IP) keeps the later copy unless that one is terminating. kube-proxy visits slices in map
// order, so which copy is "later" is random there; slices are visited by name here so the
// result is at least stable. The difference lasts until the slices agree again.
func endpointsByPort(svc *serviceInfo, endpointSlices []*sliceInfo, family corev1.IPFamily, node thisNode) map[portKey]*portSet {
	addressType := discoveryv1.AddressTypeIPv4
	if family == corev1.IPv6Protocol {
		addressType = discoveryv1.AddressTypeIPv6
	}
	ordered := make([]*sliceInfo, 0, len(endpointSlices))
	for _, s := range endpointSlices {
		// endpointSliceCacheKeys: a slice belongs to the Service named by its label.
		if s.addressType == addressType && s.key.namespace == svc.key.namespace && s.service == svc.key.name {
			ordered = append(ordered, s)
		}
	}
	slices.SortFunc(ordered, func(a, b *sliceInfo) int { return cmp.Compare(a.key.name, b.key.name) })

	sets := map[portKey]*portSet{}
	for _, s := range ordered {
		for _, port := range s.ports {
			key := portKey{port.name, port.protocol}
			set := sets[key]
			if set == nil {
				set = &portSet{index: make(map[netip.AddrPort]int, len(port.addrs)), only: port.addrs}
				sets[key] = set
			} else {
				set.only = nil
			}
			for i, addr := range port.addrs {
				ep := newEndpoint(addr, &s.endpoints[i], node)
				if j, exists := set.index[ep.addr]; exists {
					if !ep.terminating {
						set.eps[j] = ep
					}
					continue
				}
				set.index[ep.addr] = len(set.eps)
				set.eps = append(set.eps, ep)
			}
		}
	}
	return sets
}

// portSet is one service port's endpoints in one family. When a single slice contributed
// them, only is that slice's (sorted) address list for the port.
type portSet struct {
	eps   []endpoint
	index map[netip.AddrPort]int
	only  []netip.AddrPort
}

// newEndpoint is the body of addEndpoints' loop for one endpoint and port.
func newEndpoint(addr netip.AddrPort, e *endpointInfo, node thisNode) endpoint {
	return endpoint{
		addr:        addr,
		local:       node.name != "" && e.node == node.handle, // EndpointSliceCache.isLocal
		ready:       e.attrs.ready,
		serving:     e.attrs.serving,
		terminating: e.attrs.terminating,
		zoneHints:   e.attrs.zones,
		nodeHints:   e.attrs.nodes,
	}
}

// parseIP parses an address the way kube-proxy's netutils.ParseIPSloppy does (IPv4 with
// leading zeros is accepted) and returns it in the form kube-proxy prints it: IPv4-mapped
// IPv6 as plain IPv4.
func parseIP(s string) (netip.Addr, bool) {
	if a, err := netip.ParseAddr(s); err == nil {
		if a.Zone() != "" {
			return netip.Addr{}, false
		}
		return a.Unmap(), true
	}
	ip := utilnet.ParseIPSloppy(s)
	if ip == nil {
		return netip.Addr{}, false
	}
	a, ok := netip.AddrFromSlice(ip)
	return a.Unmap(), ok
}

func familyOf(a netip.Addr) corev1.IPFamily {
	if a.Is4() {
		return corev1.IPv4Protocol
	}
	return corev1.IPv6Protocol
}

func appendAddrs(dst []netip.AddrPort, eps []endpoint) []netip.AddrPort {
	for _, ep := range eps {
		dst = append(dst, ep.addr)
	}
	return dst
}

// sortAddrs sorts and removes duplicates (one address can only repeat across families if a
// slice's addresses do not match its address type).
func sortAddrs(a []netip.AddrPort) []netip.AddrPort {
	if len(a) == 0 {
		return nil
	}
	slices.SortFunc(a, func(x, y netip.AddrPort) int { return x.Compare(y) })
	return slices.Compact(a)
}
