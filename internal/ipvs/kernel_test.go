package ipvs

import (
	"bufio"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	cfipvs "github.com/cloudflare/ipvs"
	"github.com/cloudflare/ipvs/netmask"
	"golang.org/x/sys/unix"

	"github.com/proxyhealth/proxyhealth/internal/nftnl/nftnltest"
	"github.com/proxyhealth/proxyhealth/internal/testsupport/prereq"
)

func TestMain(m *testing.M) {
	nftnltest.ReexecInNetns()
	os.Exit(m.Run())
}

// requireIPVS skips unless the test runs in a network namespace of its own with IPVS loaded.
// A kernel built without IPVS at all (no ip_vs module, not built in: this development
// machine's) cannot run it whatever is installed, so it skips even under CI: the kernel matrix
// (test/vm) runs it on the kernels users' nodes run, with ip_vs loaded. A kernel that has the
// module but not loaded is a missing prerequisite.
func requireIPVS(t testing.TB) {
	t.Helper()
	if !nftnltest.InNetns() {
		prereq.Skip(t, "needs root and unshare(1) to run in a network namespace of its own")
	}
	loaded, err := Loaded("/proc")
	if err != nil {
		t.Fatal(err)
	}
	if loaded {
		loopbackUp(t)
		return
	}
	if !kernelHasIPVS(t) {
		t.Skip("this kernel has no IPVS (no ip_vs module, not built in); the kernel matrix runs this test")
	}
	prereq.Skip(t, "needs the ip_vs module loaded (modprobe ip_vs)")
}

// loopbackUp brings the namespace's loopback up: until it is, the namespace has no local routing
// table, and IPVS refuses an IPv4 real server whose address type it cannot tell (EINVAL).
func loopbackUp(t testing.TB) {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		t.Fatalf("lo's flags: %v", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		t.Fatalf("bring lo up: %v", err)
	}
}

// kernelHasIPVS reports whether the running kernel's module lists name ip_vs.
func kernelHasIPVS(t testing.TB) bool {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join("/lib/modules", unix.ByteSliceToString(u.Release[:]))
	for _, list := range []string{"modules.dep", "modules.builtin"} {
		f, err := os.Open(filepath.Join(dir, list))
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "/ip_vs.ko") {
				f.Close()
				return true
			}
		}
		f.Close()
	}
	return false
}

// Virtual servers created through the kernel, as kube-proxy creates them, read back as they
// were made: addresses of both families, persistence, weights; and gone once deleted.
func TestKernelReadIPVS(t *testing.T) {
	requireIPVS(t)
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

	got, err := Read("/proc")
	if err != nil {
		t.Fatal(err)
	}
	rs := func(ep string, weight uint32) RealServer {
		return RealServer{Addr: netip.MustParseAddrPort(ep), Weight: weight}
	}
	want := []VirtualServer{
		{Key: Key{netip.MustParseAddr("10.96.0.1"), 443, "TCP"}, Scheduler: "rr", Persistent: true, Timeout: 10800,
			RealServers: []RealServer{rs("192.168.1.10:6443", 1)}},
		{Key: Key{netip.MustParseAddr("10.96.0.10"), 53, "UDP"}, Scheduler: "rr",
			RealServers: []RealServer{rs("10.244.1.5:53", 1), rs("10.244.2.6:53", 1), rs("10.244.3.7:53", 0)}},
		{Key: Key{netip.MustParseAddr("10.96.0.99"), 8080, "SCTP"}, Scheduler: "rr", RealServers: []RealServer{}},
		{Key: Key{netip.MustParseAddr("fd00:96::80"), 80, "TCP"}, Scheduler: "rr",
			RealServers: []RealServer{rs("[fd00:244::5]:8080", 1)}},
	}
	if !slices.EqualFunc(got, want, sameServer) {
		t.Errorf("read back\n%+v\nwant\n%+v", got, want)
	}

	if err := c.RemoveService(dns); err != nil {
		t.Fatal(err)
	}
	got, err = Read("/proc")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || slices.ContainsFunc(got, func(v VirtualServer) bool { return v.Port == 53 }) {
		t.Errorf("after deleting the DNS virtual server: %+v", got)
	}
	for _, s := range []cfipvs.Service{api, web6, empty} {
		if err := c.RemoveService(s); err != nil {
			t.Fatal(err)
		}
	}
	if got, err = Read("/proc"); err != nil || len(got) != 0 {
		t.Errorf("after deleting every virtual server: %+v, %v; want none and no error", got, err)
	}
}

func sameServer(a, b VirtualServer) bool {
	return a.Key == b.Key && a.Scheduler == b.Scheduler && a.Persistent == b.Persistent && a.Timeout == b.Timeout &&
		slices.Equal(a.RealServers, b.RealServers)
}

// BenchmarkKernelRead measures a dump of 10,000 virtual servers x 10 real servers (200 x 10
// with -test.short), created first in the test's network namespace, as kube-proxy's IPVS mode
// programs 10,000 ClusterIP Service ports. It needs ip_vs: in the kernel matrix's guest.
func BenchmarkKernelRead(b *testing.B) {
	requireIPVS(b)
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
		got, err := Read("/proc")
		if err != nil {
			b.Fatal(err)
		}
		if len(got) != services {
			b.Fatalf("read %d virtual servers, want %d", len(got), services)
		}
	}
}
