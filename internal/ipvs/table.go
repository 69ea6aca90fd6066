package ipvs

import (
	"net/netip"
	"time"
)

// DeleteCheckInterval is how often kube-proxy's graceful termination manager retries the real
// servers it keeps at weight 0 (pkg/proxy/ipvs/graceful_termination.go: rsCheckDeleteInterval,
// the same from v1.34 to v1.37): it deletes one once it has no connections left (TCP), or at
// once (UDP, SCTP).
const DeleteCheckInterval = time.Minute

// Table is one read of the node's virtual servers, indexed for the drift check. It is never
// modified once built.
type Table struct {
	// At is when the read was made.
	At time.Time
	// Servers are the virtual servers, sorted by Key.
	Servers []VirtualServer
	// Bound are the addresses on kube-proxy's kube-ipvs0 interface: cluster IPs, external IPs
	// and load-balancer IPs. A virtual server on any other address is a node port's.
	Bound map[netip.Addr]struct{}

	byKey map[Key]int
	// byPort finds the virtual servers of a port and protocol on addresses not in Bound: node
	// ports, on each node address.
	byPort map[portKey][]int
	// serving are, by index in Servers, the real servers that take traffic (Serving).
	serving [][]netip.AddrPort
	// idleSince is, per real server at weight 0 that kube-proxy would delete (removable), when
	// a read first found it so.
	idleSince map[rsKey]time.Time
}

type portKey struct {
	port     uint16
	protocol string
}

type rsKey struct {
	vs Key
	rs netip.AddrPort
}

// NewTable indexes servers read at at, with the addresses bound on kube-ipvs0. prev is the
// previous read (nil for none): a real server that kube-proxy would delete, found so in both,
// keeps the earlier time.
func NewTable(prev *Table, servers []VirtualServer, bound []netip.Addr, at time.Time) *Table {
	t := &Table{
		At:      at,
		Servers: servers,
		Bound:   make(map[netip.Addr]struct{}, len(bound)),
		byKey:   make(map[Key]int, len(servers)),
		byPort:  map[portKey][]int{},
	}
	for _, a := range bound {
		t.Bound[a.Unmap()] = struct{}{}
	}
	for i := range servers {
		vs := &servers[i]
		t.byKey[vs.Key] = i
		if _, ok := t.Bound[vs.Addr]; !ok {
			k := portKey{vs.Port, vs.Protocol}
			t.byPort[k] = append(t.byPort[k], i)
		}
		for _, rs := range vs.RealServers {
			if !removable(vs, rs) {
				continue
			}
			if t.idleSince == nil {
				t.idleSince = map[rsKey]time.Time{}
			}
			k := rsKey{vs.Key, rs.Addr}
			since := at
			if prev != nil {
				if s, ok := prev.idleSince[k]; ok {
					since = s
				}
			}
			t.idleSince[k] = since
		}
	}
	t.serving = make([][]netip.AddrPort, len(servers))
	for i := range servers {
		t.serving[i] = t.servingOf(&servers[i])
	}
	return t
}

// Len is the number of virtual servers; 0 for a nil Table.
func (t *Table) Len() int {
	if t == nil {
		return 0
	}
	return len(t.Servers)
}

// Server returns the virtual server of key k, nil when there is none.
func (t *Table) Server(k Key) *VirtualServer {
	i, ok := t.byKey[k]
	if !ok {
		return nil
	}
	return &t.Servers[i]
}

// NodePortServers appends to dst the virtual servers at port and protocol on addresses not bound
// to kube-ipvs0 (a node port's, one per node address) of the given family.
func (t *Table) NodePortServers(dst []*VirtualServer, port uint16, protocol string, ipv6 bool) []*VirtualServer {
	for _, i := range t.byPort[portKey{port, protocol}] {
		if vs := &t.Servers[i]; vs.Addr.Is6() == ipv6 {
			dst = append(dst, vs)
		}
	}
	return dst
}

// Serving returns the real servers of the virtual server of key k as kube-proxy left them, sorted;
// nil when there is no such virtual server (and an empty list for one without real servers).
// They are those of weight above 0, and those at weight 0 that kube-proxy would have deleted by
// the time of this read (a DeleteCheckInterval after a read first found it deletable: without
// connections, or of UDP or SCTP). A TCP real server at weight 0 that still has connections is
// draining: kube-proxy removed its endpoint and waits for them to end. It is left out, as is
// one whose connections ended less than DeleteCheckInterval ago. The caller must not modify
// the list.
func (t *Table) Serving(k Key) []netip.AddrPort {
	i, ok := t.byKey[k]
	if !ok {
		return nil
	}
	return t.serving[i]
}

func (t *Table) servingOf(vs *VirtualServer) []netip.AddrPort {
	out := make([]netip.AddrPort, 0, len(vs.RealServers))
	for _, rs := range vs.RealServers {
		if rs.Weight > 0 || t.lingering(vs, rs) {
			out = append(out, rs.Addr)
		}
	}
	return out
}

// Draining reports whether rs of vs is a real server kube-proxy keeps at weight 0 for now.
func (t *Table) Draining(vs *VirtualServer, rs RealServer) bool {
	return rs.Weight == 0 && !t.lingering(vs, rs)
}

// lingering reports whether rs, at weight 0, has outlived kube-proxy's graceful termination.
func (t *Table) lingering(vs *VirtualServer, rs RealServer) bool {
	if !removable(vs, rs) {
		return false
	}
	since, ok := t.idleSince[rsKey{vs.Key, rs.Addr}]
	return ok && t.At.Sub(since) >= DeleteCheckInterval
}

// removable is a real server at weight 0 that kube-proxy's graceful termination manager deletes
// at its next try: one without connections, or any of UDP or SCTP (deleteRsFunc).
func removable(vs *VirtualServer, rs RealServer) bool {
	return rs.Weight == 0 && (rs.ActiveConns+rs.InactiveConns == 0 || !gracefulTermination(vs.Protocol))
}

// gracefulTermination is kube-proxy's IsRsGracefulTerminationNeeded: TCP real servers drain,
// UDP and SCTP ones are deleted at once.
func gracefulTermination(protocol string) bool {
	return protocol != "UDP" && protocol != "SCTP"
}
