package nftnl

import (
	"net/netip"
	"slices"

	"github.com/proxyhealth/proxyhealth/internal/kubeproxynames"
)

// chainEdits is what a run of changes did to iptables-nft's service and endpoint chains
// (KUBE-SVC-*, KUBE-SVL-*, KUBE-SEP-*) past what a table's state holds: per chain, either its
// rules after the changes, taken from the watch's rule messages, or that it must be read.
//
// kube-proxy writes a chain by declaring it in iptables-restore, which flushes it: the
// commit deletes every rule the chain had, then adds its new rules. The messages tell a
// Follower the new rules; they say the old ones are all gone only when the commit deleted as
// many as the chain is known to have had, so each chain's rule count is kept. Anything else
// (a rule inserted or deleted alone, messages the watch dropped) makes the chain be read.
type chainEdits struct {
	order []string // chains, in the order first named
	edits map[string]*chainEdit
	gen   uint32 // the last change's generation
}

type chainEdit struct {
	read bool // the chain must be read
	// set: rules are the chain's rules after the changes (none: it has none, or is gone);
	// until then it has the rules the state counts, base of them.
	set   bool
	rules []*natRule
	base  int32
}

// count is how many rules the chain has after the changes so far.
func (ed *chainEdit) count() int {
	if ed.set {
		return len(ed.rules)
	}
	return int(ed.base)
}

// add notes change d, whose commit produced generation gen, to table ft.
func (e *chainEdits) add(ft *followed, gen uint32, d *TableChange) {
	if !genAfter(gen, ft.gen) {
		return // the whole read holds it
	}
	e.gen = gen
	var byChain map[string][]RuleEvent
	kept := map[string]bool{}
	if !d.RulesDropped {
		for _, ev := range d.Rules {
			if ev.Chain != chainKubeServices {
				if byChain == nil {
					byChain = map[string][]RuleEvent{}
				}
				byChain[ev.Chain] = append(byChain[ev.Chain], ev)
			}
		}
		for _, c := range d.KeptChains {
			kept[c] = true
		}
	}
	gone := make(map[string]bool, len(d.DeletedChains))
	for _, c := range d.DeletedChains {
		gone[c] = true
	}
	for _, chain := range d.Chains {
		if !kubeproxynames.IsIPTablesServiceChain(chain) && !kubeproxynames.IsIPTablesEndpointChain(chain) {
			continue
		}
		if g, ok := ft.chainGen[chain]; ok && !genAfter(gen, g) {
			continue // a read of the chain holds it
		}
		ed := e.edits[chain]
		if ed == nil {
			if e.edits == nil {
				e.edits = map[string]*chainEdit{}
			}
			ed = &chainEdit{base: ft.ruleCounts[chain]}
			e.edits[chain] = ed
			e.order = append(e.order, chain)
		}
		switch {
		case ed.read:
		case gone[chain]:
			ed.set, ed.rules = true, nil
		case !kept[chain]:
			ed.read = true
		default:
			added, deleted := rewrite(byChain[chain])
			if deleted != ed.count() {
				ed.read = true // not rewritten whole
				continue
			}
			ed.set, ed.rules = true, added
		}
	}
}

// rewrite returns what one commit's rule messages of a chain added, and how many rules of
// those it had before it deleted. A rule added and deleted in the same commit counts as
// neither.
func rewrite(evs []RuleEvent) (added []*natRule, deleted int) {
	var handles []uint64
	for _, ev := range evs {
		if !ev.Deleted {
			added = append(added, ev.rule)
			handles = append(handles, ev.Handle)
			continue
		}
		if i := slices.Index(handles, ev.Handle); i >= 0 {
			added = slices.Delete(added, i, i+1)
			handles = slices.Delete(handles, i, i+1)
			continue
		}
		deleted++
	}
	return added, deleted
}

// endpoint is the DNAT destination of an endpoint chain with these rules: the first one's, as
// a whole read takes it.
func endpoint(rules []*natRule) netip.AddrPort {
	for _, r := range rules {
		if r.dnat.IsValid() {
			return r.dnat
		}
	}
	return netip.AddrPort{}
}

// targets are the endpoint chains a service chain with these rules jumps to.
func targets(rules []*natRule) []string {
	out := make([]string, 0, len(rules))
	for _, r := range rules {
		if r.sep != "" {
			out = append(out, r.sep)
		}
	}
	return out
}
