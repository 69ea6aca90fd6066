package cluster

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"unique"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// The conversions from API objects to the compact forms. Each also accepts its own compact
// form and returns it unchanged: the reflector hands the store objects already converted by
// its Transformer (a streamed list) or by the paginated list, and raw API objects from
// watch events.

func toServiceInfo(obj any) (*serviceInfo, error) {
	switch o := obj.(type) {
	case *serviceInfo:
		return o, nil
	case *corev1.Service:
		return newServiceInfo(o), nil
	}
	return nil, fmt.Errorf("expected a Service, got %T", obj)
}

func toSliceInfo(obj any, nodeName string) (*sliceInfo, error) {
	switch o := obj.(type) {
	case *sliceInfo:
		return o, nil
	case *discoveryv1.EndpointSlice:
		return newSliceInfo(o, nodeName), nil
	}
	return nil, fmt.Errorf("expected an EndpointSlice, got %T", obj)
}

func toNodeInfo(obj any) (*nodeInfo, error) {
	switch o := obj.(type) {
	case *nodeInfo:
		return o, nil
	case *corev1.Node:
		return &nodeInfo{name: o.Name, zone: o.Labels[corev1.LabelTopologyZone]}, nil
	}
	return nil, fmt.Errorf("expected a Node, got %T", obj)
}

func newServiceInfo(svc *corev1.Service) *serviceInfo {
	_, otherProxy := svc.Labels[labelServiceProxyName]
	s := &serviceInfo{
		key:        keyOf(svc.Namespace, svc.Name),
		skip:       shouldSkipService(svc),
		otherProxy: otherProxy,
	}
	if s.skip || otherProxy {
		return s // nothing else is read: keep the tombstone small
	}
	s.addrs, s.clusterIPCount = serviceAddrs(svc)
	s.internalLocal = svc.Spec.InternalTrafficPolicy != nil && *svc.Spec.InternalTrafficPolicy == corev1.ServiceInternalTrafficPolicyLocal
	s.externalLocal = externallyAccessibleType(svc) && svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal
	s.ports = make([]servicePortInfo, len(svc.Spec.Ports))
	for i, p := range svc.Spec.Ports {
		s.ports[i] = servicePortInfo{
			name:     unique.Make(p.Name),
			protocol: internProtocol(cmp.Or(p.Protocol, corev1.ProtocolTCP)),
			port:     uint16(p.Port),
			nodePort: uint16(p.NodePort),
		}
	}
	return s
}

// newSliceInfo keeps what EndpointSliceCache.addEndpoints (pkg/proxy/endpointslicecache.go)
// reads of a slice: usable ports, and per endpoint its first address, whether it is on the
// node nodeName, its conditions and its hints.
func newSliceInfo(sl *discoveryv1.EndpointSlice, nodeName string) *sliceInfo {
	_, headless := sl.Labels[corev1.IsHeadlessService]
	s := &sliceInfo{
		key:      keyOf(sl.Namespace, sl.Name),
		service:  sl.Labels[discoveryv1.LabelServiceName],
		headless: headless,
		family:   addressFamily(sl.AddressType),
	}
	type parsed struct {
		addr netip.Addr
		e    *discoveryv1.Endpoint
	}
	eps := make([]parsed, 0, len(sl.Endpoints))
	for i := range sl.Endpoints {
		e := &sl.Endpoints[i]
		if len(e.Addresses) == 0 {
			continue
		}
		if addr, ok := parseIP(e.Addresses[0]); ok {
			eps = append(eps, parsed{addr, e})
		}
	}
	// Stable: of two copies of an address, the later one wins (endpointsByPort).
	slices.SortStableFunc(eps, func(a, b parsed) int { return a.addr.Compare(b.addr) })

	attrs := make([]*endpointAttrs, len(eps))
	plain := true
	var shared map[attrsKey]*endpointAttrs // the slice's own sets, made when one is needed
	for i, p := range eps {
		local := nodeName != "" && p.e.NodeName != nil && *p.e.NodeName == nodeName
		attrs[i] = sharedAttrs(&shared, p.e, local)
		plain = plain && (attrs[i] == readyAttrs || attrs[i] == readyLocalAttrs)
	}
	if plain {
		for i, a := range attrs {
			if a == readyLocalAttrs {
				s.local.add(i)
			}
		}
	} else {
		s.attrs = attrs
	}
	for _, p := range sl.Ports {
		if p.Name == nil || p.Port == nil || *p.Port <= 0 || *p.Port > 65535 {
			continue
		}
		protocol := corev1.ProtocolTCP // the API's default; kube-proxy assumes it is set
		if p.Protocol != nil {
			protocol = internProtocol(*p.Protocol)
		}
		port := slicePortInfo{name: unique.Make(*p.Name), protocol: protocol, addrs: make([]netip.AddrPort, len(eps))}
		for i, e := range eps {
			port.addrs[i] = netip.AddrPortFrom(e.addr, uint16(*p.Port))
		}
		s.ports = append(s.ports, port)
	}
	return s
}

// attrsKey identifies an endpointAttrs within a slice.
type attrsKey struct {
	local, ready, serving, terminating bool
	hints                              string
}

// sharedAttrs returns the attributes of e, shared with the slice's other endpoints that have
// the same (*seen holds the slice's sets so far; it is made on first use).
func sharedAttrs(seen *map[attrsKey]*endpointAttrs, e *discoveryv1.Endpoint, local bool) *endpointAttrs {
	k := attrsKey{
		local:       local,
		ready:       e.Conditions.Ready == nil || *e.Conditions.Ready,
		serving:     e.Conditions.Serving == nil || *e.Conditions.Serving,
		terminating: e.Conditions.Terminating != nil && *e.Conditions.Terminating,
	}
	var (
		zones []discoveryv1.ForZone
		nodes []discoveryv1.ForNode
	)
	if e.Hints != nil {
		zones, nodes = e.Hints.ForZones, e.Hints.ForNodes
	}
	if len(zones) == 0 && len(nodes) == 0 && k.ready && k.serving && !k.terminating {
		if local {
			return readyLocalAttrs
		}
		return readyAttrs
	}
	var hk strings.Builder
	for _, z := range zones {
		hk.WriteString(z.Name)
		hk.WriteByte(0)
	}
	hk.WriteByte(1)
	for _, n := range nodes {
		hk.WriteString(n.Name)
		hk.WriteByte(0)
	}
	k.hints = hk.String()
	if a, ok := (*seen)[k]; ok {
		return a
	}
	if *seen == nil {
		*seen = map[attrsKey]*endpointAttrs{}
	}
	a := &endpointAttrs{local: k.local, ready: k.ready, serving: k.serving, terminating: k.terminating}
	for _, z := range zones {
		a.zones = append(a.zones, unique.Make(z.Name).Value())
	}
	for _, n := range nodes {
		a.nodes = append(a.nodes, unique.Make(n.Name).Value())
	}
	(*seen)[k] = a
	return a
}

// internProtocol returns the package constants for the values the API allows, so that no
// object keeps a decoded copy of "TCP" of its own.
func internProtocol(p corev1.Protocol) corev1.Protocol {
	switch p {
	case corev1.ProtocolTCP:
		return corev1.ProtocolTCP
	case corev1.ProtocolUDP:
		return corev1.ProtocolUDP
	case corev1.ProtocolSCTP:
		return corev1.ProtocolSCTP
	}
	return p
}

// addressFamily is the IP family of an EndpointSlice's address type, as a familySet.
func addressFamily(t discoveryv1.AddressType) familySet {
	switch t {
	case discoveryv1.AddressTypeIPv4:
		return familyBit(corev1.IPv4Protocol)
	case discoveryv1.AddressTypeIPv6:
		return familyBit(corev1.IPv6Protocol)
	}
	return 0
}
