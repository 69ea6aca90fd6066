package rules

import (
	"bytes"
	"cmp"
	"net/netip"
	"slices"
	"sort"
	"time"

	"github.com/proxyhealth/proxyhealth/internal/cluster"
	"github.com/proxyhealth/proxyhealth/internal/ipvs"
)

// Chains names some of a service port's two chains.
type Chains uint8

const (
	// ClusterChain holds the endpoints all traffic to the port may use (KUBE-SVC-* in
	// kube-proxy's iptables mode, service-* in its nftables mode).
	ClusterChain Chains = 1 << iota
	// LocalChain holds this node's endpoints, for the traffic a Local traffic policy keeps on
	// the node (KUBE-SVL-*, local-*).
	LocalChain
)

// portChains are a port's chains in the order this package lists their names and endpoints:
// cluster, then local (as chainsFor returns the names and the API view its two lists).
var portChains = [2]Chains{ClusterChain, LocalChain}

// String is "cluster", "local" or "cluster+local".
func (c Chains) String() string {
	switch c {
	case ClusterChain:
		return "cluster"
	case LocalChain:
		return "local"
	case ClusterChain | LocalChain:
		return "cluster+local"
	}
	return ""
}

// endpointDiff is one endpoint that differs between one of a service port's chains and what
// the API says that chain should hold; the port is the portState that follows it. It holds no
// pointer and the port's name is not in it: a check of kube-proxy's first, empty chains at
// 10,000 ports x 10 endpoints follows 100,000 of them until the rules catch up.
type endpointDiff struct {
	addr  [16]byte // the endpoint's address, an IPv4 one in its IPv4-mapped form
	port  uint16
	is4   bool   // addr is an IPv4 address
	ipv6  bool   // found in the IPv6 rules
	stale bool   // in the chain, not in its list in the API; else missing: the reverse
	chain Chains // one of portChains
}

func newEndpointDiff(ep netip.AddrPort, ipv6, stale bool, chain Chains) endpointDiff {
	return endpointDiff{addr: ep.Addr().As16(), port: ep.Port(), is4: ep.Addr().Is4(), ipv6: ipv6, stale: stale, chain: chain}
}

func compareEndpointDiffs(a, b endpointDiff) int {
	if c := bytes.Compare(a.addr[:], b.addr[:]); c != 0 {
		return c
	}
	if c := cmp.Compare(a.port, b.port); c != 0 {
		return c
	}
	if c := compareBool(a.is4, b.is4); c != 0 {
		return c
	}
	if c := compareBool(a.ipv6, b.ipv6); c != 0 {
		return c
	}
	if c := compareBool(a.stale, b.stale); c != 0 {
		return c
	}
	return cmp.Compare(a.chain, b.chain)
}

func compareBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}

// pendingDiff is a difference followed through the grace period: first is when it was first
// seen, as time since the engine's epoch (a time.Time would hold a pointer and 24 bytes).
type pendingDiff struct {
	diff  endpointDiff
	first time.Duration
}

// foundDiff is a difference the check under way found in the port it is comparing.
type foundDiff struct {
	diff   endpointDiff
	ep     netip.AddrPort
	server ipvs.Key
}

// chainDiff is a counted difference of a drifting port: an endpoint stale (or missing) in
// the chains named, and in IPVS mode the virtual server that shows it.
type chainDiff struct {
	ep     netip.AddrPort
	stale  bool
	chains Chains
	server ipvs.Key
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
	// most maxDriftAddresses of each; staleIn and missingFrom, alongside them, the chains that
	// hold each stale endpoint and that lack each missing one.
	staleAddrs, missingAddrs []netip.AddrPort
	staleIn, missingFrom     []Chains
	// staleServers and missingServers, alongside them in IPVS mode (nil in the others), are
	// the virtual servers that hold each stale endpoint and that lack each missing one.
	staleServers, missingServers [][]ipvs.Key
	// found are the differences counted while the check runs, an endpoint once per chain
	// (settle makes the counts and addresses of them).
	found []chainDiff
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

// driftEngine compares the API's expected endpoints with the programmed ones, each of a service
// port's chains with what it should hold. It follows each endpoint differing in each chain
// separately and counts it only once it has differed for longer than the grace period in a
// view and rules confirmed current since: kube-proxy applies a change within about a second
// but a sync under load can take much longer, and during steady churn every endpoint's
// difference is short-lived even when some difference exists at every check. In incident 3
// the same endpoints stay wrong.
//
// The differences are followed per service port (portState.pending), so that a port's name is
// held once however many of its endpoints differ.
type driftEngine struct {
	grace time.Duration
	// epoch is the first check's time, from which pendingDiff.first counts.
	epoch time.Time
	// ports remembers per service port what a check learns for the next (portStates).
	ports *portStates
}

func newDriftEngine(grace time.Duration) *driftEngine {
	return &driftEngine{grace: grace, ports: newPortStates()}
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
		for _, st := range e.ports.order {
			st.pending = nil
		}
		return res
	}
	if e.epoch.IsZero() {
		e.epoch = now
	}
	c := driftCheck{
		e:           e,
		res:         &res,
		now:         now,
		lastHeard:   snap.LastHeard,
		rulesBehind: rulesBehind,
		drifts:      map[cluster.ServicePortName]*portDrift{},
		tables:      [2]programmedRules{rules[false], rules[true]},
	}
	// When the view was last confirmed current, and the rules; never later than now.
	c.confirmed = snap.LastHeard
	if c.confirmed.After(now) {
		c.confirmed = now
	}
	if !rulesBehind.IsZero() && rulesBehind.Before(c.confirmed) {
		c.confirmed = rulesBehind
	}
	c.ids = [2]any{rulesIdentity(c.tables[0]), rulesIdentity(c.tables[1])}
	e.ports.begin()
	defer e.ports.end()
	for _, sp := range snap.Ports {
		c.comparePort(sp)
	}
	c.finish()
	return res
}

// driftCheck is one check under way.
type driftCheck struct {
	e   *driftEngine
	res *checkResult
	now time.Time
	// lastHeard is when the view was last confirmed current, rulesBehind since when the rules
	// may lag (zero: they do not), confirmed the earlier of both, never later than now.
	lastHeard, rulesBehind, confirmed time.Time

	drifts map[cluster.ServicePortName]*portDrift
	tables [2]programmedRules // by familyIndex
	ids    [2]any             // the tables' rulesIdentity
	// held are, by family, the holders of the port being compared (lookup), reused.
	held [2][]holder
	// found are the differences found in the port being compared; stale and missing, those
	// of one of its holders. Reused.
	found          []foundDiff
	stale, missing []netip.AddrPort
	// Per family, the chains in the rules that an API service port accounts for: the others
	// are orphans.
	accounted [2]int
}

// follow follows the differences found in the port st, sp (c.found) through the grace period,
// each from when the last check saw it first (st.pending) or from now, and counts in the
// port's drift those that have lasted it.
func (c *driftCheck) follow(st *portState, sp *cluster.ServicePort, first bool) {
	if first {
		st.prev, st.pending = st.pending, nil
	}
	if len(c.found) == 0 {
		return
	}
	slices.SortFunc(c.found, func(a, b foundDiff) int { return compareEndpointDiffs(a.diff, b.diff) })
	// The port's new pending differences, one per endpointDiff (IPVS shows one in each virtual
	// server lacking it), with those of a meeting before this one (a snapshot lists a port
	// once; this keeps it right if not).
	n := len(st.pending)
	for i, f := range c.found {
		if i == 0 || f.diff != c.found[i-1].diff {
			n++
		}
	}
	pending := make([]pendingDiff, 0, n)
	prev := st.prev
	nowAt := c.now.Sub(c.e.epoch)
	for i, f := range c.found {
		if i > 0 && f.diff == c.found[i-1].diff {
			c.count(sp, f, c.e.epoch.Add(pending[len(pending)-1].first))
			continue
		}
		for len(prev) > 0 && compareEndpointDiffs(prev[0].diff, f.diff) < 0 {
			prev = prev[1:]
		}
		at := nowAt
		if len(prev) > 0 && prev[0].diff == f.diff {
			at = prev[0].first
		}
		pending = append(pending, pendingDiff{diff: f.diff, first: at})
		c.count(sp, f, c.e.epoch.Add(at))
	}
	if len(st.pending) > 0 {
		pending = append(pending, st.pending...)
		slices.SortFunc(pending, func(a, b pendingDiff) int { return compareEndpointDiffs(a.diff, b.diff) })
		pending = slices.CompactFunc(pending, func(a, b pendingDiff) bool { return a.diff == b.diff })
	}
	st.pending = pending
	c.found = c.found[:0]
}

// count counts the difference f of the service port sp, first seen at first, in the port's
// drift once it has lasted the grace period.
func (c *driftCheck) count(sp *cluster.ServicePort, f foundDiff, first time.Time) {
	res := c.res
	if due := first.Add(c.e.grace); due.After(c.now) && (res.nextDeadline.IsZero() || due.Before(res.nextDeadline)) {
		res.nextDeadline = due
	}
	// The difference counts once the view has been confirmed current (LastHeard) a whole
	// grace period after it first appeared, and the rules too. Measuring from now instead
	// would count a change the view never received because the exporter's own connection
	// died after the view last heard from the API but before fresh-within ran out, or a
	// change kube-proxy applied that the rules were not read again for.
	if c.confirmed.Sub(first) < c.e.grace {
		if c.now.Sub(first) >= c.e.grace {
			res.unconfirmed = true
			res.viewUnconfirmed = res.viewUnconfirmed || c.lastHeard.Sub(first) < c.e.grace
			res.rulesUnconfirmed = res.rulesUnconfirmed || (!c.rulesBehind.IsZero() && c.rulesBehind.Sub(first) < c.e.grace)
		}
		return
	}
	d := c.drifts[sp.Name]
	if d == nil {
		d = &portDrift{name: sp.Name, port: sp.Port, since: first}
		c.drifts[sp.Name] = d
	}
	d.found = append(d.found, chainDiff{ep: f.ep, stale: f.diff.stale, chains: f.diff.chain, server: f.server})
	if first.Before(d.since) {
		d.since = first
	}
}

// comparePort compares one service port of the view with the rules.
func (c *driftCheck) comparePort(sp *cluster.ServicePort) {
	var compared [2]bool
	for fam, r := range c.tables {
		compared[fam] = r != nil && hasFamily(sp.ClusterIPs, fam == 1)
	}
	if !compared[0] && !compared[1] {
		return
	}
	c.res.checked++
	st, first := c.e.ports.meet(sp.Name)
	if !first {
		st.seen = nil
	} else if acc, ok := st.reusable(sp, c.ids, c.tables); ok {
		// The same entry against the same rules, with no difference: under EndpointSlice
		// churn most checks change a few ports only.
		c.accounted[0] += int(acc[0])
		c.accounted[1] += int(acc[1])
		return
	}
	portAccounted := c.lookup(st, sp, first, compared)
	differs := false
	// What was compared per family (the endpoints its holders hold, and should hold), counted
	// only for a port found drifting.
	var compProgrammed, compExpected [2][][]netip.AddrPort
	for fam := range c.tables {
		if !compared[fam] {
			continue
		}
		// Each holder against what it should hold: the cluster chain the endpoints all
		// traffic may use, the local chain this node's (or each virtual server its list). An
		// endpoint in both lists (a local endpoint of a NodePort with externalTrafficPolicy:
		// Local) is compared in both, and counted once (settle).
		ipv6 := fam == 1
		for _, h := range c.held[fam] {
			if slices.Equal(h.eps, h.want) {
				continue // the same endpoints: nothing differs (the usual case, told cheaply)
			}
			c.stale, c.missing = appendEndpointDiffs(c.stale[:0], c.missing[:0], h.eps, h.want, ipv6)
			differs = differs || len(c.stale)+len(c.missing) > 0
			for _, ep := range c.stale {
				c.found = append(c.found, foundDiff{newEndpointDiff(ep, ipv6, true, h.list), ep, h.server})
			}
			for _, ep := range c.missing {
				c.found = append(c.found, foundDiff{newEndpointDiff(ep, ipv6, false, h.list), ep, h.server})
			}
		}
	}
	c.follow(st, sp, first)
	if first {
		st.seen, st.seenRules, st.accounted = nil, c.ids, portAccounted
		if !differs {
			st.seen = sp
		}
	}
	if d := c.drifts[sp.Name]; d != nil {
		for fam := range c.tables {
			if !compared[fam] {
				continue
			}
			for _, h := range c.held[fam] {
				compProgrammed[fam] = append(compProgrammed[fam], h.eps)
				compExpected[fam] = append(compExpected[fam], h.want)
			}
		}
		d.programmed, d.expected = 0, 0
		for fam := range c.tables {
			ipv6 := fam == 1
			d.programmed += countDistinct(compProgrammed[fam], ipv6)
			d.expected += countDistinct(compExpected[fam], ipv6)
		}
	}
}

// lookup finds the port's holders in each family's rules (c.held), and at the check's first
// meeting with the port counts those the rules have as accounted for. A family not compared
// (the port has no cluster IP of it) is looked in for the accounting only: kube-proxy's chain
// names are the same in both families.
func (c *driftCheck) lookup(st *portState, sp *cluster.ServicePort, first bool, compared [2]bool) (portAccounted [2]uint8) {
	for fam, r := range c.tables {
		c.held[fam] = c.held[fam][:0]
		if r == nil || !first && !compared[fam] {
			continue
		}
		c.held[fam] = r.holders(c.held[fam], st, sp, fam == 1)
		if !first {
			continue
		}
		for _, h := range c.held[fam] {
			if h.present {
				c.accounted[fam]++
				portAccounted[fam]++
			}
		}
	}
	return portAccounted
}

// finish completes the check's result: orphans, and the drifting ports in order.
func (c *driftCheck) finish() {
	res := c.res
	for fam, r := range c.tables {
		if r != nil {
			res.orphans += max(r.holderCount()-c.accounted[fam], 0)
		}
	}
	for _, d := range c.drifts {
		d.settle()
		res.drifting = append(res.drifting, *d)
	}
	sort.Slice(res.drifting, func(i, j int) bool {
		a, b := res.drifting[i], res.drifting[j]
		if a.stale+a.missing != b.stale+b.missing {
			return a.stale+a.missing > b.stale+b.missing
		}
		return a.name.String()+a.name.Protocol < b.name.String()+b.name.Protocol
	})
}

// settle makes the port's counts and addresses of the differences found: each endpoint counts
// once per kind (stale, missing), whichever chains (or virtual servers) show it, and its
// addresses are the lowest maxDriftAddresses of each kind, in slices of their own.
func (d *portDrift) settle() {
	slices.SortFunc(d.found, func(a, b chainDiff) int {
		if a.stale != b.stale {
			if a.stale {
				return -1
			}
			return 1
		}
		if c := a.ep.Compare(b.ep); c != 0 {
			return c
		}
		return a.server.Compare(b.server)
	})
	for i := 0; i < len(d.found); {
		diff := d.found[i]
		var servers []ipvs.Key
		if diff.server.Addr.IsValid() {
			servers = []ipvs.Key{diff.server}
		}
		for i++; i < len(d.found) && d.found[i].ep == diff.ep && d.found[i].stale == diff.stale; i++ {
			diff.chains |= d.found[i].chains
			if s := d.found[i].server; s.Addr.IsValid() && (len(servers) == 0 || s != servers[len(servers)-1]) {
				servers = append(servers, s)
			}
		}
		fam := familyIndex(diff.ep.Addr().Unmap().Is6())
		if diff.stale {
			d.stale++
			d.staleByFamily[fam]++
			if len(d.staleAddrs) < maxDriftAddresses {
				d.staleAddrs = append(d.staleAddrs, diff.ep)
				d.staleIn = append(d.staleIn, diff.chains)
				if servers != nil {
					d.staleServers = append(d.staleServers, servers)
				}
			}
		} else {
			d.missing++
			d.missingByFamily[fam]++
			if len(d.missingAddrs) < maxDriftAddresses {
				d.missingAddrs = append(d.missingAddrs, diff.ep)
				d.missingFrom = append(d.missingFrom, diff.chains)
				if servers != nil {
					d.missingServers = append(d.missingServers, servers)
				}
			}
		}
	}
	d.found = nil
}

func familyIndex(ipv6 bool) int {
	if ipv6 {
		return 1
	}
	return 0
}

// countDistinct counts the distinct endpoints of one family in lists.
func countDistinct(lists [][]netip.AddrPort, ipv6 bool) int {
	n := 0
	for _, eps := range lists {
		n += len(eps)
	}
	seen := make(map[netip.AddrPort]struct{}, n)
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
// expected (stale) and expected but not programmed (missing).
func diffEndpoints(programmed, expected []netip.AddrPort, ipv6 bool) (stale, missing []netip.AddrPort) {
	return appendEndpointDiffs(nil, nil, programmed, expected, ipv6)
}

// appendEndpointDiffs is diffEndpoints appending to stale and missing, which a check reuses
// from port to port. Lists sorted without duplicates, as the API view and the netfilter readers
// hand them in, are merged; others are short (a service port has a handful of endpoints) so
// they are scanned rather than hashed, except large ones.
func appendEndpointDiffs(stale, missing, programmed, expected []netip.AddrPort, ipv6 bool) ([]netip.AddrPort, []netip.AddrPort) {
	if strictlySorted(programmed) && strictlySorted(expected) {
		return diffEndpointsSorted(stale, missing, programmed, expected, ipv6)
	}
	if len(programmed)+len(expected) > 64 {
		return diffEndpointsLarge(stale, missing, programmed, expected, ipv6)
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
func diffEndpointsSorted(stale, missing, programmed, expected []netip.AddrPort, ipv6 bool) ([]netip.AddrPort, []netip.AddrPort) {
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

func diffEndpointsLarge(stale, missing, programmed, expected []netip.AddrPort, ipv6 bool) ([]netip.AddrPort, []netip.AddrPort) {
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
