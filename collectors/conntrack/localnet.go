package conntrack

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// localNet is this node's view of where pods live, used to name the reason of an unreplied
// flow: bridges' subnets (a CNI bridge such as cni0 or cbr0), host routes without a gateway
// (one per pod, as Calico or the ptp plugin write them) and the node's own addresses
// (hostNetwork endpoints). It is read over rtnetlink, which always answers for the process's
// own network namespace (sysfs answers for the namespace it was mounted in).
type localNet struct {
	bridges []netip.Prefix
	local   []netip.Prefix
	// addrs are the addresses of this node's interfaces, every one (kube-ipvs0 may hold
	// thousands): those a node port is open on.
	addrs map[netip.Addr]struct{}
}

// isNodeAddr reports whether a is one of this node's addresses, as kube-proxy's node port
// rules match them (`fib daddr type local` in nftables mode, `-m addrtype --dst-type LOCAL`
// in iptables mode); loopback included, which iptables mode serves for IPv4.
func (n *localNet) isNodeAddr(a netip.Addr) bool {
	if a.IsLoopback() {
		return true
	}
	_, ok := n.addrs[a]
	return ok
}

// classify returns the reason for an unreplied flow from client to endpoint.
func (n *localNet) classify(client, endpoint netip.Addr) reason {
	for _, p := range n.bridges {
		if p.Contains(client) && p.Contains(endpoint) {
			return reasonSameBridge
		}
	}
	for _, p := range n.local {
		if p.Contains(endpoint) {
			return reasonLocalEndpoint
		}
	}
	return reasonRemoteEndpoint
}

// iface is what localNet needs of one network interface.
type iface struct {
	name     string
	bridge   bool
	loopback bool
	addrs    []netip.Prefix
}

// route is what localNet needs of one main-table route.
type route struct {
	dst     netip.Prefix
	gateway bool
	iface   string
}

func newLocalNet(ifaces []iface, routes []route) *localNet {
	n := &localNet{}
	loopback := map[string]bool{}
	for _, ifc := range ifaces {
		loopback[ifc.name] = ifc.loopback
		for _, a := range ifc.addrs {
			if n.addrs == nil {
				n.addrs = make(map[netip.Addr]struct{})
			}
			n.addrs[a.Addr().Unmap()] = struct{}{}
			if a.Addr().IsLoopback() || a.Addr().IsLinkLocalUnicast() {
				continue
			}
			n.local = append(n.local, netip.PrefixFrom(a.Addr(), a.Addr().BitLen()))
			if ifc.bridge {
				n.bridges = append(n.bridges, a.Masked())
				n.local = append(n.local, a.Masked())
			}
		}
	}
	for _, r := range routes {
		if r.gateway || loopback[r.iface] || !r.dst.IsSingleIP() || r.dst.Addr().IsMulticast() || r.dst.Addr().IsLinkLocalUnicast() {
			continue
		}
		n.local = append(n.local, r.dst)
	}
	return n
}

// loadLocalNet reads interfaces, their addresses and the main routing table.
func loadLocalNet() (*localNet, error) {
	links, err := netlink.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list network interfaces: %w", err)
	}
	names := make(map[int]string, len(links))
	ifaces := make([]iface, 0, len(links))
	for _, l := range links {
		attrs := l.Attrs()
		names[attrs.Index] = attrs.Name
		ifc := iface{name: attrs.Name, bridge: l.Type() == "bridge", loopback: attrs.Flags&net.FlagLoopback != 0}
		addrs, err := netlink.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			continue // the interface went away since the listing
		}
		for _, a := range addrs {
			if p, ok := prefixOf(a.IPNet); ok {
				ifc.addrs = append(ifc.addrs, p)
			}
		}
		ifaces = append(ifaces, ifc)
	}
	rs, err := netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("list routes: %w", err)
	}
	routes := make([]route, 0, len(rs))
	for _, r := range rs {
		dst, ok := prefixOf(r.Dst)
		if !ok {
			continue // the default route
		}
		routes = append(routes, route{dst: dst, gateway: r.Gw != nil || len(r.MultiPath) > 0, iface: names[r.LinkIndex]})
	}
	return newLocalNet(ifaces, routes), nil
}

func prefixOf(n *net.IPNet) (netip.Prefix, bool) {
	if n == nil {
		return netip.Prefix{}, false
	}
	ip, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(ip.Unmap(), ones), true
}
