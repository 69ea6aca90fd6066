package cluster

import (
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/proxyhealth/proxyhealth/internal/proxyversion"
)

// Builders for the API objects, in the shape the API server stores them (defaults filled).

func service(name string, mod ...func(*corev1.Service)) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
		Spec: corev1.ServiceSpec{
			Type:       corev1.ServiceTypeClusterIP,
			ClusterIP:  "10.96.0.10",
			ClusterIPs: []string{"10.96.0.10"},
			IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol},
			Ports:      []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}},
		},
	}
	for _, m := range mod {
		m(s)
	}
	return s
}

func dualStack(s *corev1.Service) {
	s.Spec.ClusterIPs = []string{"10.96.0.10", "fd00::10"}
	s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
}

func itpLocal(s *corev1.Service) {
	s.Spec.InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyLocal)
}

func slicePort(name string, port int32, proto corev1.Protocol) discoveryv1.EndpointPort {
	return discoveryv1.EndpointPort{Name: ptr.To(name), Port: ptr.To(port), Protocol: ptr.To(proto)}
}

func epSlice(name, svcName string, at discoveryv1.AddressType, ports []discoveryv1.EndpointPort, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: svcName}},
		AddressType: at,
		Ports:       ports,
		Endpoints:   eps,
	}
}

func apiEP(addr, node string, mod ...func(*discoveryv1.Endpoint)) discoveryv1.Endpoint {
	e := discoveryv1.Endpoint{
		Addresses: []string{addr},
		Conditions: discoveryv1.EndpointConditions{
			Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false),
		},
	}
	if node != "" {
		e.NodeName = ptr.To(node)
	}
	for _, m := range mod {
		m(&e)
	}
	return e
}

func terminating(e *discoveryv1.Endpoint) {
	e.Conditions = discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(true), Terminating: ptr.To(true)}
}

func notReady(e *discoveryv1.Endpoint) {
	e.Conditions = discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(false), Terminating: ptr.To(false)}
}

func zoneHint(z ...string) func(*discoveryv1.Endpoint) {
	return func(e *discoveryv1.Endpoint) {
		if e.Hints == nil {
			e.Hints = &discoveryv1.EndpointHints{}
		}
		for _, n := range z {
			e.Hints.ForZones = append(e.Hints.ForZones, discoveryv1.ForZone{Name: n})
		}
	}
}

func nodeHint(n ...string) func(*discoveryv1.Endpoint) {
	return func(e *discoveryv1.Endpoint) {
		if e.Hints == nil {
			e.Hints = &discoveryv1.EndpointHints{}
		}
		for _, name := range n {
			e.Hints.ForNodes = append(e.Hints.ForNodes, discoveryv1.ForNode{Name: name})
		}
	}
}

var (
	ipv4     = discoveryv1.AddressTypeIPv4
	ipv6     = discoveryv1.AddressTypeIPv6
	httpPort = []discoveryv1.EndpointPort{slicePort("http", 8080, corev1.ProtocolTCP)}
)

// want is one expected service port: name "port/PROTO", endpoint lists.
type want struct {
	port, proto string
	cluster     []netip.AddrPort
	local       []netip.AddrPort
}

func TestServicePorts(t *testing.T) {
	cases := []struct {
		name   string
		svc    *corev1.Service
		slices []*discoveryv1.EndpointSlice
		node   string
		zone   string
		proxy  proxyversion.Version // kube-proxy's; unknown: the newest tested
		want   []want               // nil: the Service is not programmed
		check  func(t *testing.T, got []*ServicePort)
	}{{
		name: "headless Service is skipped",
		svc: service("s", func(s *corev1.Service) {
			s.Spec.ClusterIP, s.Spec.ClusterIPs = corev1.ClusterIPNone, []string{corev1.ClusterIPNone}
		}),
		slices: []*discoveryv1.EndpointSlice{epSlice("s-1", "s", ipv4, httpPort, apiEP("10.0.0.1", ""))},
	}, {
		name: "ExternalName Service is skipped even with a cluster IP",
		svc:  service("s", func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeExternalName }),
	}, {
		name: "Service without cluster IP is skipped",
		svc:  service("s", func(s *corev1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "", nil }),
	}, {
		name: "single endpoint, port from the slice",
		svc:  service("s"),
		slices: []*discoveryv1.EndpointSlice{
			epSlice("s-1", "s", ipv4, httpPort, apiEP("10.0.0.1", "node-a"), apiEP("10.0.0.2", "node-b")),
		},
		node: "node-a",
		want: []want{{port: "http", proto: "TCP", cluster: addrs("10.0.0.1:8080", "10.0.0.2:8080")}},
	}, {
		name: "ports matched by name and protocol (kube-dns)",
		svc: service("dns", func(s *corev1.Service) {
			s.Spec.Ports = []corev1.ServicePort{
				{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53},
				{Name: "dns-tcp", Protocol: corev1.ProtocolTCP, Port: 53},
				{Name: "metrics", Protocol: corev1.ProtocolTCP, Port: 9153},
			}
		}),
		slices: []*discoveryv1.EndpointSlice{epSlice("dns-1", "dns", ipv4,
			[]discoveryv1.EndpointPort{
				slicePort("dns-tcp", 53, corev1.ProtocolTCP),
				slicePort("dns", 53, corev1.ProtocolUDP),
				slicePort("metrics", 9153, corev1.ProtocolTCP),
				slicePort("dns", 5353, corev1.ProtocolTCP), // same name, other protocol: not "dns"/UDP
			},
			apiEP("10.0.0.1", ""), apiEP("10.0.0.2", ""))},
		want: []want{
			{port: "dns", proto: "UDP", cluster: addrs("10.0.0.1:53", "10.0.0.2:53")},
			{port: "dns-tcp", proto: "TCP", cluster: addrs("10.0.0.1:53", "10.0.0.2:53")},
			{port: "metrics", proto: "TCP", cluster: addrs("10.0.0.1:9153", "10.0.0.2:9153")},
		},
	}, {
		name: "unnamed port matches the slice port named \"\"",
		svc:  service("s", func(s *corev1.Service) { s.Spec.Ports[0].Name = "" }),
		slices: []*discoveryv1.EndpointSlice{epSlice("s-1", "s", ipv4,
			[]discoveryv1.EndpointPort{slicePort("", 8080, corev1.ProtocolTCP)}, apiEP("10.0.0.1", ""))},
		want: []want{{port: "", proto: "TCP", cluster: addrs("10.0.0.1:8080")}},
	}, {
		name: "slice port with nil name or nil port is ignored (kube-proxy: nil port should not break anything)",
		svc:  service("s", func(s *corev1.Service) { s.Spec.Ports[0].Name = "" }),
		slices: []*discoveryv1.EndpointSlice{
			epSlice("s-1", "s", ipv4, []discoveryv1.EndpointPort{{Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)}}, apiEP("10.0.0.1", "")),
			epSlice("s-2", "s", ipv4, []discoveryv1.EndpointPort{{Name: ptr.To(""), Protocol: ptr.To(corev1.ProtocolTCP)}}, apiEP("10.0.0.2", "")),
		},
		want: []want{{port: "", proto: "TCP"}},
	}, {
		name: "no slices: port listed with no endpoints",
		svc:  service("s"),
		want: []want{{port: "http", proto: "TCP"}},
	}, {
		name: "two slices, same port: union",
		svc:  service("s"),
		slices: []*discoveryv1.EndpointSlice{
			epSlice("s-1", "s", ipv4, httpPort, apiEP("10.0.1.1", ""), apiEP("10.0.1.2", ""), apiEP("10.0.1.3", "")),
			epSlice("s-2", "s", ipv4, httpPort, apiEP("10.0.2.1", ""), apiEP("10.0.2.2", ""), apiEP("10.0.2.3", "")),
		},
		want: []want{{port: "http", proto: "TCP", cluster: addrs(
			"10.0.1.1:8080", "10.0.1.2:8080", "10.0.1.3:8080", "10.0.2.1:8080", "10.0.2.2:8080", "10.0.2.3:8080")}},
	}, {
		name: "two overlapping slices: union without duplicates",
		svc:  service("s"),
		slices: []*discoveryv1.EndpointSlice{
			epSlice("s-1", "s", ipv4, httpPort, apiEP("10.0.1.1", ""), apiEP("10.0.1.2", ""), apiEP("10.0.1.3", "")),
			epSlice("s-2", "s", ipv4, httpPort, apiEP("10.0.1.1", ""), apiEP("10.0.1.2", ""), apiEP("10.0.1.3", ""), apiEP("10.0.1.4", "")),
		},
		want: []want{{port: "http", proto: "TCP", cluster: addrs("10.0.1.1:8080", "10.0.1.2:8080", "10.0.1.3:8080", "10.0.1.4:8080")}},
	}, {
		name: "slices of other Services are not mixed in",
		svc:  service("s"),
		slices: []*discoveryv1.EndpointSlice{
			epSlice("s-1", "s", ipv4, httpPort, apiEP("10.0.1.1", "")),
			epSlice("t-1", "t", ipv4, httpPort, apiEP("10.0.2.1", "")),
		},
		want: []want{{port: "http", proto: "TCP", cluster: addrs("10.0.1.1:8080")}},
	}, {
		name: "same IP with two ports across slices (targetPort change): both",
		svc:  service("s"),
		slices: []*discoveryv1.EndpointSlice{
			epSlice("s-1", "s", ipv4, httpPort, apiEP("10.0.1.1", ""), apiEP("10.0.1.2", "")),
			epSlice("s-2", "s", ipv4, []discoveryv1.EndpointPort{slicePort("http", 9090, corev1.ProtocolTCP)}, apiEP("10.0.1.1", ""), apiEP("10.0.1.2", "")),
		},
		want: []want{{port: "http", proto: "TCP", cluster: addrs("10.0.1.1:8080", "10.0.1.1:9090", "10.0.1.2:8080", "10.0.1.2:9090")}},
	}, {
		name: "duplicate endpoint: the non-terminating copy wins",
		svc:  service("s"),
		slices: []*discoveryv1.EndpointSlice{
			epSlice("s-1", "s", ipv4, httpPort,
				apiEP("10.0.1.1", "", terminating),
				apiEP("10.0.1.1", ""),
				apiEP("10.0.1.1", "", func(e *discoveryv1.Endpoint) { notReady(e); e.Conditions.Terminating = ptr.To(true) }),
				apiEP("10.0.1.2", "", terminating)),
		},
		// 10.0.1.1 is ready, so the terminating 10.0.1.2 is not used.
		want: []want{{port: "http", proto: "TCP", cluster: addrs("10.0.1.1:8080")}},
	}, {
		name: "duplicate endpoint across slices: a terminating copy does not replace a ready one",
		svc:  service("s"),
		slices: []*discoveryv1.EndpointSlice{
			epSlice("s-2", "s", ipv4, httpPort, apiEP("10.0.1.1", "", terminating), apiEP("10.0.1.2", "", terminating)),
			epSlice("s-1", "s", ipv4, httpPort, apiEP("10.0.1.1", "")),
		},
		want: []want{{port: "http", proto: "TCP", cluster: addrs("10.0.1.1:8080")}},
	}, {
		// kube-proxy before v1.36 keeps a later copy only if it is on this node: here the
		// terminating one, which the local chain then falls back to. From v1.36 the ready copy
		// stays, which is on another node: no local endpoint.
		name:  "duplicate endpoint across slices, v1.34: the copy on this node wins, terminating or not",
		svc:   service("s", itpLocal),
		node:  "node-a",
		proxy: proxyversion.Version{Major: 1, Minor: 34},
		slices: []*discoveryv1.EndpointSlice{
			epSlice("s-1", "s", ipv4, httpPort, apiEP("10.0.1.1", "node-b"), apiEP("10.0.1.2", "node-b")),
			epSlice("s-2", "s", ipv4, httpPort, apiEP("10.0.1.1", "node-a", terminating)),
		},
		want: []want{{port: "http", proto: "TCP", local: addrs("10.0.1.1:8080")}},
	}, {
		name:  "duplicate endpoint across slices, v1.35: the copy on this node wins, terminating or not",
		svc:   service("s", itpLocal),
		node:  "node-a",
		proxy: proxyversion.Version{Major: 1, Minor: 35},
		slices: []*discoveryv1.EndpointSlice{
			epSlice("s-1", "s", ipv4, httpPort, apiEP("10.0.1.1", "node-b"), apiEP("10.0.1.2", "node-b")),
			epSlice("s-2", "s", ipv4, httpPort, apiEP("10.0.1.1", "node-a", terminating)),
		},
		want: []want{{port: "http", proto: "TCP", local: addrs("10.0.1.1:8080")}},
	}, {
		name:  "duplicate endpoint across slices, v1.36: the ready copy stays, on another node",
		svc:   service("s", itpLocal),
		node:  "node-a",
		proxy: proxyversion.Version{Major: 1, Minor: 36},
		slices: []*discoveryv1.EndpointSlice{
			epSlice("s-1", "s", ipv4, httpPort, apiEP("10.0.1.1", "node-b"), apiEP("10.0.1.2", "node-b")),
			epSlice("s-2", "s", ipv4, httpPort, apiEP("10.0.1.1", "node-a", terminating)),
		},
		want: []want{{port: "http", proto: "TCP"}},
	}, {
		name: "duplicate endpoint across slices, version unknown: as the newest tested",
		svc:  service("s", itpLocal),
		node: "node-a",
		slices: []*discoveryv1.EndpointSlice{
			epSlice("s-1", "s", ipv4, httpPort, apiEP("10.0.1.1", "node-b"), apiEP("10.0.1.2", "node-b")),
			epSlice("s-2", "s", ipv4, httpPort, apiEP("10.0.1.1", "node-a", terminating)),
		},
		want: []want{{port: "http", proto: "TCP"}},
	}, {
		// Neither copy on this node: before v1.36 the first stays, terminating; from v1.36 the
		// ready one replaces it.
		name:  "duplicate endpoint across slices, v1.34: a later remote copy does not replace an earlier one",
		svc:   service("s"),
		proxy: proxyversion.Version{Major: 1, Minor: 34},
		slices: []*discoveryv1.EndpointSlice{
			epSlice("s-1", "s", ipv4, httpPort, apiEP("10.0.1.1", "node-b", terminating), apiEP("10.0.1.2", "node-b")),
			epSlice("s-2", "s", ipv4, httpPort, apiEP("10.0.1.1", "node-b")),
		},
		want: []want{{port: "http", proto: "TCP", cluster: addrs("10.0.1.2:8080")}},
	}, {
		name:  "duplicate endpoint across slices, v1.37: a later ready copy replaces a terminating one",
		svc:   service("s"),
		proxy: proxyversion.Version{Major: 1, Minor: 37},
		slices: []*discoveryv1.EndpointSlice{
			epSlice("s-1", "s", ipv4, httpPort, apiEP("10.0.1.1", "node-b", terminating), apiEP("10.0.1.2", "node-b")),
			epSlice("s-2", "s", ipv4, httpPort, apiEP("10.0.1.1", "node-b")),
		},
		want: []want{{port: "http", proto: "TCP", cluster: addrs("10.0.1.1:8080", "10.0.1.2:8080")}},
	}, {
		name: "conditions unset mean ready and serving (API semantics)",
		svc:  service("s"),
		slices: []*discoveryv1.EndpointSlice{epSlice("s-1", "s", ipv4, httpPort,
			apiEP("10.0.1.1", "", func(e *discoveryv1.Endpoint) { e.Conditions = discoveryv1.EndpointConditions{} }),
			apiEP("10.0.1.2", "", notReady))},
		want: []want{{port: "http", proto: "TCP", cluster: addrs("10.0.1.1:8080")}},
	}, {
		name: "no ready endpoint: serving-terminating ones are used",
		svc:  service("s"),
		slices: []*discoveryv1.EndpointSlice{epSlice("s-1", "s", ipv4, httpPort,
			apiEP("10.0.1.1", "", terminating),
			apiEP("10.0.1.2", "", notReady),
			apiEP("10.0.1.3", "", func(e *discoveryv1.Endpoint) { notReady(e); e.Conditions.Terminating = ptr.To(true) }))},
		want: []want{{port: "http", proto: "TCP", cluster: addrs("10.0.1.1:8080")}},
	}, {
		name: "endpoint without address or with a bad one is ignored; only the first address counts; leading zeros accepted",
		svc:  service("s"),
		slices: []*discoveryv1.EndpointSlice{epSlice("s-1", "s", ipv4, httpPort,
			discoveryv1.Endpoint{},
			apiEP("not-an-ip", ""),
			apiEP("010.000.001.001", ""),
			discoveryv1.Endpoint{Addresses: []string{"10.0.1.2", "10.0.1.3"}})},
		want: []want{{port: "http", proto: "TCP", cluster: addrs("10.0.1.1:8080", "10.0.1.2:8080")}},
	}, {
		name: "internalTrafficPolicy Local: only this node's endpoints, no cluster chain",
		svc:  service("s", itpLocal),
		node: "node-a",
		slices: []*discoveryv1.EndpointSlice{epSlice("s-1", "s", ipv4, httpPort,
			apiEP("10.0.1.1", "node-a"), apiEP("10.0.1.2", "node-b"), apiEP("10.0.1.3", ""), apiEP("10.0.1.4", "node-a", terminating))},
		want:  []want{{port: "http", proto: "TCP", local: addrs("10.0.1.1:8080")}},
		check: func(t *testing.T, got []*ServicePort) { mustBool(t, "InternalLocal", got[0].InternalLocal, true) },
	}, {
		name: "internalTrafficPolicy Local: local terminating fallback though remote endpoints are ready",
		svc:  service("s", itpLocal),
		node: "node-a",
		slices: []*discoveryv1.EndpointSlice{epSlice("s-1", "s", ipv4, httpPort,
			apiEP("10.0.1.1", "node-b"), apiEP("10.0.1.4", "node-a", terminating))},
		want: []want{{port: "http", proto: "TCP", local: addrs("10.0.1.4:8080")}},
	}, {
		name: "internalTrafficPolicy Local with no node name: nothing is local",
		svc:  service("s", itpLocal),
		slices: []*discoveryv1.EndpointSlice{epSlice("s-1", "s", ipv4, httpPort,
			apiEP("10.0.1.1", ""), apiEP("10.0.1.2", "node-b"))},
		want: []want{{port: "http", proto: "TCP"}},
	}, {
		name: "internalTrafficPolicy Local on a NodePort Service: cluster chain too",
		svc: service("s", itpLocal, func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeNodePort
			s.Spec.Ports[0].NodePort = 30080
		}),
		node: "node-a",
		slices: []*discoveryv1.EndpointSlice{epSlice("s-1", "s", ipv4, httpPort,
			apiEP("10.0.1.1", "node-a"), apiEP("10.0.1.2", "node-b"))},
		want: []want{{port: "http", proto: "TCP", cluster: addrs("10.0.1.1:8080", "10.0.1.2:8080"), local: addrs("10.0.1.1:8080")}},
	}, {
		name: "externalTrafficPolicy Local on a LoadBalancer Service: local chain",
		svc: service("s", func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeLoadBalancer
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			s.Spec.Ports[0].NodePort = 30080
		}),
		node: "node-a",
		slices: []*discoveryv1.EndpointSlice{epSlice("s-1", "s", ipv4, httpPort,
			apiEP("10.0.1.1", "node-a"), apiEP("10.0.1.2", "node-b"))},
		want: []want{{port: "http", proto: "TCP", cluster: addrs("10.0.1.1:8080", "10.0.1.2:8080"), local: addrs("10.0.1.1:8080")}},
		check: func(t *testing.T, got []*ServicePort) {
			mustBool(t, "ExternalLocal", got[0].ExternalLocal, true)
			mustBool(t, "InternalLocal", got[0].InternalLocal, false)
		},
	}, {
		name: "externalTrafficPolicy Local without node ports (allocateLoadBalancerNodePorts false) but with a VIP",
		svc: service("s", func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeLoadBalancer
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "192.0.2.1"}}
		}),
		node: "node-a",
		slices: []*discoveryv1.EndpointSlice{epSlice("s-1", "s", ipv4, httpPort,
			apiEP("10.0.1.1", "node-a"), apiEP("10.0.1.2", "node-b"))},
		want: []want{{port: "http", proto: "TCP", cluster: addrs("10.0.1.1:8080", "10.0.1.2:8080"), local: addrs("10.0.1.1:8080")}},
	}, {
		name: "externalTrafficPolicy Local, no node port, proxy-mode ingress only: not externally accessible",
		svc: service("s", func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeLoadBalancer
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "192.0.2.1", IPMode: ptr.To(corev1.LoadBalancerIPModeProxy)}}
		}),
		node: "node-a",
		slices: []*discoveryv1.EndpointSlice{epSlice("s-1", "s", ipv4, httpPort,
			apiEP("10.0.1.1", "node-a"), apiEP("10.0.1.2", "node-b"))},
		want: []want{{port: "http", proto: "TCP", cluster: addrs("10.0.1.1:8080", "10.0.1.2:8080")}},
	}, {
		name: "externalTrafficPolicy Local on a plain ClusterIP Service is ignored",
		svc:  service("s", func(s *corev1.Service) { s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal }),
		node: "node-a",
		slices: []*discoveryv1.EndpointSlice{epSlice("s-1", "s", ipv4, httpPort,
			apiEP("10.0.1.1", "node-a"), apiEP("10.0.1.2", "node-b"))},
		want: []want{{port: "http", proto: "TCP", cluster: addrs("10.0.1.1:8080", "10.0.1.2:8080")}},
	}, {
		name: "zone hints for this zone",
		svc:  service("s"),
		zone: "zone-a",
		slices: []*discoveryv1.EndpointSlice{epSlice("s-1", "s", ipv4, httpPort,
			apiEP("10.0.1.1", "", zoneHint("zone-a")), apiEP("10.0.1.2", "", zoneHint("zone-b")),
			apiEP("10.0.1.3", "", notReady))}, // unready endpoints need no hints
		want: []want{{port: "http", proto: "TCP", cluster: addrs("10.0.1.1:8080")}},
	}, {
		name: "zone hints ignored when one ready endpoint has none, even in another slice",
		svc:  service("s"),
		zone: "zone-a",
		slices: []*discoveryv1.EndpointSlice{
			epSlice("s-1", "s", ipv4, httpPort, apiEP("10.0.1.1", "", zoneHint("zone-a")), apiEP("10.0.1.2", "", zoneHint("zone-b"))),
			epSlice("s-2", "s", ipv4, httpPort, apiEP("10.0.1.3", "")),
		},
		want: []want{{port: "http", proto: "TCP", cluster: addrs("10.0.1.1:8080", "10.0.1.2:8080", "10.0.1.3:8080")}},
	}, {
		name: "zone hints ignored when none names this node's zone",
		svc:  service("s"),
		zone: "zone-c",
		slices: []*discoveryv1.EndpointSlice{epSlice("s-1", "s", ipv4, httpPort,
			apiEP("10.0.1.1", "", zoneHint("zone-a")), apiEP("10.0.1.2", "", zoneHint("zone-b")))},
		want: []want{{port: "http", proto: "TCP", cluster: addrs("10.0.1.1:8080", "10.0.1.2:8080")}},
	}, {
		name: "zone hints ignored when the node has no zone label",
		svc:  service("s"),
		slices: []*discoveryv1.EndpointSlice{epSlice("s-1", "s", ipv4, httpPort,
			apiEP("10.0.1.1", "", zoneHint("zone-a")), apiEP("10.0.1.2", "", zoneHint("zone-b")))},
		want: []want{{port: "http", proto: "TCP", cluster: addrs("10.0.1.1:8080", "10.0.1.2:8080")}},
	}, {
		name: "node hints (trafficDistribution PreferSameNode) for this node",
		svc:  service("s"),
		node: "node-a",
		zone: "zone-a",
		slices: []*discoveryv1.EndpointSlice{epSlice("s-1", "s", ipv4, httpPort,
			apiEP("10.0.1.1", "node-a", zoneHint("zone-a"), nodeHint("node-a")),
			apiEP("10.0.1.2", "node-b", zoneHint("zone-a"), nodeHint("node-b")),
			apiEP("10.0.1.3", "node-c", zoneHint("zone-b"), nodeHint("node-c")))},
		want: []want{{port: "http", proto: "TCP", cluster: addrs("10.0.1.1:8080")}},
	}, {
		name: "node hints for other nodes only: zone hints decide",
		svc:  service("s"),
		node: "node-x",
		zone: "zone-a",
		slices: []*discoveryv1.EndpointSlice{epSlice("s-1", "s", ipv4, httpPort,
			apiEP("10.0.1.1", "node-a", zoneHint("zone-a"), nodeHint("node-a")),
			apiEP("10.0.1.2", "node-b", zoneHint("zone-a"), nodeHint("node-b")),
			apiEP("10.0.1.3", "node-c", zoneHint("zone-b"), nodeHint("node-c")))},
		want: []want{{port: "http", proto: "TCP", cluster: addrs("10.0.1.1:8080", "10.0.1.2:8080")}},
	}, {
		name: "hints with all endpoints terminating: no topology, terminating ones used",
		svc:  service("s"),
		zone: "zone-a",
		slices: []*discoveryv1.EndpointSlice{epSlice("s-1", "s", ipv4, httpPort,
			apiEP("10.0.1.1", "", terminating, zoneHint("zone-a")), apiEP("10.0.1.2", "", terminating, zoneHint("zone-b")))},
		want: []want{{port: "http", proto: "TCP", cluster: addrs("10.0.1.1:8080", "10.0.1.2:8080")}},
	}, {
		name: "single-stack IPv4 Service: IPv6 and FQDN slices ignored",
		svc:  service("s"),
		slices: []*discoveryv1.EndpointSlice{
			epSlice("s-1", "s", ipv4, httpPort, apiEP("10.0.1.1", "")),
			epSlice("s-2", "s", ipv6, httpPort, apiEP("fd00::1", "")),
			epSlice("s-3", "s", discoveryv1.AddressTypeFQDN, httpPort, apiEP("example.com", "")),
		},
		want: []want{{port: "http", proto: "TCP", cluster: addrs("10.0.1.1:8080")}},
	}, {
		name: "single-stack Service without ipFamilies (version skew): family from clusterIP",
		svc: service("s", func(s *corev1.Service) {
			s.Spec.ClusterIP, s.Spec.ClusterIPs, s.Spec.IPFamilies = "fd00::10", nil, nil
		}),
		slices: []*discoveryv1.EndpointSlice{
			epSlice("s-1", "s", ipv4, httpPort, apiEP("10.0.1.1", "")),
			epSlice("s-2", "s", ipv6, httpPort, apiEP("fd00::1", "")),
		},
		want: []want{{port: "http", proto: "TCP", cluster: addrs("[fd00::1]:8080")}},
		check: func(t *testing.T, got []*ServicePort) {
			if !slices.Equal(got[0].ClusterIPs, []netip.Addr{netip.MustParseAddr("fd00::10")}) {
				t.Errorf("ClusterIPs = %v", got[0].ClusterIPs)
			}
		},
	}, {
		name: "dual stack: both families listed, cluster IPs primary first",
		svc: service("s", func(s *corev1.Service) {
			s.Spec.ClusterIP = "fd00::10"
			s.Spec.ClusterIPs = []string{"fd00::10", "10.96.0.10"}
			s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol, corev1.IPv4Protocol}
		}),
		slices: []*discoveryv1.EndpointSlice{
			epSlice("s-a", "s", ipv4, httpPort, apiEP("10.0.1.1", "")),
			epSlice("s-b", "s", ipv6, httpPort, apiEP("fd00::1", ""), apiEP("fd00::2", "")),
		},
		want: []want{{port: "http", proto: "TCP", cluster: addrs("10.0.1.1:8080", "[fd00::1]:8080", "[fd00::2]:8080")}},
		check: func(t *testing.T, got []*ServicePort) {
			w := []netip.Addr{netip.MustParseAddr("fd00::10"), netip.MustParseAddr("10.96.0.10")}
			if !slices.Equal(got[0].ClusterIPs, w) {
				t.Errorf("ClusterIPs = %v, want %v", got[0].ClusterIPs, w)
			}
		},
	}, {
		name: "dual stack: hints decided per family",
		svc:  service("s", dualStack),
		zone: "zone-a",
		slices: []*discoveryv1.EndpointSlice{
			epSlice("s-a", "s", ipv4, httpPort, apiEP("10.0.1.1", "", zoneHint("zone-a")), apiEP("10.0.1.2", "", zoneHint("zone-b"))),
			epSlice("s-b", "s", ipv6, httpPort, apiEP("fd00::1", "", zoneHint("zone-a")), apiEP("fd00::2", "")),
		},
		want: []want{{port: "http", proto: "TCP", cluster: addrs("10.0.1.1:8080", "[fd00::1]:8080", "[fd00::2]:8080")}},
	}, {
		name: "dual stack: terminating fallback decided per family",
		svc:  service("s", dualStack),
		slices: []*discoveryv1.EndpointSlice{
			epSlice("s-a", "s", ipv4, httpPort, apiEP("10.0.1.1", "", terminating), apiEP("10.0.1.2", "", notReady)),
			epSlice("s-b", "s", ipv6, httpPort, apiEP("fd00::1", ""), apiEP("fd00::2", "", terminating)),
		},
		want: []want{{port: "http", proto: "TCP", cluster: addrs("10.0.1.1:8080", "[fd00::1]:8080")}},
	}, {
		name: "dual stack iTP Local with an IPv4 external IP: cluster chain only for IPv4",
		svc:  service("s", dualStack, itpLocal, func(s *corev1.Service) { s.Spec.ExternalIPs = []string{"192.0.2.7"} }),
		node: "node-a",
		slices: []*discoveryv1.EndpointSlice{
			epSlice("s-a", "s", ipv4, httpPort, apiEP("10.0.1.1", "node-a"), apiEP("10.0.1.2", "node-b")),
			epSlice("s-b", "s", ipv6, httpPort, apiEP("fd00::1", "node-a"), apiEP("fd00::2", "node-b")),
		},
		want: []want{{port: "http", proto: "TCP",
			cluster: addrs("10.0.1.1:8080", "10.0.1.2:8080"),
			local:   addrs("10.0.1.1:8080", "[fd00::1]:8080")}},
	}, {
		name: "empty protocol defaults to TCP on both sides",
		svc:  service("s", func(s *corev1.Service) { s.Spec.Ports[0].Protocol = "" }),
		slices: []*discoveryv1.EndpointSlice{epSlice("s-1", "s", ipv4,
			[]discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080)}}, apiEP("10.0.1.1", ""))},
		want: []want{{port: "http", proto: "TCP", cluster: addrs("10.0.1.1:8080")}},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := ServicePortsFor(tc.proxy, tc.svc, tc.slices, tc.node, tc.zone)
			if tc.want == nil {
				if got != nil {
					t.Fatalf("got %s, want the Service skipped", dump(got))
				}
				return
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %d ports %s, want %d", len(got), dump(got), len(tc.want))
			}
			for i, w := range tc.want {
				g := got[i]
				if g.Name.Namespace != tc.svc.Namespace || g.Name.Name != tc.svc.Name || g.Name.Port != w.port || g.Name.Protocol != w.proto {
					t.Errorf("port %d: name %+v, want %s/%s", i, g.Name, w.port, w.proto)
				}
				if !slices.Equal(g.ClusterEndpoints, w.cluster) {
					t.Errorf("%s: cluster endpoints = %v, want %v", g.Name, g.ClusterEndpoints, w.cluster)
				}
				if !slices.Equal(g.LocalEndpoints, w.local) {
					t.Errorf("%s: local endpoints = %v, want %v", g.Name, g.LocalEndpoints, w.local)
				}
			}
			if tc.check != nil {
				tc.check(t, got)
			}
		})
	}
}

func mustBool(t *testing.T, what string, got, want bool) {
	t.Helper()
	if got != want {
		t.Errorf("%s = %v, want %v", what, got, want)
	}
}

// The three Services kube-proxy v1.37.2's nftables mode was reported to disagree on while cut
// off from the API (test/e2e TestDriftCutOff): what the API wants once the changes are made,
// which is what kube-proxy v1.34 to v1.37, iptables and nftables, programmed once healed in the
// lab. Each holds a single endpoint on one side of the cut-off, which v1.37's nftables mode
// writes as a plain `dnat to`: the disagreement was in reading that form, not in this model.
func TestServicePortsCutOffCases(t *testing.T) {
	for _, proxy := range []proxyversion.Version{{}, {Major: 1, Minor: 34}, {Major: 1, Minor: 36}, {Major: 1, Minor: 37}} {
		// internalTrafficPolicy: Local, remote endpoints only, then a ready one on this node
		// added and a remote one not ready: the local chain gets the new one.
		got := ServicePortsFor(proxy, service("local-only", itpLocal), []*discoveryv1.EndpointSlice{
			epSlice("local-only-1", "local-only", ipv4, httpPort,
				apiEP("10.244.7.1", "node-b"), apiEP("10.244.7.2", "node-b", notReady), apiEP("10.244.7.3", "node-a")),
		}, "node-a", "")
		if len(got) != 1 || got[0].ClusterEndpoints != nil || !slices.Equal(got[0].LocalEndpoints, addrs("10.244.7.3:8080")) {
			t.Errorf("%v: local-only %s, want local 10.244.7.3:8080 only", proxy, dump(got))
		}

		// An IPv4 slice with port http = 8787, down to its endpoint on this node, and an IPv6
		// slice with http = 8080: an IPv4 Service takes its family's slice alone; a dual-stack
		// one each family's own port.
		slices2 := []*discoveryv1.EndpointSlice{
			epSlice("two-families-v4", "two-families", ipv4, []discoveryv1.EndpointPort{slicePort("http", 8787, corev1.ProtocolTCP)}, apiEP("10.244.8.1", "node-a")),
			epSlice("two-families-v6", "two-families", ipv6, httpPort, apiEP("fd00:10:244:8::1", "node-b")),
		}
		got = ServicePortsFor(proxy, service("two-families"), slices2, "node-a", "")
		if len(got) != 1 || !slices.Equal(got[0].ClusterEndpoints, addrs("10.244.8.1:8787")) || got[0].LocalEndpoints != nil {
			t.Errorf("%v: two-families %s, want cluster 10.244.8.1:8787", proxy, dump(got))
		}
		got = ServicePortsFor(proxy, service("two-families", dualStack), slices2, "node-a", "")
		if len(got) != 1 || !slices.Equal(got[0].ClusterEndpoints, addrs("10.244.8.1:8787", "[fd00:10:244:8::1]:8080")) {
			t.Errorf("%v: dual-stack two-families %s, want 10.244.8.1:8787 and [fd00:10:244:8::1]:8080", proxy, dump(got))
		}

		// internalTrafficPolicy: Local, its slice of terminating endpoints deleted and its port
		// renumbered: no endpoint, under the port's new number.
		got = ServicePortsFor(proxy, service("renumbered", itpLocal, func(s *corev1.Service) { s.Spec.Ports[0].Port = 6015 }), nil, "node-a", "")
		if len(got) != 1 || got[0].Port != 6015 || got[0].ClusterEndpoints != nil || got[0].LocalEndpoints != nil {
			t.Errorf("%v: renumbered %s, want port 6015 without endpoints", proxy, dump(got))
		}
	}
}

// A port publishes its node port, and the Service's external IPs and VIP-mode load-balancer
// ingress IPs of its families, once each: the addresses kube-proxy also sends to the port.
func TestServicePortsNodePortAndExternalIPs(t *testing.T) {
	lb := service("lb", dualStack, func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Spec.Ports = []corev1.ServicePort{
			{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, NodePort: 30080},
			{Name: "https", Protocol: corev1.ProtocolTCP, Port: 443, NodePort: 30443},
		}
		s.Spec.ExternalIPs = []string{"192.0.2.9", "2001:db8::9", "192.0.2.9", "198.51.100.1", "not-an-ip"}
		s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{
			{IP: "192.0.2.1"},
			{IP: "192.0.2.2", IPMode: ptr.To(corev1.LoadBalancerIPModeProxy)}, // no rules in proxy mode
			{IP: "192.0.2.9", IPMode: ptr.To(corev1.LoadBalancerIPModeVIP)},
			{Hostname: "lb.example"},
		}
	})
	ports := ServicePorts(lb, nil, "node-a", "")
	if len(ports) != 2 {
		t.Fatalf("ServicePorts = %s, want two ports", dump(ports))
	}
	wantIPs := []netip.Addr{
		netip.MustParseAddr("192.0.2.9"), netip.MustParseAddr("198.51.100.1"), netip.MustParseAddr("192.0.2.1"),
		netip.MustParseAddr("2001:db8::9"),
	}
	for i, wantNodePort := range []uint16{30080, 30443} {
		if p := ports[i]; p.NodePort != wantNodePort || !slices.Equal(p.ExternalIPs, wantIPs) {
			t.Errorf("port %s: NodePort %d, ExternalIPs %v; want %d, %v", p.Name, p.NodePort, p.ExternalIPs, wantNodePort, wantIPs)
		}
	}
	if &ports[0].ExternalIPs[0] != &ports[1].ExternalIPs[0] || cap(ports[0].ExternalIPs) != len(wantIPs) {
		t.Error("the Service's ports do not share one clipped list of external IPs")
	}
	// The cluster IPs share the array and end where the external IPs start: an append to
	// them must not write over the first external IP.
	if cips := ports[0].ClusterIPs; len(cips) != 2 || cap(cips) != 2 {
		t.Errorf("ClusterIPs %v, cap %d: want the two, clipped", cips, cap(cips))
	}

	// A single-stack Service: kube-proxy has no rules for its external IPs of the other family.
	single := service("single", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeNodePort
		s.Spec.Ports[0].NodePort = 31000
		s.Spec.ExternalIPs = []string{"2001:db8::9", "192.0.2.9"}
	})
	p := ServicePorts(single, nil, "node-a", "")[0]
	if p.NodePort != 31000 || !slices.Equal(p.ExternalIPs, []netip.Addr{netip.MustParseAddr("192.0.2.9")}) {
		t.Errorf("single-stack: NodePort %d, ExternalIPs %v; want 31000, [192.0.2.9]", p.NodePort, p.ExternalIPs)
	}

	// A plain ClusterIP Service has neither.
	if p := ServicePorts(service("plain"), nil, "node-a", "")[0]; p.NodePort != 0 || p.ExternalIPs != nil {
		t.Errorf("ClusterIP Service: NodePort %d, ExternalIPs %v; want 0, nil", p.NodePort, p.ExternalIPs)
	}
}
