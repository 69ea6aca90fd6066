package cluster

import (
	"cmp"
	"net/netip"
	"slices"
	"unique"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	utilnet "k8s.io/utils/net"

	"github.com/proxyhealth/proxyhealth/internal/proxyversion"
)

// ServicePorts computes, for one Service and its EndpointSlices (others are ignored), each
// service port as the newest kube-proxy tested (proxyversion.NewestTested)'s iptables and
// nftables proxiers program it on the node nodeName whose topology.kubernetes.io/zone label is
// zone ("" when it has none). It returns nil for Services kube-proxy does not program
// (ShouldSkipService, or no cluster IP).
//
// It converts the objects to the compact forms the view keeps and computes from those, as
// the view does.
func ServicePorts(svc *corev1.Service, endpointSlices []*discoveryv1.EndpointSlice, nodeName, zone string) []*ServicePort {
	return ServicePortsFor(proxyversion.Version{}, svc, endpointSlices, nodeName, zone)
}

// ServicePortsFor is ServicePorts as kube-proxy of version proxy programs the ports (the
// newest tested version's way when proxy is unknown).
func ServicePortsFor(proxy proxyversion.Version, svc *corev1.Service, endpointSlices []*discoveryv1.EndpointSlice, nodeName, zone string) []*ServicePort {
	slices := make([]*sliceInfo, len(endpointSlices))
	for i, s := range endpointSlices {
		slices[i] = newSliceInfo(s, nodeName)
	}
	return servicePorts(newServiceInfo(svc), slices, thisNode{name: nodeName, zone: zone, proxy: proxy})
}

// thisNode is the node the expected endpoints are computed for, and the kube-proxy on it.
// Which endpoints are on it was decided when the slices were converted, for the same name.
type thisNode struct {
	name string
	zone string // "" when the node has no zone label
	// proxy is kube-proxy's version: the few rules that differ between versions follow it
	// (the newest tested version's when unknown).
	proxy proxyversion.Version
}

// preferLocalCopy is kube-proxy v1.34 and v1.35's rule for an endpoint listed twice
// (EndpointSliceCache.addEndpoints: `!exists || isLocal`): a copy on this node replaces an
// earlier one. v1.36 changed it to `!exists || !terminating`: a copy that is not terminating
// replaces an earlier one.
func (n thisNode) preferLocalCopy() bool {
	return n.proxy.Before(proxyversion.Version{Major: 1, Minor: 36})
}

// sameRules reports whether kube-proxy versions a and b program the same endpoints from the
// same objects, as far as the model tells them apart.
func sameRules(a, b proxyversion.Version) bool {
	return thisNode{proxy: a}.preferLocalCopy() == thisNode{proxy: b}.preferLocalCopy()
}

// servicePorts is ServicePorts on the compact forms.
func servicePorts(svc *serviceInfo, endpointSlices []*sliceInfo, node thisNode) []*ServicePort {
	return appendServicePorts(nil, svc, endpointSlices, node)
}

// appendServicePorts appends svc's ports to dst, as servicePorts computes them. Each port is
// its own allocation: snapshots share it for as long as the Service does not change, and it
// is freed with the last of them, not kept alive by ports computed alongside it.
//
// kube-proxy runs one proxier per IP family, each seeing only its family's cluster IP and
// EndpointSlices of its address type; topology hints and the terminating fallback are
// therefore decided per family, and the families' results are listed together here.
func appendServicePorts(dst []*ServicePort, svc *serviceInfo, endpointSlices []*sliceInfo, node thisNode) []*ServicePort {
	clusterIPs, externalIPs := svc.clusterIPs(), svc.externalIPs()
	if svc.skip || len(clusterIPs) == 0 {
		return dst
	}
	families := len(clusterIPs)
	endpointsByFamily := make([]map[portKey]*portSet, families)
	for i, ip := range clusterIPs {
		endpointsByFamily[i] = endpointsByPort(svc, endpointSlices, familyOf(ip), node.preferLocalCopy())
	}
	namespace := svc.key.namespace.Value()
	for _, p := range svc.ports {
		sp := &ServicePort{
			Name: ServicePortName{
				Namespace: namespace,
				Name:      svc.key.name,
				Port:      p.name.Value(),
				Protocol:  string(p.protocol),
			},
			Port:          p.port,
			InternalLocal: svc.internalLocal,
			ExternalLocal: svc.externalLocal,
			ClusterIPs:    clusterIPs, // shared by the Service's ports, never modified
			NodePort:      p.nodePort,
			ExternalIPs:   externalIPs, // shared likewise
		}
		var only []netip.AddrPort
		var cluster, local []endpoint
		for i, ip := range clusterIPs {
			family := familyOf(ip)
			policy := trafficPolicy{
				internalLocal:        svc.internalLocal,
				externalLocal:        svc.externalLocal,
				externallyAccessible: p.nodePort != 0 || hasFamily(externalIPs, family),
			}
			var eps []endpoint
			if set := endpointsByFamily[i][portKey{p.name, p.protocol}]; set != nil {
				eps, only = set.eps, set.only
			}
			cluster, local = categorizeEndpoints(eps, policy, node.name, node.zone)
			if families > 1 {
				sp.ClusterEndpoints = appendAddrs(sp.ClusterEndpoints, cluster)
				sp.LocalEndpoints = appendAddrs(sp.LocalEndpoints, local)
			}
		}
		if families == 1 {
			// With one family and the port's endpoints from one slice, the usual lists are
			// all of the slice's addresses (cluster), or a few next to each other in them
			// (local): publish those, never modified, rather than copies.
			sp.ClusterEndpoints = runOf(only, cluster)
			sp.LocalEndpoints = runOf(only, local)
		} else {
			sp.ClusterEndpoints = sortAddrs(sp.ClusterEndpoints)
			sp.LocalEndpoints = sortAddrs(sp.LocalEndpoints)
		}
		dst = append(dst, sp)
	}
	return dst
}

// shouldSkipService is kube-proxy's proxyutil.ShouldSkipService (pkg/proxy/util/utils.go):
// headless Services (clusterIP None or empty) and ExternalName Services are not proxied. The
// service-proxy-name label is filtered when listing, as kube-proxy does (listwatch.go).
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

// familySet is a set of IP families.
type familySet uint8

func familyBit(f corev1.IPFamily) familySet {
	if f == corev1.IPv6Protocol {
		return 2
	}
	return 1
}

func (s familySet) has(f corev1.IPFamily) bool { return s&familyBit(f) != 0 }

// serviceAddrs returns the Service's cluster IPs, then its external IPs, in one array, and
// how many are cluster IPs. The cluster IPs are proxyutil.GetClusterIPByFamily applied to each
// family, in the Service's own family order (primary first); a family whose cluster IP does not
// parse is left out, as kube-proxy could not program it either. Each family's proxier also
// takes the Service's external IPs and VIP-mode load-balancer ingress IPs of that family
// (newBaseServiceInfo filters both by family; ExternallyAccessible reads them): those follow,
// family by family, without duplicates.
func serviceAddrs(svc *corev1.Service) (addrs []netip.Addr, clusterIPs uint8) {
	var external []netip.Addr
	add := func(family corev1.IPFamily, ip string) {
		addr, ok := parseIP(ip)
		if !ok || familyOf(addr) != family {
			return
		}
		addExternal := func(ip string) {
			if a, ok := parseIP(ip); ok && familyOf(a) == family && !slices.Contains(external, a) {
				external = append(external, a)
			}
		}
		for _, e := range svc.Spec.ExternalIPs {
			addExternal(e)
		}
		for _, ing := range svc.Status.LoadBalancer.Ingress {
			if ing.IP == "" || (ing.IPMode != nil && *ing.IPMode != corev1.LoadBalancerIPModeVIP) {
				continue // proxyutil.IsVIPMode: only VIP-mode ingress IPs get rules
			}
			addExternal(ing.IP)
		}
		addrs = append(addrs, addr)
		clusterIPs++
	}
	if len(svc.Spec.IPFamilies) == 0 {
		// Before dual-stack fields were set (version skew): the single ClusterIP's family.
		if addr, ok := parseIP(svc.Spec.ClusterIP); ok {
			add(familyOf(addr), svc.Spec.ClusterIP)
		}
	} else {
		for i, family := range svc.Spec.IPFamilies {
			if i < len(svc.Spec.ClusterIPs) {
				add(family, svc.Spec.ClusterIPs[i])
			}
		}
	}
	if len(external) == 0 {
		return addrs, clusterIPs // the usual Service: no array but the cluster IPs'
	}
	return slices.Concat(addrs, external), clusterIPs
}

// hasFamily reports whether addrs has an address of family.
func hasFamily(addrs []netip.Addr, family corev1.IPFamily) bool {
	return slices.ContainsFunc(addrs, func(a netip.Addr) bool { return familyOf(a) == family })
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
// IP) keeps the later copy unless that one is terminating; with preferLocal (kube-proxy before
// v1.36), the later copy only if it is on this node. kube-proxy visits slices in map order, so
// which copy is "later" is random there; slices are visited by name here so the result is at
// least stable. The difference lasts until the slices agree again.
func endpointsByPort(svc *serviceInfo, endpointSlices []*sliceInfo, family corev1.IPFamily, preferLocal bool) map[portKey]*portSet {
	ordered := make([]*sliceInfo, 0, len(endpointSlices))
	for _, s := range endpointSlices {
		// endpointSliceCacheKeys: a slice belongs to the Service named by its label.
		if s.family == familyBit(family) && s.key.namespace == svc.key.namespace && s.service == svc.key.name {
			ordered = append(ordered, s)
		}
	}
	slices.SortFunc(ordered, func(a, b *sliceInfo) int { return cmp.Compare(a.key.name, b.key.name) })

	sets := make(map[portKey]*portSet, 1)
	for _, s := range ordered {
		for _, port := range s.ports {
			key := portKey{port.name, port.protocol}
			set := sets[key]
			if set == nil {
				set = &portSet{eps: make([]endpoint, 0, len(port.addrs)), only: port.addrs, preferLocal: preferLocal}
				sets[key] = set
			} else {
				set.addSource()
			}
			for i, addr := range port.addrs {
				set.add(newEndpoint(addr, s.endpoint(i)))
			}
		}
	}
	return sets
}

// portSet is one service port's endpoints in one family, deduplicated by address.
type portSet struct {
	eps []endpoint
	// only is the single slice's (sorted) address list for the port while one slice has
	// contributed, and its copies of an address are then next to each other; index, built
	// once a second slice contributes, finds them anywhere.
	only  []netip.AddrPort
	index map[netip.AddrPort]int
	// preferLocal: of two copies of an address, the later wins only if it is on this node
	// (kube-proxy before v1.36), rather than unless it is terminating.
	preferLocal bool
}

// addSource readies the set for a second (or later) slice.
func (p *portSet) addSource() {
	if p.index != nil {
		return
	}
	p.only = nil
	p.index = make(map[netip.AddrPort]int, 2*len(p.eps))
	for i, ep := range p.eps {
		p.index[ep.addr] = i
	}
}

// add adds ep; of two copies of an address the later one wins, unless it is terminating (or,
// with preferLocal, if it is on this node).
func (p *portSet) add(ep endpoint) {
	j, exists := -1, false
	if p.index != nil {
		j, exists = p.index[ep.addr]
	} else if n := len(p.eps); n > 0 && p.eps[n-1].addr == ep.addr {
		j, exists = n-1, true
	}
	if exists {
		if p.preferLocal && ep.local || !p.preferLocal && !ep.terminating {
			p.eps[j] = ep
		}
		return
	}
	if p.index != nil {
		p.index[ep.addr] = len(p.eps)
	}
	p.eps = append(p.eps, ep)
}

// runOf returns the addresses of eps (which have no duplicates), sorted: when they are a run
// of addrs (a sorted slice's, or nil), that run, capped so that appending to it copies; else
// a new slice.
func runOf(addrs []netip.AddrPort, eps []endpoint) []netip.AddrPort {
	if len(eps) == 0 {
		return nil
	}
	if i, found := slices.BinarySearchFunc(addrs, eps[0].addr, netip.AddrPort.Compare); found && i+len(eps) <= len(addrs) {
		run := addrs[i : i+len(eps) : i+len(eps)]
		if slices.EqualFunc(run, eps, func(a netip.AddrPort, ep endpoint) bool { return a == ep.addr }) {
			return run
		}
	}
	return sortAddrs(appendAddrs(nil, eps))
}

// newEndpoint is the body of addEndpoints' loop for one endpoint and port.
func newEndpoint(addr netip.AddrPort, a *endpointAttrs) endpoint {
	return endpoint{
		addr:        addr,
		local:       a.local,
		ready:       a.ready,
		serving:     a.serving,
		terminating: a.terminating,
		zoneHints:   a.zones,
		nodeHints:   a.nodes,
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
