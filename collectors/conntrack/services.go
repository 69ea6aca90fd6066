package conntrack

import (
	"fmt"
	"iter"
	"log/slog"
	"net/netip"
	"slices"
	"strings"

	"github.com/proxyhealth/proxyhealth/internal/cluster"
	"github.com/proxyhealth/proxyhealth/internal/hostrules"
	"github.com/proxyhealth/proxyhealth/internal/ruleset"
)

// serviceMap is a ServiceMap held in memory.
type serviceMap map[serviceKey]Service

type serviceKey struct {
	addr  netip.Addr
	port  uint16
	proto uint8
}

func (m serviceMap) Lookup(addr netip.Addr, port uint16, proto uint8) (Service, bool) {
	s, ok := m[serviceKey{addr.Unmap(), port, proto}]
	return s, ok
}

func (m serviceMap) Len() int { return len(m) }

func (m serviceMap) Services() iter.Seq[Service] {
	return func(yield func(Service) bool) {
		for _, svc := range m {
			if !yield(svc) {
				return
			}
		}
	}
}

// LookupNodePort finds nothing: kube-proxy's rules are read for cluster IPs only.
func (m serviceMap) LookupNodePort(netip.Addr, uint16, uint8) (Service, bool) {
	return Service{}, false
}

// apiServiceMap maps each Service address of the API view to its Service: its cluster IPs
// and external IPs (with the port and protocol), and its node ports. A cluster IP wins over
// another Service's external IP at the same address, port and protocol, and of two external
// IPs or node ports the first in the view's order.
func apiServiceMap(snap *cluster.Snapshot) apiServices {
	m := apiServices{serviceMap: make(serviceMap, len(snap.Ports))}
	for _, sp := range snap.Ports {
		if proto, ok := protocolNumbers[strings.ToLower(sp.Name.Protocol)]; ok {
			for _, ip := range sp.ClusterIPs {
				m.serviceMap[serviceKey{ip.Unmap(), sp.Port, proto}] = serviceOf(sp)
			}
		}
	}
	m.clusterIPs = len(m.serviceMap)
	// Then the external IPs, whose key another Service may have taken.
	for _, sp := range snap.Ports {
		proto, ok := protocolNumbers[strings.ToLower(sp.Name.Protocol)]
		if !ok {
			continue
		}
		for _, ip := range sp.ExternalIPs {
			k := serviceKey{ip.Unmap(), sp.Port, proto}
			if _, taken := m.serviceMap[k]; !taken {
				m.serviceMap[k] = serviceOf(sp)
			}
		}
		if sp.NodePort == 0 {
			continue
		}
		for _, ip := range sp.ClusterIPs { // the node port is open in the Service's families
			k := nodePortIndex(ip, sp.NodePort, proto)
			if _, taken := m.nodePorts[k]; taken {
				continue
			}
			if m.nodePorts == nil {
				m.nodePorts = make(map[uint32]Service)
			}
			m.nodePorts[k] = serviceOf(sp)
		}
	}
	return m
}

func serviceOf(sp *cluster.ServicePort) Service {
	return Service{Namespace: sp.Name.Namespace, Name: sp.Name.Name, Port: sp.Port}
}

// apiServices is the API view's Service map: cluster IPs and external IPs by address, port
// and protocol, and node ports by family, number and protocol (nodePortIndex: a 32-bit key,
// the cheapest lookup, since a packet that matches nothing else ends with this one). Len
// counts its cluster IP keys only, the Service ports known, as the map from kube-proxy's
// rules holds nothing else.
type apiServices struct {
	serviceMap
	nodePorts  map[uint32]Service
	clusterIPs int
}

func (m apiServices) Len() int { return m.clusterIPs }

func (m apiServices) LookupNodePort(addr netip.Addr, port uint16, proto uint8) (Service, bool) {
	s, ok := m.nodePorts[nodePortIndex(addr, port, proto)]
	return s, ok
}

// nodePortIndex is the key of a node port of addr's family in apiServices.nodePorts.
func nodePortIndex(addr netip.Addr, port uint16, proto uint8) uint32 {
	k := uint32(proto)<<16 | uint32(port)
	if !addr.Unmap().Is4() {
		k |= 1 << 24
	}
	return k
}

// apiEndpointMap maps each endpoint of the API view (address, port, protocol) to the first
// Service port, in the view's order, that sends to it.
func apiEndpointMap(snap *cluster.Snapshot) serviceMap {
	m := make(serviceMap)
	for _, sp := range snap.Ports {
		proto, ok := protocolNumbers[strings.ToLower(sp.Name.Protocol)]
		if !ok {
			continue
		}
		svc := serviceOf(sp)
		for _, eps := range [][]netip.AddrPort{sp.ClusterEndpoints, sp.LocalEndpoints} {
			for _, ep := range eps {
				k := serviceKey{ep.Addr().Unmap(), ep.Port(), proto}
				if _, taken := m[k]; !taken {
					m[k] = svc
				}
			}
		}
	}
	return m
}

// sameServices reports whether two snapshots' ports map the same cluster IPs, external IPs,
// node ports, ports and protocols to the same Services, so that the map built from the first
// serves the second. Endpoint changes, most of a busy cluster's, leave them so. The view shares the ports a
// change did not touch between snapshots, and both lists are sorted: a walk comparing
// pointers settles most ports, and the others are compared by what the map holds.
func sameServices(a, b []*cluster.ServicePort) bool {
	if len(a) != len(b) {
		return false
	}
	for i, p := range a {
		q := b[i]
		if p == q {
			continue
		}
		if p.Name != q.Name || p.Port != q.Port || p.NodePort != q.NodePort ||
			!slices.Equal(p.ClusterIPs, q.ClusterIPs) || !slices.Equal(p.ExternalIPs, q.ExternalIPs) {
			return false
		}
	}
	return true
}

type emptyServiceMap struct{}

func (emptyServiceMap) Lookup(netip.Addr, uint16, uint8) (Service, bool) { return Service{}, false }
func (emptyServiceMap) LookupNodePort(netip.Addr, uint16, uint8) (Service, bool) {
	return Service{}, false
}
func (emptyServiceMap) Len() int { return 0 }

func (emptyServiceMap) Services() iter.Seq[Service] { return func(func(Service) bool) {} }

// Rules is the node's netfilter state as the exporter last read it (*hostrules.Source).
type Rules interface {
	State() *hostrules.State
}

// rulesServices maps the cluster IPs kube-proxy dispatches (its KUBE-SERVICES rules, or its
// nftables service-ips map) to their Services, for attribution without an API. In iptables
// mode above 1,000 endpoints kube-proxy leaves out the comments that name a Service: the port
// is then known, its name is not. Node ports and external IPs are not read from the rules
// (KUBE-NODEPORTS, KUBE-EXT-*, the service-nodeports map): only the API view gives them.
type rulesServices struct {
	rules     Rules
	logger    *slog.Logger
	endpoints bool // build the map of endpoints too
	lastNote  string
	lastSeq   uint64
	last      serviceMap
	lastEps   serviceMap
}

func newRulesServices(rules Rules, logger *slog.Logger, endpoints bool) *rulesServices {
	return &rulesServices{rules: rules, logger: logger, endpoints: endpoints}
}

// load returns the maps of Service addresses and of endpoints of the last read, rebuilt only
// when a new read was published, and whether they are new since the last call. The endpoints
// are those of each Service's chain, and the map is empty unless asked for.
func (k *rulesServices) load() (services, endpoints ServiceMap, changed bool) {
	var st *hostrules.State
	if k.rules != nil {
		st = k.rules.State()
	}
	if st != nil && k.last != nil && st.Seq == k.lastSeq {
		return k.last, k.lastEps, false
	}
	m, eps := serviceMap{}, serviceMap{}
	var note string
	switch {
	case st == nil:
		note = "the node's netfilter rules are not read (or not yet): unreplied flows are reported with reason no_service and empty service labels until the API view syncs"
	default:
		for _, t := range st.Proxy {
			if t == nil {
				continue
			}
			for _, sp := range t.Services {
				svc := Service{Namespace: sp.Namespace, Name: sp.Name, Port: sp.Port}
				m[serviceKey{sp.ClusterIP.Unmap(), sp.Port, sp.Protocol}] = svc
				if !k.endpoints {
					continue
				}
				for _, ep := range t.Chains[sp.Chain] {
					if key := (serviceKey{ep.Addr().Unmap(), ep.Port(), sp.Protocol}); eps[key] == (Service{}) {
						eps[key] = svc
					}
				}
			}
		}
		switch {
		case st.ProxyErr != nil:
			note = "cannot read kube-proxy's rules; flows are attributed only to Services found elsewhere: " + st.ProxyErr.Error()
		case len(m) == 0:
			note = "no kube-proxy service rules on this node: unreplied flows are reported with reason no_service and empty service labels"
		default:
			note = fmt.Sprintf("attributing flows to %d Service ports from kube-proxy's rules (%s)", len(m), st.Backend)
		}
		k.lastSeq, k.last, k.lastEps = st.Seq, m, eps
	}
	if note != k.lastNote {
		// Said once, and again only when it changes.
		if st != nil && st.ProxyErr != nil {
			k.logger.Warn(note)
		} else {
			k.logger.Info(note)
		}
		k.lastNote = note
	}
	return m, eps, true
}

var protocolNumbers = map[string]uint8{"tcp": ruleset.ProtoTCP, "udp": ruleset.ProtoUDP, "sctp": ruleset.ProtoSCTP}
