package hostrules

import (
	"net"
	"net/netip"
	"testing"

	cfipvs "github.com/cloudflare/ipvs"
	"github.com/cloudflare/ipvs/netmask"
	"github.com/vishvananda/netlink"

	"github.com/proxyhealth/proxyhealth/internal/ipvs"
	"github.com/proxyhealth/proxyhealth/internal/ipvs/ipvstest"
	"github.com/proxyhealth/proxyhealth/internal/testsupport/prereq"
)

// kube-proxy's IPVS mode as it leaves the node: a dummy kube-ipvs0 holding a cluster IP, a
// virtual server on it and one on a node address at a node port. The Source finds the mode by
// the interface, reads the virtual servers and tells the node port's from the cluster IP's by
// the addresses bound to kube-ipvs0.
func TestSourceIPVSMode(t *testing.T) {
	ipvstest.Require(t)
	dummy := &netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: kubeIPVSInterface}}
	if err := netlink.LinkAdd(dummy); err != nil {
		prereq.Skipf(t, "create the dummy interface %s (the dummy module): %v", kubeIPVSInterface, err)
	}
	t.Cleanup(func() { _ = netlink.LinkDel(dummy) })
	clusterIP := netip.MustParseAddr("10.96.0.10")
	if err := netlink.AddrAdd(dummy, &netlink.Addr{IPNet: &net.IPNet{IP: clusterIP.AsSlice(), Mask: net.CIDRMask(32, 32)}}); err != nil {
		t.Fatal(err)
	}
	c, err := cfipvs.New()
	if err != nil {
		t.Fatal(err)
	}
	dest := cfipvs.Destination{Address: netip.MustParseAddr("10.244.1.5"), Port: 53, Weight: 1, Family: cfipvs.INET}
	for _, svc := range []cfipvs.Service{
		{Address: clusterIP, Port: 53, Protocol: cfipvs.UDP, Family: cfipvs.INET, Scheduler: "rr", Netmask: netmask.MaskFrom(32, 32)},
		{Address: netip.MustParseAddr("192.168.1.5"), Port: 30053, Protocol: cfipvs.UDP, Family: cfipvs.INET, Scheduler: "rr", Netmask: netmask.MaskFrom(32, 32)},
	} {
		if err := c.CreateService(svc); err != nil {
			t.Fatalf("create %v: %v", svc.Address, err)
		}
		t.Cleanup(func() { _ = c.RemoveService(svc) })
		if err := c.CreateDestination(svc, dest); err != nil {
			t.Fatalf("create a real server of %v: %v", svc.Address, err)
		}
	}

	s, sub := startSource(t, Config{})
	st := waitState(t, s, sub, "IPVS mode", func(st *State) bool { return st.Mode == ModeIPVS })
	if st.Backend != BackendIPVS || st.ProxyErr != nil || st.IPVS.Len() != 2 {
		t.Fatalf("state: backend %q error %v, %d virtual servers", st.Backend, st.ProxyErr, st.IPVS.Len())
	}
	if _, ok := st.IPVS.Bound[clusterIP]; !ok {
		t.Errorf("addresses bound to %s: %v, want the cluster IP", kubeIPVSInterface, st.IPVS.Bound)
	}
	nodePorts := st.IPVS.NodePortServers(nil, 30053, "UDP", false)
	if len(nodePorts) != 1 || nodePorts[0].Addr != netip.MustParseAddr("192.168.1.5") {
		t.Errorf("node port virtual servers %v, want the one on 192.168.1.5", nodePorts)
	}
	if got := st.IPVS.Serving(ipvs.Key{Addr: clusterIP, Port: 53, Protocol: "UDP"}); len(got) != 1 || got[0] != netip.MustParseAddrPort("10.244.1.5:53") {
		t.Errorf("the cluster IP's real servers: %v", got)
	}
}
