package conntrack

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/proxyhealth/proxyhealth/internal/cluster"
)

// benchView is an attribution view of 1,000 TCP Service ports from the API view, each with
// a node port and three endpoints, and a node with a few interfaces.
func benchView() *attributionView {
	ports := make([]*cluster.ServicePort, 1000)
	for i := range ports {
		ports[i] = &cluster.ServicePort{
			Name:       cluster.ServicePortName{Namespace: "ns", Name: fmt.Sprintf("svc-%d", i), Protocol: "TCP"},
			ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})},
			Port:       80,
			NodePort:   uint16(30000 + i),
			ClusterEndpoints: []netip.AddrPort{
				netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, byte(i >> 8), byte(i)}), 8080),
				netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 245, byte(i >> 8), byte(i)}), 8080),
				netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 246, byte(i >> 8), byte(i)}), 8080),
			},
		}
	}
	snap := &cluster.Snapshot{Synced: true, Ports: ports}
	p := netip.MustParsePrefix
	ln := newLocalNet([]iface{
		{name: "lo", loopback: true, addrs: []netip.Prefix{p("127.0.0.1/8"), p("::1/128")}},
		{name: "eth0", addrs: []netip.Prefix{p("192.168.0.5/24"), p("fe80::5/64")}},
		{name: "cni0", bridge: true, addrs: []netip.Prefix{p("10.244.1.1/24")}},
	}, nil)
	return &attributionView{services: apiServiceMap(snap), endpoints: apiEndpointMap(snap), net: ln}
}

// BenchmarkInvalidPacketService is the Service lookup of one INVALID packet, by what it
// carries: the per-packet cost the INVALID log adds to BenchmarkInvalidLogMessage's decode.
func BenchmarkInvalidPacketService(b *testing.B) {
	view := benchView()
	client := netip.MustParseAddr("192.168.0.77")
	node := netip.MustParseAddr("192.168.0.5")
	for _, bc := range []struct {
		name string
		t    tuple
	}{
		{"cluster_ip", tuple{src: client, dst: netip.MustParseAddr("10.96.1.44"), srcPort: 40000, dstPort: 80, proto: 6}},
		{"endpoint", tuple{src: netip.MustParseAddr("10.244.1.44"), dst: client, srcPort: 8080, dstPort: 40000, proto: 6}},
		{"node_port", tuple{src: client, dst: node, srcPort: 40000, dstPort: 30300, proto: 6}},
		{"none", tuple{src: client, dst: node, srcPort: 40000, dstPort: 22, proto: 6}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				view.invalidPacketService(&bc.t)
			}
		})
	}
}
