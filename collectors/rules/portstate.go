package rules

import (
	"slices"

	"github.com/proxyhealth/proxyhealth/internal/cluster"
)

// portStates keeps, per service port, what one drift check learns for the next: its chain
// names, which kube-proxy derives from a SHA-256 of the port's name and which a check at
// 10,000 ports would otherwise hash again. Under churn a check meets the ports in the order
// the previous one did, but for those of the few Services that changed: the states are kept
// in that order and found by walking along them, a map finding the others.
type portStates struct {
	order  []*portState // as the last check met them
	next   []*portState // as the current check meets them
	byName map[cluster.ServicePortName]*portState
	cursor int    // in order: where the current check's next port is expected
	check  uint64 // numbers the checks
}

type portState struct {
	name cluster.ServicePortName
	// chains are the port's cluster and local chain names, in kube-proxy's nftables mode's
	// way if nftables is set, else in its iptables mode's; empty until needed.
	chains   [2]string
	nftables bool
	index    int    // in the last check's order; -1 when it did not meet the port
	met      uint64 // the last check that met the port

	// What the last check found comparing the port: the API entry and the rules of each
	// family it compared (rulesIdentity), how many chains of each it accounts for, and
	// that it found no difference. seen is nil when there is nothing to reuse.
	seen      *cluster.ServicePort
	seenRules [2]any
	accounted [2]uint8

	// pending are the port's differences followed through the grace period, sorted
	// (compareEndpointDiffs); prev, during a check that has met the port, the last check's.
	pending, prev []pendingDiff
}

func newPortStates() *portStates {
	return &portStates{byName: map[cluster.ServicePortName]*portState{}}
}

// begin starts a check.
func (ps *portStates) begin() {
	ps.check++
	ps.cursor = 0
	ps.next = slices.Grow(ps.next[:0], len(ps.order))
}

// meet returns the state of the check's next service port, and whether the check met the
// port for the first time (a snapshot lists each port once; this makes it safe if not).
func (ps *portStates) meet(n cluster.ServicePortName) (st *portState, first bool) {
	if ps.cursor < len(ps.order) && ps.order[ps.cursor].name == n {
		st = ps.order[ps.cursor]
		ps.cursor++
	} else if st = ps.byName[n]; st != nil {
		if st.index >= ps.cursor {
			ps.cursor = st.index + 1 // the ports in between are gone, or come later
		}
	} else {
		st = &portState{name: n, index: -1}
		ps.byName[n] = st
	}
	if st.met == ps.check {
		return st, false
	}
	st.met = ps.check
	ps.next = append(ps.next, st)
	return st, true
}

// end finishes a check: the ports it did not meet are forgotten.
func (ps *portStates) end() {
	for _, st := range ps.order {
		if st.met != ps.check {
			delete(ps.byName, st.name)
		}
	}
	for i, st := range ps.next {
		st.index = i
		st.prev = nil
	}
	clear(ps.order) // drop the forgotten ones
	ps.order, ps.next = ps.next, ps.order
}

// chainsFor names the port's cluster and local chains in the given mode's way.
func (st *portState) chainsFor(nftables bool) (clusterChain, localChain string) {
	if st.chains[0] == "" || st.nftables != nftables {
		st.chains[0], st.chains[1] = chainsFor(st.name, nftables)
		st.nftables = nftables
	}
	return st.chains[0], st.chains[1]
}

// noRules stands for a family without rules in rulesIdentity.
type noRules struct{}

// rulesIdentity is r's identity, noRules{} without rules, nil when r cannot tell.
func rulesIdentity(r programmedRules) any {
	if r == nil {
		return noRules{}
	}
	return r.identity()
}

// deltaRules are rules that can tell whether a port's holders are the same as in an earlier
// read of theirs (byChains over a followed table).
type deltaRules interface {
	// unchangedFor reports whether the port's holders are the same in these rules as in the
	// rules whose identity is since.
	unchangedFor(st *portState, since any) bool
}

// reusable reports whether the last check's finding of no difference holds for the port's
// entry sp against rules of these identities (tables, by family), telling how many chains it
// accounts for: the same entry, and per family the same rules or rules that say the port's
// holders did not change since. The port then counts as compared with these rules.
func (st *portState) reusable(sp *cluster.ServicePort, rules [2]any, tables [2]programmedRules) (accounted [2]uint8, ok bool) {
	if st.seen != sp || rules[0] == nil || rules[1] == nil {
		return accounted, false
	}
	for fam := range rules {
		if st.seenRules[fam] == rules[fam] {
			continue
		}
		dr, ok := tables[fam].(deltaRules)
		if !ok || !dr.unchangedFor(st, st.seenRules[fam]) {
			return accounted, false
		}
	}
	st.seenRules = rules
	return st.accounted, true
}
