package conntrack

import (
	"net/netip"
	"slices"
	"testing"
)

func TestLocalNetClassify(t *testing.T) {
	p := netip.MustParsePrefix
	n := newLocalNet([]iface{
		{name: "lo", loopback: true, addrs: []netip.Prefix{p("127.0.0.1/8")}},
		{name: "cni0", bridge: true, addrs: []netip.Prefix{p("10.244.1.1/24"), p("fe80::1/64")}},
		{name: "eth0", addrs: []netip.Prefix{p("192.168.0.5/24")}},
		{name: "cali1"},
	}, []route{
		{dst: p("192.168.0.0/24"), iface: "eth0"},
		{dst: p("10.244.1.0/24"), iface: "cni0"},
		{dst: p("10.244.9.9/32"), iface: "cali1"},
		{dst: p("fd00::9/128"), iface: "cali1"},
		{dst: p("10.244.2.0/24"), gateway: true, iface: "flannel.1"},
		{dst: p("10.244.3.3/32"), gateway: true, iface: "eth0"},
		{dst: p("127.0.0.2/32"), iface: "lo"},
	})
	if want := []netip.Prefix{p("10.244.1.0/24")}; !slices.Equal(n.bridges, want) {
		t.Errorf("bridges = %v, want %v", n.bridges, want)
	}
	for _, tc := range []struct {
		client, endpoint string
		want             reason
	}{
		{"10.244.1.2", "10.244.1.3", reasonSameBridge},
		{"192.168.0.9", "10.244.1.3", reasonLocalEndpoint}, // bridge subnet, client elsewhere
		{"10.244.1.2", "10.244.9.9", reasonLocalEndpoint},  // per-pod host route (cali1)
		{"10.244.1.2", "fd00::9", reasonLocalEndpoint},     // IPv6 host route
		{"10.244.1.2", "192.168.0.5", reasonLocalEndpoint}, // the node's own address
		{"10.244.1.2", "192.168.0.6", reasonRemoteEndpoint},
		{"10.244.1.2", "10.244.2.7", reasonRemoteEndpoint}, // via flannel.1's gateway
		{"10.244.1.2", "10.244.3.3", reasonRemoteEndpoint}, // host route through a gateway
		{"10.244.1.2", "127.0.0.2", reasonRemoteEndpoint},  // loopback routes are skipped
	} {
		if got := n.classify(netip.MustParseAddr(tc.client), netip.MustParseAddr(tc.endpoint)); got != tc.want {
			t.Errorf("classify(%s, %s) = %v, want %v", tc.client, tc.endpoint, got, tc.want)
		}
	}
}
