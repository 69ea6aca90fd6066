// Package ipvs reads the node's IPVS virtual servers and their real servers in process, over
// generic netlink: what kube-proxy's IPVS mode programmed, for the drift check. No ipvsadm and
// no child process.
//
// It reads through github.com/cloudflare/ipvs (BSD-3) rather than github.com/moby/ipvs
// (Apache-2.0), kube-proxy's own client. Both speak the same genetlink family (IPVS) and return
// the same fields, weights and connection counts included. moby/ipvs's New runs `modprobe -va
// ip_vs` as a child process, loading the module on any node the exporter starts on, and logs
// through logrus, a logger of its own; kube-proxy notes that it reports a
// kernel without IPVS as an empty list (moby/ipvs#27), which here would read as "kube-proxy
// programmed nothing". cloudflare/ipvs runs nothing, is built on mdlayher/netlink and
// genetlink, which proxyhealth already uses for nf_tables, and fails when the family is
// missing. It answers an empty dump with os.ErrNotExist; ReadFrom turns that into no virtual
// servers.
//
// Asking the kernel for the IPVS genetlink family when ip_vs is not loaded makes it load the
// module: Read looks for /proc/net/ip_vs first, so that reading never changes the node.
package ipvs

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"

	cfipvs "github.com/cloudflare/ipvs"
)

// ErrNotLoaded is returned when the kernel has no IPVS: the ip_vs module is not loaded.
var ErrNotLoaded = errors.New("the kernel has no IPVS (ip_vs is not loaded)")

// Key identifies a virtual server as kube-proxy does: address, port and protocol.
type Key struct {
	Addr     netip.Addr
	Port     uint16
	Protocol string // "TCP", "UDP" or "SCTP", as in the Kubernetes API
}

// String is kube-proxy's VirtualServer.String(): "10.96.0.10:53/UDP".
func (k Key) String() string {
	return net.JoinHostPort(k.Addr.String(), strconv.Itoa(int(k.Port))) + "/" + k.Protocol
}

// VirtualServer is one IPVS virtual service and its real servers.
type VirtualServer struct {
	Key
	Scheduler string
	// Persistent is set for ClientIP session affinity, with Timeout its seconds.
	Persistent bool
	Timeout    uint32
	// RealServers are sorted by address.
	RealServers []RealServer
}

// RealServer is one destination of a virtual server.
type RealServer struct {
	Addr   netip.AddrPort
	Weight uint32
	// ActiveConns and InactiveConns are IPVS's connection counts: kube-proxy keeps a removed
	// TCP real server at weight 0 until both are 0.
	ActiveConns, InactiveConns uint32
}

// Client is what Read asks of an IPVS connection (cloudflare/ipvs's Client; fakes in tests).
type Client interface {
	Services() ([]cfipvs.ServiceExtended, error)
	Destinations(cfipvs.Service) ([]cfipvs.DestinationExtended, error)
}

// Loaded reports whether the kernel has IPVS, from procPath's net/ip_vs (the reading process's
// network namespace), without loading it.
func Loaded(procPath string) (bool, error) {
	_, err := os.Stat(filepath.Join(procPath, "net", "ip_vs"))
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	}
	return false, fmt.Errorf("look for IPVS: %w", err)
}

// Read dumps this network namespace's virtual servers with their real servers, sorted by
// Key. It fails with ErrNotLoaded when the kernel has no IPVS, and says when the process lacks
// CAP_NET_ADMIN.
func Read(procPath string) (servers []VirtualServer, err error) {
	loaded, err := Loaded(procPath)
	if err != nil {
		return nil, err
	}
	if !loaded {
		return nil, ErrNotLoaded
	}
	c, err := cfipvs.New()
	if err != nil {
		return nil, fmt.Errorf("open IPVS netlink: %w", explain(err))
	}
	if cl, ok := c.(io.Closer); ok {
		defer cl.Close()
	}
	defer func() {
		// cloudflare/ipvs decodes the kernel's attributes by slicing them: a reply it does
		// not expect must fail this read, not the exporter.
		if r := recover(); r != nil {
			servers, err = nil, fmt.Errorf("decode IPVS's netlink reply: %v", r)
		}
	}()
	return ReadFrom(c)
}

// ReadFrom is Read through c.
func ReadFrom(c Client) ([]VirtualServer, error) {
	svcs, err := c.Services()
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil // an empty dump
	}
	if err != nil {
		return nil, fmt.Errorf("list IPVS virtual servers: %w", explain(err))
	}
	out := make([]VirtualServer, 0, len(svcs))
	for _, s := range svcs {
		if s.FWMark != 0 || !s.Address.IsValid() {
			continue // firewall-mark services: not kube-proxy's
		}
		vs := VirtualServer{
			Key:        Key{Addr: s.Address.Unmap(), Port: s.Port, Protocol: protocolName(s.Protocol)},
			Scheduler:  s.Scheduler,
			Persistent: s.Flags&cfipvs.ServicePersistent != 0,
			Timeout:    s.Timeout,
		}
		// An empty dump (os.ErrNotExist) is a virtual server without real servers, or one
		// removed since the first dump: the next read tells.
		dests, err := c.Destinations(s.Service)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("list the real servers of IPVS virtual server %s: %w", vs.Key, explain(err))
		}
		vs.RealServers = make([]RealServer, 0, len(dests))
		for _, d := range dests {
			vs.RealServers = append(vs.RealServers, RealServer{
				Addr:          netip.AddrPortFrom(d.Address.Unmap(), d.Port),
				Weight:        d.Weight,
				ActiveConns:   d.ActiveConnections,
				InactiveConns: d.InactiveConnections,
			})
		}
		slices.SortFunc(vs.RealServers, func(a, b RealServer) int { return a.Addr.Compare(b.Addr) })
		out = append(out, vs)
	}
	slices.SortFunc(out, func(a, b VirtualServer) int { return a.Key.Compare(b.Key) })
	return out, nil
}

// Compare orders keys by address, port, then protocol.
func (k Key) Compare(o Key) int {
	if c := k.Addr.Compare(o.Addr); c != 0 {
		return c
	}
	if k.Port != o.Port {
		if k.Port < o.Port {
			return -1
		}
		return 1
	}
	switch {
	case k.Protocol < o.Protocol:
		return -1
	case k.Protocol > o.Protocol:
		return 1
	}
	return 0
}

func protocolName(p cfipvs.Protocol) string {
	switch p {
	case cfipvs.TCP:
		return "TCP"
	case cfipvs.UDP:
		return "UDP"
	case cfipvs.SCTP:
		return "SCTP"
	}
	return strconv.Itoa(int(p))
}

// explain adds what an error from the kernel means here.
func explain(err error) error {
	switch {
	case errors.Is(err, syscall.EPERM), errors.Is(err, syscall.EACCES):
		return fmt.Errorf("%w (reading IPVS needs CAP_NET_ADMIN)", err)
	case errors.Is(err, syscall.ENOENT), errors.Is(err, os.ErrNotExist):
		// The genetlink family is missing: ip_vs went away since Loaded.
		return fmt.Errorf("%w: %w", ErrNotLoaded, err)
	}
	return err
}
