package conntrack

import (
	"cmp"
	"errors"
	"slices"
	"strings"
	"time"
)

// Stats are the kernel's conntrack table figures: its fill, and per-CPU counters summed
// (counters since boot).
type Stats struct {
	Entries, Limit                         uint64
	Invalid, InsertFailed, Drop, EarlyDrop uint64
}

// Stats reads the kernel's table statistics now: one netlink query, the same a scrape makes.
func (c *Collector) Stats() (Stats, error) {
	st, err := c.stats()
	if err != nil {
		return Stats{}, err
	}
	return Stats{
		Entries:      st.entries,
		Limit:        st.limit,
		Invalid:      st.cpu.invalid,
		InsertFailed: st.cpu.insertFailed,
		Drop:         st.cpu.drop,
		EarlyDrop:    st.cpu.earlyDrop,
	}, nil
}

// UnrepliedSeries is one service port's unreplied DNAT'ed flows of one reason, as the
// per-service series count them.
type UnrepliedSeries struct {
	Namespace, Name string // empty for reason no_service
	Port            uint16 // the Service's port number; 0 for no_service
	Protocol        string // tcp, udp, sctp
	Reason          string // same_bridge, local_endpoint, remote_endpoint, no_service
	// Ended counts the flows that ended without a reply since the exporter started; Open
	// those open and unreplied for longer than --conntrack.unreplied-after now.
	Ended, Open uint64
}

// Flows is what the event listener knows of Service flows now.
type Flows struct {
	// Err is why flows are not being followed (the listener is not running); nil while they
	// are.
	Err error
	// Unreplied are the per-service series (flows of ports beyond --conntrack.max-service-series
	// are not listed), sorted by service then reason.
	Unreplied []UnrepliedSeries
}

// ErrNotListening is Flows' error before the event listener has started.
var ErrNotListening = errors.New("the conntrack event listener has not started")

// Flows returns the listener's counts and the flows unreplied now, from the tracker's state:
// it waits on nothing but the tracker's lock.
func (c *Collector) Flows() Flows {
	c.mu.Lock()
	err := c.listenErr
	if err == nil && c.sock == nil {
		err = ErrNotListening
	}
	c.mu.Unlock()

	snap := c.tracker.snapshot(time.Now().Add(-c.cfg.UnrepliedAfter).UnixNano(), c.view.Load())
	byKey := make(map[seriesKey]*UnrepliedSeries, len(snap.unreplied)+len(snap.open))
	get := func(k seriesKey) *UnrepliedSeries {
		s := byKey[k]
		if s == nil {
			s = &UnrepliedSeries{Namespace: k.svc.Namespace, Name: k.svc.Name, Port: k.svc.Port,
				Protocol: protocolName(k.proto), Reason: k.reason.String()}
			byKey[k] = s
		}
		return s
	}
	for _, s := range snap.unreplied {
		get(s.key).Ended += s.value
	}
	for _, s := range snap.open {
		get(s.key).Open += s.value
	}
	out := Flows{Err: err, Unreplied: make([]UnrepliedSeries, 0, len(byKey))}
	for _, s := range byKey {
		out.Unreplied = append(out.Unreplied, *s)
	}
	slices.SortFunc(out.Unreplied, func(a, b UnrepliedSeries) int {
		return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name), cmp.Compare(a.Port, b.Port),
			strings.Compare(a.Protocol, b.Protocol), strings.Compare(a.Reason, b.Reason))
	})
	return out
}

// InvalidReasonSeries is one label set of proxyhealth_conntrack_invalid_reason_packets_total.
type InvalidReasonSeries struct {
	Namespace, Name string // the Service the packet carried; empty for none
	Reason          string // tcp_flags, checksum, seq_over_window, ...
	Packets         uint64 // since the exporter started
}

// InvalidReasons is what conntrack's INVALID log (--conntrack.invalid-reasons) has counted.
type InvalidReasons struct {
	// Enabled is false when the log is not read at all (the flag is off); the rest is then
	// empty.
	Enabled bool
	// Err is why the log is not being read now; nil while it is. ErrInvalidLogNotStarted
	// before it first started: it had counted nothing yet.
	Err error
	// Series are the per-Service counts, sorted by Service then reason.
	Series []InvalidReasonSeries
	// Unlisted counts the packets of Services left out of Series by
	// --conntrack.max-service-series; Lost the logged packets that never reached the reader.
	Unlisted, Lost uint64
	// Listened is the time NFLOG group 0 has been bound since the reader started: less than
	// the time elapsed while the log runs above --conntrack.invalid-reasons.max-rate and is
	// read in windows (Sampling), when the counts are a sample over that share of the time.
	Listened time.Duration
	Sampling bool
}

// ErrInvalidLogNotStarted is InvalidReasons' error before conntrack's INVALID log was first read.
var ErrInvalidLogNotStarted = errors.New("conntrack INVALID log (--conntrack.invalid-reasons): not started yet")

// InvalidReasons returns the INVALID log's counts now; it waits on nothing but the log's lock.
func (c *Collector) InvalidReasons() InvalidReasons {
	if c.invalid == nil {
		return InvalidReasons{}
	}
	s := c.invalid.snapshot()
	out := InvalidReasons{Enabled: true, Err: s.err, Lost: s.lost, Listened: s.listened, Sampling: s.sampling,
		Series: make([]InvalidReasonSeries, 0, len(s.counts))}
	for k, v := range s.counts {
		out.Series = append(out.Series, InvalidReasonSeries{Namespace: k.namespace, Name: k.name, Reason: k.reason.String(), Packets: v})
	}
	for _, v := range s.unlisted {
		out.Unlisted += v
	}
	slices.SortFunc(out.Series, func(a, b InvalidReasonSeries) int {
		return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name), strings.Compare(a.Reason, b.Reason))
	})
	return out
}
