package rules

import (
	"net/netip"
	"slices"
	"sort"
	"time"

	"github.com/proxyhealth/proxyhealth/internal/cluster"
)

// diffKey is one endpoint that differs between the rules and the API for one service port.
type diffKey struct {
	name  cluster.ServicePortName
	ipv6  bool
	ep    netip.AddrPort
	stale bool // in the rules, not in the API; else missing: in the API, not in the rules
}

// maxDriftAddresses bounds the endpoint addresses a drifting service port keeps per kind
// (stale, missing); the counts are always whole.
const maxDriftAddresses = 20

// portDrift is one service port whose rules have differed from the API past the grace period.
type portDrift struct {
	name           cluster.ServicePortName
	port           uint16
	stale, missing int
	// staleByFamily and missingByFamily split stale and missing by IP family (familyIndex).
	staleByFamily, missingByFamily [2]int
	since                          time.Time // when its oldest current difference was first seen
	// staleAddrs and missingAddrs are the endpoints counted in stale and missing, sorted, at
	// most maxDriftAddresses of each.
	staleAddrs, missingAddrs []netip.AddrPort
	// programmed and expected are the distinct endpoints compared for the port at the check
	// (over its IP families): in kube-proxy's rules, and in the API for this node.
	programmed, expected int
}

// checkResult is one drift check, which a scrape reads.
type checkResult struct {
	at       time.Time
	duration time.Duration
	err      error
	mode     string
	// fresh is false when the exporter's own API view could not be trusted: nothing was
	// compared then, so that a stale view never reads as stale rules.
	fresh    bool
	checked  int
	drifting []portDrift // sorted by stale+missing, largest first
	orphans  int         // service port chains no API service port accounts for
	// nextDeadline is when the youngest difference not yet counted reaches the grace
	// period (zero when there is none): the next comparison is due then.
	nextDeadline time.Time
	// unconfirmed is set when a difference has lasted the grace period but the API view has
	// not been heard from, or the rules not read, since it came of age: it counts once both
	// prove current. viewUnconfirmed and rulesUnconfirmed say which has not.
	unconfirmed                       bool
	viewUnconfirmed, rulesUnconfirmed bool
}

// driftEngine compares the API's expected endpoints with the programmed ones. It follows each
// differing endpoint separately and counts it only once it has differed for longer than the
// grace period in a view and rules confirmed current since: kube-proxy applies a change within
// about a second but a sync under load can take much longer, and during steady churn every endpoint's difference is short-lived even
// when some difference exists at every check. In incident 3 the same endpoints stay wrong.
type driftEngine struct {
	grace time.Duration
	since map[diffKey]time.Time
	// ports remembers per service port what a check learns for the next (portStates).
	ports *portStates
}

func newDriftEngine(grace time.Duration) *driftEngine {
	return &driftEngine{grace: grace, since: map[diffKey]time.Time{}, ports: newPortStates()}
}

// check compares snap with rules (by IP family; a family without rules is not compared) at now,
// rules being current.
func (e *driftEngine) check(snap *cluster.Snapshot, rules map[bool]programmedRules, now time.Time) checkResult {
	return e.checkBehind(snap, rules, time.Time{}, now)
}

// checkBehind is check with rules that may lag the node's since rulesBehind (zero: they do not):
// a difference counts only once it has lasted the grace period in rules known current.
func (e *driftEngine) checkBehind(snap *cluster.Snapshot, rules map[bool]programmedRules, rulesBehind, now time.Time) checkResult {
	res := checkResult{at: now, fresh: snap.Fresh}
	if !snap.Fresh {
		// Start every grace period anew once the view is trusted again.
		clear(e.since)
		return res
	}
	// When the view was last confirmed current, and the rules; never later than now.
	confirmed := snap.LastHeard
	if confirmed.After(now) {
		confirmed = now
	}
	if !rulesBehind.IsZero() && rulesBehind.Before(confirmed) {
		confirmed = rulesBehind
	}
	next := make(map[diffKey]time.Time, len(e.since))
	drifts := map[cluster.ServicePortName]*portDrift{}
	e.ports.begin()
	defer e.ports.end()
	note := func(k diffKey, port uint16) {
		first, ok := e.since[k]
		if !ok {
			first = now
		}
		next[k] = first
		if due := first.Add(e.grace); due.After(now) && (res.nextDeadline.IsZero() || due.Before(res.nextDeadline)) {
			res.nextDeadline = due
		}
		// The difference counts once the view has been confirmed current (LastHeard) a whole
		// grace period after it first appeared, and the rules too. Measuring from now instead
		// would count a change the view never received because the exporter's own connection
		// died after the view last heard from the API but before fresh-within ran out, or a
		// change kube-proxy applied that the rules were not read again for.
		if confirmed.Sub(first) < e.grace {
			if now.Sub(first) >= e.grace {
				res.unconfirmed = true
				res.viewUnconfirmed = res.viewUnconfirmed || snap.LastHeard.Sub(first) < e.grace
				res.rulesUnconfirmed = res.rulesUnconfirmed || (!rulesBehind.IsZero() && rulesBehind.Sub(first) < e.grace)
			}
			return
		}
		d := drifts[k.name]
		if d == nil {
			d = &portDrift{name: k.name, port: port, since: first}
			drifts[k.name] = d
		}
		if k.stale {
			d.stale++
			d.staleByFamily[familyIndex(k.ipv6)]++
			d.staleAddrs = append(d.staleAddrs, k.ep)
		} else {
			d.missing++
			d.missingByFamily[familyIndex(k.ipv6)]++
			d.missingAddrs = append(d.missingAddrs, k.ep)
		}
		if first.Before(d.since) {
			d.since = first
		}
	}
	tables := [2]programmedRules{rules[false], rules[true]} // by familyIndex
	ids := [2]any{rulesIdentity(tables[0]), rulesIdentity(tables[1])}
	// Per family, the chains in the rules that an API service port accounts for: the others
	// are orphans.
	var accounted [2]int
	for _, sp := range snap.Ports {
		var compared [2]bool
		for fam, r := range tables {
			compared[fam] = r != nil && hasFamily(sp.ClusterIPs, fam == 1)
		}
		if !compared[0] && !compared[1] {
			continue
		}
		res.checked++
		st, first := e.ports.meet(sp.Name)
		if !first {
			st.seen = nil
		} else if acc, ok := st.reusable(sp, ids); ok {
			// The same entry against the same rules, with no difference: under EndpointSlice
			// churn most checks change a few ports only.
			accounted[0] += int(acc[0])
			accounted[1] += int(acc[1])
			continue
		}
		differs := false
		var portAccounted [2]uint8
		// The port's chains in the mode of each family compared: on a node, one mode, and so
		// two names. A chain of that name in any family's rules is the port's.
		var names [4]string
		n := 0
		for fam, r := range tables {
			if !compared[fam] {
				continue
			}
			cl, lo := st.chainsFor(r.nftables())
			for _, c := range [2]string{cl, lo} {
				if !slices.Contains(names[:n], c) {
					names[n] = c
					n++
				}
			}
		}
		// What was compared per family (the cluster and local chains' endpoints; the API's
		// cluster and local endpoints), counted only for a port found drifting.
		var compProgrammed, compExpected [2][2][]netip.AddrPort
		for fam, r := range tables {
			if r == nil {
				continue
			}
			var clusterChain, localChain string
			if compared[fam] {
				clusterChain, localChain = st.chainsFor(r.nftables())
			}
			var clusterEps, localEps []netip.AddrPort
			for _, c := range names[:n] {
				eps, ok := r.chain(c)
				if ok && first {
					accounted[fam]++
					portAccounted[fam]++
				}
				switch c {
				case clusterChain:
					clusterEps = eps
				case localChain:
					localEps = eps
				}
			}
			if !compared[fam] {
				continue
			}
			compProgrammed[fam] = [2][]netip.AddrPort{clusterEps, localEps}
			compExpected[fam] = [2][]netip.AddrPort{sp.ClusterEndpoints, sp.LocalEndpoints}
			if slices.Equal(clusterEps, sp.ClusterEndpoints) && slices.Equal(localEps, sp.LocalEndpoints) {
				continue // the same endpoints: nothing differs (the usual case, told cheaply)
			}
			// An endpoint counts once per service port, whichever of its chains hold it:
			// a NodePort with externalTrafficPolicy: Local has a local endpoint in both.
			ipv6 := fam == 1
			programmed := append(slices.Clip(clusterEps), localEps...)
			expected := append(slices.Clip(sp.ClusterEndpoints), sp.LocalEndpoints...)
			stale, missing := diffEndpoints(programmed, expected, ipv6)
			differs = differs || len(stale)+len(missing) > 0
			for _, ep := range stale {
				note(diffKey{sp.Name, ipv6, ep, true}, sp.Port)
			}
			for _, ep := range missing {
				note(diffKey{sp.Name, ipv6, ep, false}, sp.Port)
			}
		}
		if first {
			st.seen, st.seenRules, st.accounted = nil, ids, portAccounted
			if !differs {
				st.seen = sp
			}
		}
		if d := drifts[sp.Name]; d != nil {
			d.programmed, d.expected = 0, 0
			for fam := range tables {
				ipv6 := fam == 1
				d.programmed += countDistinct(compProgrammed[fam], ipv6)
				d.expected += countDistinct(compExpected[fam], ipv6)
			}
		}
	}
	e.since = next
	for fam, r := range tables {
		if r != nil {
			res.orphans += r.chainCount() - accounted[fam]
		}
	}
	for _, d := range drifts {
		d.staleAddrs, d.missingAddrs = boundAddrs(d.staleAddrs), boundAddrs(d.missingAddrs)
		res.drifting = append(res.drifting, *d)
	}
	sort.Slice(res.drifting, func(i, j int) bool {
		a, b := res.drifting[i], res.drifting[j]
		if a.stale+a.missing != b.stale+b.missing {
			return a.stale+a.missing > b.stale+b.missing
		}
		return a.name.String()+a.name.Protocol < b.name.String()+b.name.Protocol
	})
	return res
}

// boundAddrs sorts addrs and keeps the first maxDriftAddresses, in a slice of their own.
func boundAddrs(addrs []netip.AddrPort) []netip.AddrPort {
	if len(addrs) == 0 {
		return nil
	}
	slices.SortFunc(addrs, netip.AddrPort.Compare)
	return slices.Clone(addrs[:min(len(addrs), maxDriftAddresses)])
}

func familyIndex(ipv6 bool) int {
	if ipv6 {
		return 1
	}
	return 0
}

// countDistinct counts the distinct endpoints of one family in lists.
func countDistinct(lists [2][]netip.AddrPort, ipv6 bool) int {
	seen := make(map[netip.AddrPort]struct{}, len(lists[0])+len(lists[1]))
	for _, eps := range lists {
		for _, ep := range eps {
			if ep.Addr().Unmap().Is6() == ipv6 {
				seen[ep] = struct{}{}
			}
		}
	}
	return len(seen)
}

func hasFamily(ips []netip.Addr, ipv6 bool) bool {
	for _, ip := range ips {
		if ip.Unmap().Is6() == ipv6 {
			return true
		}
	}
	return false
}

// diffEndpoints returns the distinct endpoints of the given family that are programmed but not
// expected (stale) and expected but not programmed (missing). Lists sorted without duplicates,
// as the API view and the netfilter readers hand them in, are merged; others are short (a
// service port has a handful of endpoints) so they are scanned rather than hashed, except
// large ones.
func diffEndpoints(programmed, expected []netip.AddrPort, ipv6 bool) (stale, missing []netip.AddrPort) {
	if strictlySorted(programmed) && strictlySorted(expected) {
		return diffEndpointsSorted(programmed, expected, ipv6)
	}
	if len(programmed)+len(expected) > 64 {
		return diffEndpointsLarge(programmed, expected, ipv6)
	}
	for i, ep := range programmed {
		if slices.Contains(programmed[:i], ep) {
			continue
		}
		if !slices.Contains(expected, ep) {
			stale = append(stale, ep)
		}
	}
	for i, ep := range expected {
		if ep.Addr().Unmap().Is6() != ipv6 || slices.Contains(expected[:i], ep) {
			continue
		}
		if !slices.Contains(programmed, ep) {
			missing = append(missing, ep)
		}
	}
	return stale, missing
}

// strictlySorted reports whether eps is sorted and without duplicates.
func strictlySorted(eps []netip.AddrPort) bool {
	for i := 1; i < len(eps); i++ {
		if eps[i-1].Compare(eps[i]) >= 0 {
			return false
		}
	}
	return true
}

// diffEndpointsSorted is diffEndpoints of lists sorted without duplicates, in one merge.
func diffEndpointsSorted(programmed, expected []netip.AddrPort, ipv6 bool) (stale, missing []netip.AddrPort) {
	i, j := 0, 0
	for i < len(programmed) || j < len(expected) {
		c := -1 // programmed[i] first
		switch {
		case i == len(programmed):
			c = 1
		case j < len(expected):
			c = programmed[i].Compare(expected[j])
		}
		switch {
		case c < 0:
			stale = append(stale, programmed[i])
			i++
		case c > 0:
			if expected[j].Addr().Unmap().Is6() == ipv6 {
				missing = append(missing, expected[j])
			}
			j++
		default:
			i, j = i+1, j+1
		}
	}
	return stale, missing
}

func diffEndpointsLarge(programmed, expected []netip.AddrPort, ipv6 bool) (stale, missing []netip.AddrPort) {
	// want holds every expected endpoint, true for those of the family: a programmed one is
	// stale only if the API has it in neither, as in the scan.
	want := make(map[netip.AddrPort]bool, len(expected))
	for _, ep := range expected {
		want[ep] = ep.Addr().Unmap().Is6() == ipv6
	}
	have := make(map[netip.AddrPort]bool, len(programmed))
	for _, ep := range programmed {
		if have[ep] {
			continue
		}
		have[ep] = true
		if _, ok := want[ep]; !ok {
			stale = append(stale, ep)
		}
	}
	for ep, ofFamily := range want {
		if ofFamily && !have[ep] {
			missing = append(missing, ep)
		}
	}
	return stale, missing
}
