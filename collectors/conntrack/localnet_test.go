package conntrack

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

func TestLoadLocalNet(t *testing.T) {
	addrs := map[string][]netip.Prefix{
		"cni0":  {netip.MustParsePrefix("10.244.1.1/24"), netip.MustParsePrefix("fe80::1/64")},
		"eth0":  {netip.MustParsePrefix("192.168.0.5/24")},
		"cali1": nil,
	}
	n, err := loadLocalNet("testdata/proc", "testdata/sys", func(name string) ([]netip.Prefix, error) {
		a, ok := addrs[name]
		if !ok {
			return nil, fmt.Errorf("no interface %s", name)
		}
		return a, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}; !slices.Equal(n.bridges, want) {
		t.Errorf("bridges = %v, want %v", n.bridges, want)
	}
	for _, tc := range []struct {
		client, endpoint string
		want             reason
	}{
		{"10.244.1.2", "10.244.1.3", reasonSameBridge},
		{"192.168.0.9", "10.244.1.3", reasonLocalEndpoint}, // bridge subnet, client elsewhere
		{"10.244.1.2", "10.244.9.9", reasonLocalEndpoint},  // per-pod host route (cali1)
		{"10.244.1.2", "192.168.0.5", reasonLocalEndpoint}, // the node's own address
		{"10.244.1.2", "10.244.2.7", reasonRemoteEndpoint}, // via flannel.1's gateway
		{"10.244.1.2", "fd00::9", reasonLocalEndpoint},     // IPv6 host route
		{"10.244.1.2", "127.0.0.1", reasonRemoteEndpoint},  // loopback routes are skipped
	} {
		if got := n.classify(netip.MustParseAddr(tc.client), netip.MustParseAddr(tc.endpoint)); got != tc.want {
			t.Errorf("classify(%s, %s) = %v, want %v", tc.client, tc.endpoint, got, tc.want)
		}
	}
}

func TestParseRoutesRejectsGarbage(t *testing.T) {
	if _, err := parseIPv4HostRoutes(strings.NewReader("header\neth0 zz\n")); err == nil {
		t.Error("short IPv4 route line: no error")
	}
	if _, err := parseIPv4HostRoutes(strings.NewReader("header\neth0 XYZ 00000000 0 0 0 0 FFFFFFFF 0 0 0\n")); err == nil {
		t.Error("bad IPv4 destination: no error")
	}
	if _, err := parseIPv6HostRoutes(strings.NewReader("zz 8g a b c d e f g h\n")); err == nil {
		t.Error("bad IPv6 line: no error")
	}
}

func FuzzParseRoutes(f *testing.F) {
	f.Add("Iface\tDestination\nx\t0100007F\t00000000\t0005\t0\t0\t0\tFFFFFFFF\t0\t0\t0\n")
	f.Add("fd000000000000000000000000000009 80 00000000000000000000000000000000 00 00000000000000000000000000000000 00000400 00000001 00000000 00000001 cali1\n")
	f.Fuzz(func(t *testing.T, s string) {
		_, _ = parseIPv4HostRoutes(strings.NewReader(s))
		_, _ = parseIPv6HostRoutes(strings.NewReader(s))
	})
}
