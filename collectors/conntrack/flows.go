package conntrack

import (
	"iter"
	"net/netip"
	"sort"
	"strconv"
	"sync"
	"time"
)

// Service is the Kubernetes Service port a flow was sent to. Port is the Service's port
// number (the ClusterIP port), which is what docs/design.md's service_port label means.
type Service struct {
	Namespace, Name string
	Port            uint16
}

// ServiceMap resolves a destination the client used (a ClusterIP or other Service address, its
// port and IP protocol number) to a Service.
type ServiceMap interface {
	Lookup(addr netip.Addr, port uint16, proto uint8) (Service, bool)
	// LookupNodePort resolves a node port (its number and IP protocol number) of the IP
	// family of addr; the caller has checked that addr is one of this node's addresses.
	LookupNodePort(addr netip.Addr, port uint16, proto uint8) (Service, bool)
	// Len is the number of Service ports known.
	Len() int
	// Services yields each entry's Service (a Service once per key it is known by).
	Services() iter.Seq[Service]
}

// reason says where an unreplied flow's DNAT target was, which names the likely cause.
type reason uint8

const (
	reasonNoService      reason = iota // the destination is no known Service
	reasonSameBridge                   // client and endpoint on one local bridge: incident 1
	reasonLocalEndpoint                // endpoint on this node, not on the client's bridge
	reasonRemoteEndpoint               // endpoint elsewhere
)

var reasonNames = [...]string{"no_service", "same_bridge", "local_endpoint", "remote_endpoint"}

func (r reason) String() string { return reasonNames[r] }

func protocolName(p uint8) string {
	switch p {
	case 6:
		return "tcp"
	case 17:
		return "udp"
	case 132:
		return "sctp"
	}
	return strconv.Itoa(int(p))
}

// seriesKey is one label set of the per-service unreplied series.
type seriesKey struct {
	svc    Service
	proto  uint8
	reason reason
}

// overflowKey is the bounded label set for flows left out of the per-service series by the cap.
type overflowKey struct {
	proto  uint8
	reason reason
}

// attribution names a flow's Service and the reason class of its endpoint.
type attribution interface {
	attribute(orig, reply *tuple) seriesKey
}

// flowTracker follows DNAT'ed flows from their first event until a reply or their end, counts
// those that end unreplied, and knows which are open and unreplied right now. Its memory is
// bounded by maxTracked flows and maxSeries label sets whatever the flow rate.
type flowTracker struct {
	maxTracked int
	maxSeries  int

	mu        sync.Mutex
	flows     flowSet
	silent    int // how many of flows are silent
	untracked uint64
	unreplied map[seriesKey]*prunedSeries
	unlisted  map[overflowKey]uint64
	lastPass  time.Time // the last pass of prune
}

func newFlowTracker(maxTracked, maxSeries int) *flowTracker {
	return &flowTracker{
		maxTracked: maxTracked,
		maxSeries:  maxSeries,
		flows:      newFlowSet(),
		unreplied:  make(map[seriesKey]*prunedSeries),
		unlisted:   make(map[overflowKey]uint64),
	}
}

// handle applies one event. now is unix nanoseconds.
func (t *flowTracker) handle(ev *flowEvent, now int64, attr attribution) {
	switch ev.typ {
	case eventNew, eventUpdate:
		if ev.seenReply() {
			// Answered: only a tracked flow needs work, and the map lookup is cheaper than
			// the DNAT test for the common case of an untracked flow.
			t.mu.Lock()
			t.deleteLocked(ev.id)
			t.mu.Unlock()
			return
		}
		if !ev.dnat() {
			return
		}
		t.mu.Lock()
		if f, ok := t.flows.get(ev.id); ok {
			if f.silent() { // it does send events after all
				t.flows.clearSilent(ev.id)
				t.silent--
			}
		} else {
			if t.flows.len() < t.maxTracked {
				t.flows.add(ev, now, false)
			} else if ev.typ == eventNew {
				t.untracked++
			}
		}
		t.mu.Unlock()
	case eventDestroy:
		t.mu.Lock()
		tracked, wasTracked := t.flows.get(ev.id)
		if wasTracked && !ev.hasStatus {
			ev.orig, ev.reply = t.flows.tuples(ev.id, &tracked)
		}
		t.deleteLocked(ev.id)
		var unreplied bool
		switch {
		case ev.hasStatus:
			unreplied = !ev.seenReply() && ev.dnat()
		case wasTracked:
			// Without a status in the event the last state we saw decides.
			unreplied = true
		}
		if unreplied {
			t.countUnrepliedLocked(attr.attribute(&ev.orig, &ev.reply))
		}
		t.mu.Unlock()
	}
}

func (t *flowTracker) deleteLocked(id uint32) {
	if f, ok := t.flows.get(id); ok {
		if f.silent() {
			t.silent--
		}
		t.flows.delete(id, &f)
	}
}

func (t *flowTracker) countUnrepliedLocked(k seriesKey) {
	if s, listed := t.unreplied[k]; listed {
		s.count++
		return
	}
	if k.reason == reasonNoService || len(t.unreplied) < t.maxSeries {
		// no_service flows carry no service labels: one series per protocol, outside the cap.
		t.unreplied[k] = &prunedSeries{count: 1}
		return
	}
	t.unlisted[overflowKey{k.proto, k.reason}]++
}

// resync replaces the tracked set with the unreplied DNAT'ed flows of a table dump, keeping the
// first-seen time of flows already tracked. It is how tracking recovers after events were lost
// or a socket was replaced; a tracked flow missing from the table ended while we could not see
// it, and is dropped without being counted, since whether it was answered is unknown. Flows
// new to the tracker are marked silent when they may predate every listener (at start-up).
// The set is updated in place, marking the flows the dump shows and then dropping the others,
// rather than built anew beside the old one: after lost events most flows are known already,
// and two sets at the cap would double the tracker's memory at the moment it is largest. The
// lock is taken per entry, so that a scrape is not held up for the whole dump.
func (t *flowTracker) resync(dump func(fn func(*flowEvent)) error, now int64, newAreSilent bool) error {
	t.mu.Lock()
	t.flows.clearMarks(flowMarked)
	t.mu.Unlock()
	shown := 0 // flows of the dump followed
	err := dump(func(ev *flowEvent) {
		if ev.seenReply() || !ev.dnat() {
			return
		}
		t.mu.Lock()
		defer t.mu.Unlock()
		if f, ok := t.flows.get(ev.id); ok {
			if !f.marked() {
				t.flows.mark(ev.id, flowMarked)
				shown++
			}
			return
		}
		if shown >= t.maxTracked {
			t.untracked++
			return
		}
		t.flows.add(ev, now, newAreSilent)
		t.flows.mark(ev.id, flowMarked)
		shown++
	})
	if err != nil {
		// The flows the dump did not reach stay until the next re-read.
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.flows.deleteUnmarked()
	// Known flows the dump showed after the cap was reached with new ones.
	t.untracked += uint64(t.flows.trim(t.maxTracked))
	t.silent = 0
	for _, f := range t.flows.flows {
		if f.silent() {
			t.silent++
		}
	}
	return nil
}

// hasSilent reports whether any tracked flow needs checkSilent.
func (t *flowTracker) hasSilent() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.silent > 0
}

// checkSilent drops the silent flows that a table dump shows answered or gone. A gone one is
// not counted as unreplied: it may have been answered and closed since the last look. As
// resync, it marks what the dump shows (with a mark of its own: the two may run at once)
// instead of collecting the table's ids, which on a busy node would be a set of every
// unreplied flow every SilentCheckInterval.
func (t *flowTracker) checkSilent(dump func(fn func(*flowEvent)) error) error {
	t.mu.Lock()
	t.flows.clearMarks(flowSilentSeen)
	t.mu.Unlock()
	err := dump(func(ev *flowEvent) {
		if ev.seenReply() || !ev.dnat() {
			return
		}
		t.mu.Lock()
		if f, ok := t.flows.get(ev.id); ok && f.silent() {
			t.flows.mark(ev.id, flowSilentSeen)
		}
		t.mu.Unlock()
	})
	if err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for id, f := range t.flows.flows {
		if f.silent() && f.flags&flowSilentSeen == 0 {
			t.deleteLocked(id)
		}
	}
	return nil
}

// seriesCount is one series value for the exposition.
type seriesCount struct {
	key   seriesKey
	value uint64
}

type overflowCount struct {
	key   overflowKey
	value uint64
}

// prune drops the unreplied series of Services gone from the view for a while
// (pruneServiceSeries); a scrape runs it before it reads the snapshot. The open-flow gauge
// needs no pruning: it is grouped afresh from the flows tracked now at every snapshot.
func (t *flowTracker) prune(now time.Time, view *attributionView) {
	pruneServiceSeries(&t.mu, &t.lastPass, now, func() *attributionView { return view }, t.unreplied,
		func(k seriesKey) serviceName { return serviceName{k.svc.Namespace, k.svc.Name} })
}

// snapshot is what a scrape reads.
type snapshot struct {
	tracked      int
	untracked    uint64
	unreplied    []seriesCount
	unlisted     []overflowCount
	open         []seriesCount
	openUnlisted []overflowCount
}

// snapshot copies the counters and groups the flows unreplied since before openBefore (unix
// nanoseconds) by series, applying the same cap to the gauge: the largest groups are listed.
func (t *flowTracker) snapshot(openBefore int64, attr attribution) snapshot {
	t.mu.Lock()
	s := snapshot{tracked: t.flows.len(), untracked: t.untracked}
	for k, v := range t.unreplied {
		s.unreplied = append(s.unreplied, seriesCount{k, v.count})
	}
	for k, v := range t.unlisted {
		s.unlisted = append(s.unlisted, overflowCount{k, v})
	}
	open := make(map[seriesKey]uint64)
	for id, f := range t.flows.flows {
		if f.since <= openBefore {
			orig, reply := t.flows.tuples(id, &f)
			open[attr.attribute(&orig, &reply)]++
		}
	}
	t.mu.Unlock()

	for k, v := range open {
		s.open = append(s.open, seriesCount{k, v})
	}
	sort.Slice(s.open, func(i, j int) bool { return s.open[i].value > s.open[j].value })
	overflow := make(map[overflowKey]uint64)
	listed := s.open[:0]
	for _, c := range s.open {
		if c.key.reason != reasonNoService && len(listed) >= t.maxSeries {
			overflow[overflowKey{c.key.proto, c.key.reason}] += c.value
			continue
		}
		listed = append(listed, c)
	}
	s.open = listed
	for k, v := range overflow {
		s.openUnlisted = append(s.openUnlisted, overflowCount{k, v})
	}
	return s
}
