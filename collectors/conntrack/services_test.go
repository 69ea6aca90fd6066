package conntrack

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/prometheus/common/promslog"
	"github.com/proxyhealth/proxyhealth/internal/cluster"
	"github.com/proxyhealth/proxyhealth/internal/hostrules"
	"github.com/proxyhealth/proxyhealth/internal/ruleset"
)

// rulesAt serves one read of the node's netfilter state.
type rulesAt struct{ st *hostrules.State }

func (r *rulesAt) State() *hostrules.State { return r.st }

func TestRulesServicesLoad(t *testing.T) {
	// kube-proxy's KUBE-SERVICES as read: kube-dns named by its comments, the kubernetes
	// Service without one (kube-proxy drops them above 1,000 endpoints).
	dns := netip.MustParseAddr("10.96.0.10")
	rules := &rulesAt{&hostrules.State{Seq: 1, Mode: hostrules.ModeIPTables, Backend: hostrules.BackendIPTablesNFT,
		Proxy: map[bool]*ruleset.ProxyTable{false: {Services: []ruleset.Service{
			{ClusterIP: dns, Port: 53, Protocol: ruleset.ProtoUDP, Namespace: "kube-system", Name: "kube-dns", PortName: "dns"},
			{ClusterIP: dns, Port: 53, Protocol: ruleset.ProtoTCP, Namespace: "kube-system", Name: "kube-dns", PortName: "dns-tcp"},
			{ClusterIP: netip.MustParseAddr("10.96.0.1"), Port: 443, Protocol: ruleset.ProtoTCP},
		}}}}}
	k := newRulesServices(rules, promslog.NewNopLogger(), false)
	m, _, changed := k.load()
	if !changed || m.Len() != 3 {
		t.Fatalf("first load: Len() = %d, changed %v; want 3, true", m.Len(), changed)
	}
	if svc, ok := m.Lookup(dns, 53, ruleset.ProtoUDP); !ok || svc != (Service{"kube-system", "kube-dns", 53}) {
		t.Errorf("Lookup(dns udp) = %+v, %v", svc, ok)
	}
	if svc, ok := m.Lookup(netip.MustParseAddr("10.96.0.1"), 443, ruleset.ProtoTCP); !ok || svc.Port != 443 || svc.Name != "" {
		t.Errorf("Lookup(uncommented) = %+v, %v", svc, ok)
	}
	if _, _, changed := k.load(); changed {
		t.Error("the same read loaded twice reports a change")
	}
	if !strings.Contains(k.lastNote, "3 Service ports") {
		t.Errorf("note %q", k.lastNote)
	}
	// A refusal is passed on in the log, not taken for "no kube-proxy".
	rules.st = &hostrules.State{Seq: 2, Mode: hostrules.ModeNone, ProxyErr: errors.New("operation not permitted")}
	if m, _, changed := k.load(); !changed || m.Len() != 0 || !strings.Contains(k.lastNote, "operation not permitted") {
		t.Errorf("refused: Len() %d, changed %v, note %q", m.Len(), changed, k.lastNote)
	}
	// No reader at all: flows stay unattributed until the API view syncs.
	k = newRulesServices(nil, promslog.NewNopLogger(), false)
	if m, _, _ := k.load(); m.Len() != 0 || !strings.Contains(k.lastNote, "not read") {
		t.Errorf("no reader: Len() %d, note %q", m.Len(), k.lastNote)
	}
}

// nodePortView is the API view of two Services: lab/web, dual-stack with node port 30080 and
// external IPs 192.0.2.10 and 2001:db8::10, and lab/udp, IPv4 only, with node port 30080
// over UDP; on a node with addresses 192.168.0.5 and fd00::5.
func nodePortView() *attributionView {
	snap := &cluster.Snapshot{Synced: true, Ports: []*cluster.ServicePort{{
		Name:       cluster.ServicePortName{Namespace: "lab", Name: "udp", Protocol: "UDP"},
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.53")},
		Port:       53,
		NodePort:   30080,
	}, {
		Name:        cluster.ServicePortName{Namespace: "lab", Name: "web", Port: "http", Protocol: "TCP"},
		ClusterIPs:  []netip.Addr{netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("fd00:96::a")},
		ExternalIPs: []netip.Addr{netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("2001:db8::10")},
		Port:        80,
		NodePort:    30080,
	}}}
	p := netip.MustParsePrefix
	ln := newLocalNet([]iface{
		{name: "lo", loopback: true, addrs: []netip.Prefix{p("127.0.0.1/8"), p("::1/128")}},
		{name: "eth0", addrs: []netip.Prefix{p("192.168.0.5/24"), p("fd00::5/64")}},
	}, nil)
	return &attributionView{services: apiServiceMap(snap), endpoints: apiEndpointMap(snap), net: ln}
}

func TestInvalidPacketServiceNodePortsAndExternalIPs(t *testing.T) {
	view := nodePortView()
	udp := Service{Namespace: "lab", Name: "udp", Port: 53}
	for _, tc := range []struct {
		name     string
		src, dst string
		proto    uint8
		want     Service
	}{
		{"external IP", "198.51.100.7:40000", "192.0.2.10:80", 6, webService},
		{"external IP, IPv6", "[2001:db8:1::7]:40000", "[2001:db8::10]:80", 6, webService},
		{"external IP at the node port's number", "198.51.100.7:40000", "192.0.2.10:30080", 6, Service{}},
		{"node port on the node's address", "198.51.100.7:40000", "192.168.0.5:30080", 6, webService},
		{"node port on the node's IPv6 address", "[2001:db8:1::7]:40000", "[fd00::5]:30080", 6, webService},
		{"node port on loopback", "127.0.0.1:40000", "127.0.0.1:30080", 6, webService},
		{"node port over UDP", "198.51.100.7:40000", "192.168.0.5:30080", 17, udp},
		{"UDP node port, IPv4 only", "[2001:db8:1::7]:40000", "[fd00::5]:30080", 17, Service{}},
		{"another port on the node", "198.51.100.7:40000", "192.168.0.5:30081", 6, Service{}},
		{"the node port on another host", "198.51.100.7:40000", "192.168.0.6:30080", 6, Service{}},
		// The node's own connection, from a port that happens to be a node port's number.
		{"node port as the source", "192.168.0.5:30080", "198.51.100.7:443", 6, Service{}},
	} {
		src, dst := netip.MustParseAddrPort(tc.src), netip.MustParseAddrPort(tc.dst)
		tu := tuple{src: src.Addr(), dst: dst.Addr(), srcPort: src.Port(), dstPort: dst.Port(), proto: tc.proto}
		if got := view.invalidPacketService(&tu); got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

// An unreplied flow DNAT'ed from a node port or an external IP counts for its Service.
func TestAttributeNodePortAndExternalIPFlows(t *testing.T) {
	view := nodePortView()
	client, endpoint := netip.MustParseAddr("198.51.100.7"), netip.MustParseAddr("10.244.2.9")
	for _, tc := range []struct {
		name string
		dst  string
		want Service
	}{
		{"node port", "192.168.0.5:30080", webService},
		{"external IP", "192.0.2.10:80", webService},
		{"a port kube-proxy does not serve", "192.168.0.5:30081", Service{}},
	} {
		dst := netip.MustParseAddrPort(tc.dst)
		orig := tuple{src: client, dst: dst.Addr(), srcPort: 40000, dstPort: dst.Port(), proto: 6}
		reply := tuple{src: endpoint, dst: netip.MustParseAddr("192.168.0.5"), srcPort: 8080, dstPort: 40000, proto: 6}
		key := view.attribute(&orig, &reply)
		if key.svc != tc.want {
			t.Errorf("%s: service %+v, want %+v", tc.name, key.svc, tc.want)
		}
		if wantReason := reasonRemoteEndpoint; tc.want != (Service{}) && key.reason != wantReason {
			t.Errorf("%s: reason %v, want %v", tc.name, key.reason, wantReason)
		}
	}
}
