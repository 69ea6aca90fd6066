package ipvs

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	cfipvs "github.com/cloudflare/ipvs"
)

// fakeClient answers as cloudflare/ipvs's client does: an empty dump is os.ErrNotExist.
type fakeClient struct {
	services []cfipvs.ServiceExtended
	dests    map[netip.Addr][]cfipvs.DestinationExtended // by the service's address
	err      error
}

func (f *fakeClient) Services() ([]cfipvs.ServiceExtended, error) {
	if f.err != nil {
		return nil, f.err
	}
	if len(f.services) == 0 {
		return nil, os.ErrNotExist
	}
	return f.services, nil
}

func (f *fakeClient) Destinations(s cfipvs.Service) ([]cfipvs.DestinationExtended, error) {
	d := f.dests[s.Address]
	if len(d) == 0 {
		return nil, os.ErrNotExist
	}
	return d, nil
}

func svc(addr string, port uint16, proto cfipvs.Protocol, flags cfipvs.Flags) cfipvs.ServiceExtended {
	return cfipvs.ServiceExtended{Service: cfipvs.Service{Address: netip.MustParseAddr(addr), Port: port, Protocol: proto, Flags: flags, Timeout: 10800, Scheduler: "rr"}}
}

func dest(addr string, port uint16, weight, active, inactive uint32) cfipvs.DestinationExtended {
	return cfipvs.DestinationExtended{
		Destination:       cfipvs.Destination{Address: netip.MustParseAddr(addr), Port: port, Weight: weight},
		ActiveConnections: active, InactiveConnections: inactive,
	}
}

func TestReadFrom(t *testing.T) {
	c := &fakeClient{
		services: []cfipvs.ServiceExtended{
			svc("10.96.0.10", 53, cfipvs.UDP, 0),
			svc("10.96.0.1", 443, cfipvs.TCP, cfipvs.ServicePersistent|cfipvs.ServiceHashed),
			{Service: cfipvs.Service{FWMark: 7, Protocol: cfipvs.TCP}}, // not kube-proxy's
		},
		dests: map[netip.Addr][]cfipvs.DestinationExtended{
			netip.MustParseAddr("10.96.0.10"): {dest("10.77.0.3", 53, 1, 0, 0), dest("10.77.0.2", 53, 0, 0, 4)},
		},
	}
	got, err := ReadFrom(c)
	if err != nil {
		t.Fatal(err)
	}
	want := []VirtualServer{
		{Key: Key{netip.MustParseAddr("10.96.0.1"), 443, "TCP"}, Scheduler: "rr", Persistent: true, Timeout: 10800, RealServers: []RealServer{}},
		{Key: Key{netip.MustParseAddr("10.96.0.10"), 53, "UDP"}, Scheduler: "rr", Timeout: 10800, RealServers: []RealServer{
			{Addr: netip.MustParseAddrPort("10.77.0.2:53"), Weight: 0, InactiveConns: 4},
			{Addr: netip.MustParseAddrPort("10.77.0.3:53"), Weight: 1},
		}},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d virtual servers, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.Key != w.Key || g.Persistent != w.Persistent || g.Timeout != w.Timeout || g.Scheduler != w.Scheduler || !slices.Equal(g.RealServers, w.RealServers) {
			t.Errorf("virtual server %d: got %+v, want %+v", i, g, w)
		}
	}
	if s := got[1].String(); s != "10.96.0.10:53/UDP" {
		t.Errorf("String() = %q", s)
	}
	if s := (Key{netip.MustParseAddr("fd00::a"), 53, "UDP"}).String(); s != "[fd00::a]:53/UDP" {
		t.Errorf("IPv6 String() = %q", s)
	}
}

func TestReadFromEmptyAndErrors(t *testing.T) {
	got, err := ReadFrom(&fakeClient{})
	if err != nil || len(got) != 0 {
		t.Fatalf("an empty dump: got %v, %v; want nothing and no error", got, err)
	}
	_, err = ReadFrom(&fakeClient{err: syscall.EPERM})
	if !errors.Is(err, syscall.EPERM) || !strings.Contains(err.Error(), "CAP_NET_ADMIN") {
		t.Errorf("EPERM: got %v, want it wrapped with what it needs", err)
	}
}

func TestReadWithoutIPVS(t *testing.T) {
	proc := t.TempDir()
	if err := os.MkdirAll(filepath.Join(proc, "net"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(proc); !errors.Is(err, ErrNotLoaded) {
		t.Errorf("Read without net/ip_vs: got %v, want ErrNotLoaded", err)
	}
}

func TestTableDraining(t *testing.T) {
	vsKey := Key{netip.MustParseAddr("10.96.0.20"), 80, "TCP"}
	udpKey := Key{netip.MustParseAddr("10.96.0.10"), 53, "UDP"}
	read := func(tcp, udp []RealServer) []VirtualServer {
		return []VirtualServer{{Key: udpKey, RealServers: udp}, {Key: vsKey, RealServers: tcp}}
	}
	rs := func(ep string, weight, active, inactive uint32) RealServer {
		return RealServer{Addr: netip.MustParseAddrPort(ep), Weight: weight, ActiveConns: active, InactiveConns: inactive}
	}
	t0 := time.Unix(1_800_000_000, 0)
	serving := func(tb *Table, k Key) []string {
		var out []string
		for _, ep := range tb.Serving(k) {
			out = append(out, ep.String())
		}
		return out
	}
	// A removed TCP endpoint with connections drains; its connections end; kube-proxy would
	// delete it at its next try, at most a minute later: only after that does it serve as kube-proxy
	// left it (and so count as stale where the API does not have it).
	tb1 := NewTable(nil, read(
		[]RealServer{rs("10.77.0.1:80", 1, 0, 0), rs("10.77.0.2:80", 0, 3, 1)},
		[]RealServer{rs("10.77.0.5:53", 0, 0, 2)}), nil, t0)
	if got := serving(tb1, vsKey); !slices.Equal(got, []string{"10.77.0.1:80"}) {
		t.Errorf("draining: serving %v", got)
	}
	if !tb1.Draining(tb1.Server(vsKey), tb1.Server(vsKey).RealServers[1]) {
		t.Error("a weight-0 TCP real server with connections is not draining")
	}
	if got := serving(tb1, udpKey); len(got) != 0 {
		t.Errorf("a UDP real server at weight 0, first seen: serving %v", got)
	}
	tb2 := NewTable(tb1, read(
		[]RealServer{rs("10.77.0.1:80", 1, 0, 0), rs("10.77.0.2:80", 0, 0, 0)},
		[]RealServer{rs("10.77.0.5:53", 0, 0, 2)}), nil, t0.Add(5*time.Minute))
	if got := serving(tb2, vsKey); !slices.Equal(got, []string{"10.77.0.1:80"}) {
		t.Errorf("connections just ended: serving %v", got)
	}
	// UDP is deleted at once by kube-proxy: a minute after it was first seen at weight 0 it has
	// outlived that, connections or not.
	if got := serving(tb2, udpKey); !slices.Equal(got, []string{"10.77.0.5:53"}) {
		t.Errorf("a UDP real server at weight 0 for 5 minutes: serving %v", got)
	}
	tb3 := NewTable(tb2, read(
		[]RealServer{rs("10.77.0.1:80", 1, 0, 0), rs("10.77.0.2:80", 0, 0, 0)}, nil), nil, t0.Add(5*time.Minute+DeleteCheckInterval))
	if got := serving(tb3, vsKey); !slices.Equal(got, []string{"10.77.0.1:80", "10.77.0.2:80"}) {
		t.Errorf("idle at weight 0 for a minute: serving %v", got)
	}
	// A new connection resets it: kube-proxy would not delete it now.
	tb4 := NewTable(tb3, read([]RealServer{rs("10.77.0.2:80", 0, 1, 0)}, nil), nil, t0.Add(10*time.Minute))
	tb5 := NewTable(tb4, read([]RealServer{rs("10.77.0.2:80", 0, 0, 0)}, nil), nil, t0.Add(10*time.Minute+time.Second))
	if got := serving(tb5, vsKey); len(got) != 0 {
		t.Errorf("idle again just now: serving %v", got)
	}
}

func TestTableNodePorts(t *testing.T) {
	servers := []VirtualServer{
		{Key: Key{netip.MustParseAddr("10.96.0.30"), 30080, "TCP"}}, // a cluster IP whose port is a node port number
		{Key: Key{netip.MustParseAddr("192.168.1.5"), 30080, "TCP"}},
		{Key: Key{netip.MustParseAddr("192.168.1.5"), 30080, "UDP"}},
		{Key: Key{netip.MustParseAddr("fd00::5"), 30080, "TCP"}},
	}
	tb := NewTable(nil, servers, []netip.Addr{netip.MustParseAddr("10.96.0.30")}, time.Now())
	got := tb.NodePortServers(nil, 30080, "TCP", false)
	if len(got) != 1 || got[0].Addr != netip.MustParseAddr("192.168.1.5") {
		t.Errorf("IPv4 node port servers: %v", got)
	}
	if got := tb.NodePortServers(nil, 30080, "TCP", true); len(got) != 1 {
		t.Errorf("IPv6 node port servers: %v", got)
	}
	if tb.Server(Key{netip.MustParseAddr("10.96.0.30"), 30080, "TCP"}) == nil || tb.Len() != 4 {
		t.Error("a virtual server is not found by its key")
	}
}
