package cluster

import (
	"cmp"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	utilnet "k8s.io/utils/net"
)

// ServicePorts computes, for one Service and its EndpointSlices (others are ignored), each
// service port as kube-proxy v1.36's iptables and nftables proxiers program it on the node
// nodeName whose topology.kubernetes.io/zone label is zone ("" when it has none). It returns
// nil for Services kube-proxy does not program (ShouldSkipService, or no cluster IP).
//
// kube-proxy runs one proxier per IP family, each seeing only its family's cluster IP and
// EndpointSlices of its address type; topology hints and the terminating fallback are
// therefore decided per family, and the families' results are listed together here.
func ServicePorts(svc *corev1.Service, endpointSlices []*discoveryv1.EndpointSlice, nodeName, zone string) []ServicePort {
	if shouldSkipService(svc) {
		return nil
	}
	families := clusterIPsByFamily(svc)
	if len(families) == 0 {
		return nil
	}
	endpointsByFamily := make(map[corev1.IPFamily]map[portKey][]endpoint, len(families))
	for _, f := range families {
		endpointsByFamily[f.family] = endpointsByPort(svc, endpointSlices, f.family, nodeName)
	}
	internalLocal := svc.Spec.InternalTrafficPolicy != nil && *svc.Spec.InternalTrafficPolicy == corev1.ServiceInternalTrafficPolicyLocal
	externalLocal := externallyAccessibleType(svc) && svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal

	ports := make([]ServicePort, 0, len(svc.Spec.Ports))
	for _, p := range svc.Spec.Ports {
		protocol := cmp.Or(p.Protocol, corev1.ProtocolTCP)
		sp := ServicePort{
			Name: ServicePortName{
				Namespace: svc.Namespace,
				Name:      svc.Name,
				Port:      p.Name,
				Protocol:  string(protocol),
			},
			Port:          uint16(p.Port),
			InternalLocal: internalLocal,
			ExternalLocal: externalLocal,
		}
		for _, f := range families {
			sp.ClusterIPs = append(sp.ClusterIPs, f.clusterIP)
			policy := trafficPolicy{
				internalLocal:        internalLocal,
				externalLocal:        externalLocal,
				externallyAccessible: p.NodePort != 0 || f.externalIPs || f.loadBalancerVIPs,
			}
			cluster, local := categorizeEndpoints(endpointsByFamily[f.family][portKey{p.Name, protocol}], policy, nodeName, zone)
			sp.ClusterEndpoints = appendAddrs(sp.ClusterEndpoints, cluster)
			sp.LocalEndpoints = appendAddrs(sp.LocalEndpoints, local)
		}
		sp.ClusterEndpoints = sortAddrs(sp.ClusterEndpoints)
		sp.LocalEndpoints = sortAddrs(sp.LocalEndpoints)
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
		fi := familyInfo{family: family, clusterIP: addr}
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
	name     string
	protocol corev1.Protocol
}

// endpointsByPort is EndpointSliceCache.endpointInfoByServicePort and addEndpoints
// (pkg/proxy/endpointslicecache.go) for one family: the endpoints of every slice of that
// address type (EndpointsChangeTracker.EndpointSliceUpdate ignores the others, FQDN
// included), grouped by port name and protocol and deduplicated by IP and port.
//
// A slice port without a name (nil, not "") or without a port number is ignored. An
// endpoint's conditions default as the API documents them: nil ready or serving means true,
// nil terminating false. Only an endpoint's first address counts.
//
// An endpoint listed twice (it moves between slices, or a new pod reuses a terminating pod's
// IP) keeps the later copy unless that one is terminating. kube-proxy visits slices in map
// order, so which copy is "later" is random there; slices are visited by name here so the
// result is at least stable. The difference lasts until the slices agree again.
func endpointsByPort(svc *corev1.Service, endpointSlices []*discoveryv1.EndpointSlice, family corev1.IPFamily, nodeName string) map[portKey][]endpoint {
	addressType := discoveryv1.AddressTypeIPv4
	if family == corev1.IPv6Protocol {
		addressType = discoveryv1.AddressTypeIPv6
	}
	ordered := make([]*discoveryv1.EndpointSlice, 0, len(endpointSlices))
	for _, s := range endpointSlices {
		// endpointSliceCacheKeys: a slice belongs to the Service named by its label.
		if s.AddressType == addressType && s.Namespace == svc.Namespace && s.Labels[discoveryv1.LabelServiceName] == svc.Name {
			ordered = append(ordered, s)
		}
	}
	slices.SortFunc(ordered, func(a, b *discoveryv1.EndpointSlice) int { return cmp.Compare(a.Name, b.Name) })

	type portSet struct {
		eps   []endpoint
		index map[netip.AddrPort]int
	}
	sets := map[portKey]*portSet{}
	for _, s := range ordered {
		for _, port := range s.Ports {
			if port.Name == nil || port.Port == nil || *port.Port <= 0 || *port.Port > 65535 {
				continue
			}
			protocol := corev1.ProtocolTCP // the API's default; kube-proxy assumes it is set
			if port.Protocol != nil {
				protocol = *port.Protocol
			}
			key := portKey{*port.Name, protocol}
			set := sets[key]
			if set == nil {
				set = &portSet{index: map[netip.AddrPort]int{}}
				sets[key] = set
			}
			for i := range s.Endpoints {
				ep, ok := newEndpoint(&s.Endpoints[i], uint16(*port.Port), nodeName)
				if !ok {
					continue
				}
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
	out := make(map[portKey][]endpoint, len(sets))
	for k, set := range sets {
		out[k] = set.eps
	}
	return out
}

// newEndpoint is the body of addEndpoints' loop for one endpoint and port.
func newEndpoint(e *discoveryv1.Endpoint, port uint16, nodeName string) (endpoint, bool) {
	if len(e.Addresses) == 0 {
		return endpoint{}, false
	}
	addr, ok := parseIP(e.Addresses[0])
	if !ok {
		return endpoint{}, false
	}
	ep := endpoint{
		addr:        netip.AddrPortFrom(addr, port),
		local:       nodeName != "" && e.NodeName != nil && *e.NodeName == nodeName,
		ready:       e.Conditions.Ready == nil || *e.Conditions.Ready,
		serving:     e.Conditions.Serving == nil || *e.Conditions.Serving,
		terminating: e.Conditions.Terminating != nil && *e.Conditions.Terminating,
	}
	if e.Hints != nil {
		for _, z := range e.Hints.ForZones {
			ep.zoneHints = append(ep.zoneHints, z.Name)
		}
		for _, n := range e.Hints.ForNodes {
			ep.nodeHints = append(ep.nodeHints, n.Name)
		}
	}
	return ep, true
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
