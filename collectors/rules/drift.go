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
	since          time.Time // when its oldest current difference was first seen
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
	// names remembers chain names for the rules the collector hands in (programmedByFamily);
	// accounted is each check's set of chains an API service port names, kept to be reused.
	names     *chainNames
	accounted map[string]struct{}
}

func newDriftEngine(grace time.Duration) *driftEngine {
	return &driftEngine{grace: grace, since: map[diffKey]time.Time{}, names: newChainNames(), accounted: map[string]struct{}{}}
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
	accounted := e.accounted
	clear(accounted)
	defer e.names.checked(len(snap.Ports))
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
			d.staleAddrs = append(d.staleAddrs, k.ep)
		} else {
			d.missing++
			d.missingAddrs = append(d.missingAddrs, k.ep)
		}
		if first.Before(d.since) {
			d.since = first
		}
	}
	for i := range snap.Ports {
		sp := &snap.Ports[i]
		compared := false
		// What was compared per family, counted only for a port found drifting.
		var compProgrammed, compExpected [2][]netip.AddrPort
		for _, ipv6 := range []bool{false, true} {
			r := rules[ipv6]
			if r == nil || !hasFamily(sp.ClusterIPs, ipv6) {
				continue
			}
			compared = true
			clusterChain, localChain := r.chainsFor(sp.Name)
			accounted[clusterChain], accounted[localChain] = struct{}{}, struct{}{}
			// An endpoint counts once per service port, whichever of its chains hold it:
			// a NodePort with externalTrafficPolicy: Local has a local endpoint in both.
			programmed := append(slices.Clip(r.endpoints(clusterChain)), r.endpoints(localChain)...)
			expected := append(slices.Clip(sp.ClusterEndpoints), sp.LocalEndpoints...)
			stale, missing := diffEndpoints(programmed, expected, ipv6)
			fam := familyIndex(ipv6)
			compProgrammed[fam], compExpected[fam] = programmed, expected
			for _, ep := range stale {
				note(diffKey{sp.Name, ipv6, ep, true}, sp.Port)
			}
			for _, ep := range missing {
				note(diffKey{sp.Name, ipv6, ep, false}, sp.Port)
			}
		}
		if compared {
			res.checked++
		}
		if d := drifts[sp.Name]; d != nil {
			d.programmed, d.expected = 0, 0
			for _, ipv6 := range []bool{false, true} {
				fam := familyIndex(ipv6)
				d.programmed += countDistinct(compProgrammed[fam], ipv6)
				d.expected += countDistinct(compExpected[fam], ipv6)
			}
		}
	}
	e.since = next
	for _, r := range rules {
		if r == nil {
			continue
		}
		for c := range r.serviceChains() {
			if _, ok := accounted[c]; !ok {
				res.orphans++
			}
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

// countDistinct counts the distinct endpoints of one family in eps.
func countDistinct(eps []netip.AddrPort, ipv6 bool) int {
	seen := make(map[netip.AddrPort]struct{}, len(eps))
	for _, ep := range eps {
		if ep.Addr().Unmap().Is6() == ipv6 {
			seen[ep] = struct{}{}
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
// expected (stale) and expected but not programmed (missing). Lists are short (a service port
// has a handful of endpoints) so they are scanned rather than hashed, except large ones.
func diffEndpoints(programmed, expected []netip.AddrPort, ipv6 bool) (stale, missing []netip.AddrPort) {
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

func diffEndpointsLarge(programmed, expected []netip.AddrPort, ipv6 bool) (stale, missing []netip.AddrPort) {
	want := make(map[netip.AddrPort]bool, len(expected))
	for _, ep := range expected {
		if ep.Addr().Unmap().Is6() == ipv6 {
			want[ep] = true
		}
	}
	have := make(map[netip.AddrPort]bool, len(programmed))
	for _, ep := range programmed {
		if have[ep] {
			continue
		}
		have[ep] = true
		if !want[ep] {
			stale = append(stale, ep)
		}
	}
	for ep := range want {
		if !have[ep] {
			missing = append(missing, ep)
		}
	}
	return stale, missing
}
