package ipvs_test

import (
	"net/netip"
	"os"
	"slices"
	"testing"

	cfipvs "github.com/cloudflare/ipvs"
	"github.com/cloudflare/ipvs/netmask"

	"github.com/proxyhealth/proxyhealth/internal/ipvs"
	"github.com/proxyhealth/proxyhealth/internal/ipvs/ipvstest"
	"github.com/proxyhealth/proxyhealth/internal/nftnl/nftnltest"
)

func TestMain(m *testing.M) {
	nftnltest.ReexecInNetns()
	os.Exit(m.Run())
}

// Virtual servers created through the kernel, as kube-proxy creates them, read back as they
// were made: addresses of both families, persistence, weights; and gone once deleted.
func TestKernelReadIPVS(t *testing.T) {
	ipvstest.Require(t)
	c, err := cfipvs.New()
	if err != nil {
		t.Fatal(err)
	}
	dns := cfipvs.Service{Address: netip.MustParseAddr("10.96.0.10"), Port: 53, Protocol: cfipvs.UDP, Family: cfipvs.INET, Scheduler: "rr",
		Netmask: netmask.MaskFrom(32, 32)}
	api := cfipvs.Service{Address: netip.MustParseAddr("10.96.0.1"), Port: 443, Protocol: cfipvs.TCP, Family: cfipvs.INET, Scheduler: "rr",
		Flags: cfipvs.ServicePersistent, Timeout: 10800, Netmask: netmask.MaskFrom(32, 32)}
	web6 := cfipvs.Service{Address: netip.MustParseAddr("fd00:96::80"), Port: 80, Protocol: cfipvs.TCP, Family: cfipvs.INET6, Scheduler: "rr",
		Netmask: netmask.MaskFrom(128, 128)}
	empty := cfipvs.Service{Address: netip.MustParseAddr("10.96.0.99"), Port: 8080, Protocol: cfipvs.SCTP, Family: cfipvs.INET, Scheduler: "rr",
		Netmask: netmask.MaskFrom(32, 32)}
	dest := func(addr string, port uint16, weight uint32) cfipvs.Destination {
		a := netip.MustParseAddr(addr)
		fam := cfipvs.INET
		if a.Is6() {
			fam = cfipvs.INET6
		}
		return cfipvs.Destination{Address: a, Port: port, Weight: weight, Family: fam, FwdMethod: cfipvs.Masquerade}
	}
	for _, s := range []cfipvs.Service{dns, api, web6, empty} {
		if err := c.CreateService(s); err != nil {
			t.Fatalf("create %v: %v", s.Address, err)
		}
		t.Cleanup(func() { _ = c.RemoveService(s) })
	}
	for _, d := range []struct {
		svc  cfipvs.Service
		dest cfipvs.Destination
	}{
		{dns, dest("10.244.1.5", 53, 1)}, {dns, dest("10.244.2.6", 53, 1)}, {dns, dest("10.244.3.7", 53, 0)},
		{api, dest("192.168.1.10", 6443, 1)},
		{web6, dest("fd00:244::5", 8080, 1)},
	} {
		if err := c.CreateDestination(d.svc, d.dest); err != nil {
			t.Fatalf("create %v in %v: %v", d.dest.Address, d.svc.Address, err)
		}
	}

	got, err := ipvs.Read("/proc")
	if err != nil {
		t.Fatal(err)
	}
	rs := func(ep string, weight uint32) ipvs.RealServer {
		return ipvs.RealServer{Addr: netip.MustParseAddrPort(ep), Weight: weight}
	}
	want := []ipvs.VirtualServer{
		{Key: ipvs.Key{netip.MustParseAddr("10.96.0.1"), 443, "TCP"}, Scheduler: "rr", Persistent: true, Timeout: 10800,
			RealServers: []ipvs.RealServer{rs("192.168.1.10:6443", 1)}},
		{Key: ipvs.Key{netip.MustParseAddr("10.96.0.10"), 53, "UDP"}, Scheduler: "rr",
			RealServers: []ipvs.RealServer{rs("10.244.1.5:53", 1), rs("10.244.2.6:53", 1), rs("10.244.3.7:53", 0)}},
		{Key: ipvs.Key{netip.MustParseAddr("10.96.0.99"), 8080, "SCTP"}, Scheduler: "rr", RealServers: []ipvs.RealServer{}},
		{Key: ipvs.Key{netip.MustParseAddr("fd00:96::80"), 80, "TCP"}, Scheduler: "rr",
			RealServers: []ipvs.RealServer{rs("[fd00:244::5]:8080", 1)}},
	}
	if !slices.EqualFunc(got, want, sameServer) {
		t.Errorf("read back\n%+v\nwant\n%+v", got, want)
	}

	if err := c.RemoveService(dns); err != nil {
		t.Fatal(err)
	}
	got, err = ipvs.Read("/proc")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || slices.ContainsFunc(got, func(v ipvs.VirtualServer) bool { return v.Port == 53 }) {
		t.Errorf("after deleting the DNS virtual server: %+v", got)
	}
	for _, s := range []cfipvs.Service{api, web6, empty} {
		if err := c.RemoveService(s); err != nil {
			t.Fatal(err)
		}
	}
	if got, err = ipvs.Read("/proc"); err != nil || len(got) != 0 {
		t.Errorf("after deleting every virtual server: %+v, %v; want none and no error", got, err)
	}
}

func sameServer(a, b ipvs.VirtualServer) bool {
	return a.Key == b.Key && a.Scheduler == b.Scheduler && a.Persistent == b.Persistent && a.Timeout == b.Timeout &&
		slices.Equal(a.RealServers, b.RealServers)
}

// BenchmarkKernelRead measures a dump of 10,000 virtual servers x 10 real servers (200 x 10
// with -test.short), created first in the test's network namespace, as kube-proxy's IPVS mode
// programs 10,000 ClusterIP Service ports. It needs ip_vs: in the kernel matrix's guest.
func BenchmarkKernelRead(b *testing.B) {
	ipvstest.Require(b)
	services := 10000
	if testing.Short() {
		services = 200
	}
	c, err := cfipvs.New()
	if err != nil {
		b.Fatal(err)
	}
	for s := range services {
		svc := cfipvs.Service{Address: netip.AddrFrom4([4]byte{10, 96, byte(s >> 8), byte(s)}), Port: 80, Protocol: cfipvs.TCP,
			Family: cfipvs.INET, Scheduler: "rr", Netmask: netmask.MaskFrom(32, 32)}
		if err := c.CreateService(svc); err != nil {
			b.Fatalf("create virtual server %d: %v", s, err)
		}
		b.Cleanup(func() { _ = c.RemoveService(svc) })
		for e := range 10 {
			d := cfipvs.Destination{Address: netip.AddrFrom4([4]byte{10, byte(128 + s>>13), byte(s >> 5), byte(s<<3 | e&7)}), Port: uint16(8080 + e),
				Weight: 1, Family: cfipvs.INET, FwdMethod: cfipvs.Masquerade}
			if err := c.CreateDestination(svc, d); err != nil {
				b.Fatalf("create real server %d of virtual server %d: %v", e, s, err)
			}
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		got, err := ipvs.Read("/proc")
		if err != nil {
			b.Fatal(err)
		}
		if len(got) != services {
			b.Fatalf("read %d virtual servers, want %d", len(got), services)
		}
	}
}
