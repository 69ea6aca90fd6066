package conntrack

import "net/netip"

// trackedFlow is a DNAT'ed flow that has not been answered yet: what attributing it needs,
// and when it was first seen. The tracker holds up to --conntrack.max-tracked-flows of them,
// so it is kept small and free of pointers (addresses as byte arrays, not netip.Addr, whose
// zone handle is a pointer: a map whose entries hold no pointers is never scanned by the
// garbage collector). 24 bytes for an IPv4 flow, against 128 for the two tuples it replaces;
// an IPv6 flow's addresses are kept beside it (flowSet.ipv6). BENCHMARKS.md, "Conntrack event
// stream", has what it saves.
type trackedFlow struct {
	since int64 // unix nanoseconds when first seen unreplied
	// An IPv4 flow's original source (client), original destination (service: the address
	// the client used) and reply source (endpoint: the DNAT target).
	client, service, endpoint [4]byte
	servicePort               uint16
	proto                     uint8
	flags                     flowFlags
}

type flowFlags uint8

const (
	// flowIPv6: the addresses are in flowSet.ipv6.
	flowIPv6 flowFlags = 1 << iota
	// flowSilent: found in the table at start-up. With nf_conntrack_events=2 a flow created
	// while nobody listened never sends events, not even its end, so these are re-checked
	// against table dumps instead (checkSilent).
	flowSilent
	// flowMarked: shown by the table dump being read (flowTracker.resync).
	flowMarked
	// flowSilentSeen: a silent flow shown by the table dump being read (checkSilent).
	flowSilentSeen
)

func (f *trackedFlow) silent() bool { return f.flags&flowSilent != 0 }
func (f *trackedFlow) ipv6() bool   { return f.flags&flowIPv6 != 0 }
func (f *trackedFlow) marked() bool { return f.flags&flowMarked != 0 }

// ipv6Addrs are an IPv6 flow's client, service and endpoint addresses.
type ipv6Addrs struct{ client, service, endpoint [16]byte }

// flowSet is the followed flows by conntrack id.
type flowSet struct {
	flows map[uint32]trackedFlow
	ipv6  map[uint32]ipv6Addrs // the addresses of the IPv6 ones among flows
}

func newFlowSet() flowSet {
	return flowSet{flows: make(map[uint32]trackedFlow), ipv6: make(map[uint32]ipv6Addrs)}
}

func (s *flowSet) len() int { return len(s.flows) }

func (s *flowSet) get(id uint32) (trackedFlow, bool) {
	f, ok := s.flows[id]
	return f, ok
}

// add follows ev's flow from since.
func (s *flowSet) add(ev *flowEvent, since int64, silent bool) {
	f := trackedFlow{since: since, servicePort: ev.orig.dstPort, proto: ev.orig.proto}
	if silent {
		f.flags |= flowSilent
	}
	if ev.orig.dst.Is4() {
		f.client, f.service, f.endpoint = as4(ev.orig.src), as4(ev.orig.dst), as4(ev.reply.src)
	} else {
		f.flags |= flowIPv6
		s.ipv6[ev.id] = ipv6Addrs{ev.orig.src.As16(), ev.orig.dst.As16(), ev.reply.src.As16()}
	}
	s.flows[ev.id] = f
}

// as4 is a's 4 bytes; none (zeros) for an address missing from a malformed event, which
// netip.Addr.As4 would panic on.
func as4(a netip.Addr) [4]byte {
	if !a.Is4() {
		return [4]byte{}
	}
	return a.As4()
}

// mark sets the mark m (flowMarked or flowSilentSeen) on id's flow.
func (s *flowSet) mark(id uint32, m flowFlags) {
	if f, ok := s.flows[id]; ok {
		f.flags |= m
		s.flows[id] = f
	}
}

// clearMarks clears the mark m from every flow.
func (s *flowSet) clearMarks(m flowFlags) {
	for id, f := range s.flows {
		if f.flags&m != 0 {
			f.flags &^= m
			s.flows[id] = f
		}
	}
}

// deleteUnmarked stops following the flows not marked.
func (s *flowSet) deleteUnmarked() {
	for id, f := range s.flows {
		if !f.marked() {
			s.delete(id, &f)
		}
	}
}

// trim stops following flows until at most n are left, and returns how many it dropped.
func (s *flowSet) trim(n int) int {
	dropped := 0
	for id, f := range s.flows {
		if len(s.flows) <= n {
			break
		}
		s.delete(id, &f)
		dropped++
	}
	return dropped
}

func (s *flowSet) clearSilent(id uint32) {
	if f, ok := s.flows[id]; ok {
		f.flags &^= flowSilent
		s.flows[id] = f
	}
}

// delete stops following id's flow, f.
func (s *flowSet) delete(id uint32, f *trackedFlow) {
	delete(s.flows, id)
	if f.ipv6() {
		delete(s.ipv6, id)
	}
}

// tuples gives back the parts of id's flow's tuples (f) that attribution reads.
func (s *flowSet) tuples(id uint32, f *trackedFlow) (orig, reply tuple) {
	var client, service, endpoint netip.Addr
	if f.ipv6() {
		a := s.ipv6[id]
		client, service, endpoint = netip.AddrFrom16(a.client), netip.AddrFrom16(a.service), netip.AddrFrom16(a.endpoint)
	} else {
		client, service, endpoint = netip.AddrFrom4(f.client), netip.AddrFrom4(f.service), netip.AddrFrom4(f.endpoint)
	}
	orig = tuple{src: client, dst: service, dstPort: f.servicePort, proto: f.proto}
	reply = tuple{src: endpoint, proto: f.proto}
	return orig, reply
}
