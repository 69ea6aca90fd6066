package conntrack

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// localNet is this node's view of where pods live, used to name the reason of an unreplied
// flow: bridges' subnets (a CNI bridge such as cni0 or cbr0), host routes without a gateway
// (one per pod, as Calico or the ptp plugin write them) and the node's own addresses
// (hostNetwork endpoints).
type localNet struct {
	bridges []netip.Prefix
	local   []netip.Prefix
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

// interfaceAddrs lists an interface's addresses; a variable so tests can give fixture ones.
type interfaceAddrs func(name string) ([]netip.Prefix, error)

func systemInterfaceAddrs(name string) ([]netip.Prefix, error) {
	ifi, err := net.InterfaceByName(name)
	if err != nil {
		return nil, err
	}
	addrs, err := ifi.Addrs()
	if err != nil {
		return nil, err
	}
	var out []netip.Prefix
	for _, a := range addrs {
		ipnet, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		ip, ok := netip.AddrFromSlice(ipnet.IP)
		if !ok {
			continue
		}
		ones, _ := ipnet.Mask.Size()
		out = append(out, netip.PrefixFrom(ip.Unmap(), ones))
	}
	return out, nil
}

// loadLocalNet reads bridges from sysfs, host routes from procfs and all interface addresses.
func loadLocalNet(procPath, sysPath string, addrsOf interfaceAddrs) (*localNet, error) {
	n := &localNet{}
	ifaces, err := os.ReadDir(filepath.Join(sysPath, "class", "net"))
	if err != nil {
		return nil, fmt.Errorf("list network interfaces: %w", err)
	}
	for _, ifc := range ifaces {
		name := ifc.Name()
		addrs, err := addrsOf(name)
		if err != nil {
			continue // the interface went away between the listing and now
		}
		_, statErr := os.Stat(filepath.Join(sysPath, "class", "net", name, "bridge"))
		isBridge := statErr == nil
		for _, a := range addrs {
			if a.Addr().IsLoopback() || a.Addr().IsLinkLocalUnicast() {
				continue
			}
			n.local = append(n.local, netip.PrefixFrom(a.Addr(), a.Addr().BitLen()))
			if isBridge {
				n.bridges = append(n.bridges, a.Masked())
				n.local = append(n.local, a.Masked())
			}
		}
	}
	for _, file := range []struct {
		name  string
		parse func(io.Reader) ([]netip.Prefix, error)
	}{{"route", parseIPv4HostRoutes}, {"ipv6_route", parseIPv6HostRoutes}} {
		f, err := os.Open(filepath.Join(procPath, "net", file.name))
		if errors.Is(err, fs.ErrNotExist) {
			continue // no IPv6 on this node
		}
		if err != nil {
			return nil, fmt.Errorf("read routes: %w", err)
		}
		routes, err := file.parse(f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("parse %s: %w", f.Name(), err)
		}
		n.local = append(n.local, routes...)
	}
	return n, nil
}

// parseIPv4HostRoutes returns the /32 routes without a gateway from /proc/net/route, except on
// loopback: each names a pod on this node in CNIs that route per pod.
func parseIPv4HostRoutes(r io.Reader) ([]netip.Prefix, error) {
	var out []netip.Prefix
	sc := bufio.NewScanner(r)
	first := true
	for sc.Scan() {
		if first { // header
			first = false
			continue
		}
		f := strings.Fields(sc.Text())
		if len(f) < 8 {
			return nil, fmt.Errorf("route line %q: want at least 8 fields", sc.Text())
		}
		if f[0] == "lo" || f[2] != "00000000" || f[7] != "FFFFFFFF" {
			continue
		}
		v, err := strconv.ParseUint(f[1], 16, 32)
		if err != nil {
			return nil, fmt.Errorf("route destination %q: %w", f[1], err)
		}
		// The kernel prints the network-order address as a host-order u32, so the address
		// bytes are that number's bytes in this machine's order.
		var a [4]byte
		binary.NativeEndian.PutUint32(a[:], uint32(v))
		out = append(out, netip.PrefixFrom(netip.AddrFrom4(a), 32))
	}
	return out, sc.Err()
}

// parseIPv6HostRoutes returns the /128 routes without a gateway from /proc/net/ipv6_route.
func parseIPv6HostRoutes(r io.Reader) ([]netip.Prefix, error) {
	var out []netip.Prefix
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 10 {
			return nil, fmt.Errorf("ipv6 route line %q: want 10 fields", sc.Text())
		}
		plen, err := strconv.ParseUint(f[1], 16, 8)
		if err != nil {
			return nil, fmt.Errorf("ipv6 route prefix length %q: %w", f[1], err)
		}
		if f[9] == "lo" || plen != 128 || f[4] != strings.Repeat("0", 32) {
			continue
		}
		dst, err := hex.DecodeString(f[0])
		if err != nil || len(dst) != 16 {
			return nil, fmt.Errorf("ipv6 route destination %q: not 32 hex digits", f[0])
		}
		a := netip.AddrFrom16([16]byte(dst))
		if a.IsMulticast() || a.IsLinkLocalUnicast() {
			continue
		}
		out = append(out, netip.PrefixFrom(a, 128))
	}
	return out, sc.Err()
}
