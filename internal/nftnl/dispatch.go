package nftnl

import (
	"cmp"
	"context"
	"slices"

	"github.com/proxyhealth/proxyhealth/internal/ruleset"
)

const chainKubeServices = "KUBE-SERVICES"

// dispatchRules is iptables-nft's KUBE-SERVICES: its service dispatch rules by rule handle,
// followed from the watch's decoded rule messages (FollowNATRules) instead of dumps.
type dispatchRules struct {
	// byHandle holds each rule's service. The watch's decoder hands out one pointer per rule
	// body, so a rule deleted and written again at a sync comes back as the same pointer.
	byHandle map[uint64]*ruleset.Service
	// refs counts the rules of each service pointer; changed is set when one appeared or
	// went since the last list, which a sync that wrote the same rules again does not do.
	refs    map[*ruleset.Service]int
	changed bool
	// gen is the generation the rules are current at: the messages of commits up to it are
	// in them already.
	gen uint32
	// before and list are scratch space for apply and services.
	before map[*ruleset.Service]int
	list   []ruleset.Service
}

// newDispatchRules keeps the dispatch rules nr read, current at generation gen.
func newDispatchRules(nr *natReader, gen uint32) *dispatchRules {
	d := &dispatchRules{byHandle: make(map[uint64]*ruleset.Service, len(nr.services)), refs: map[*ruleset.Service]int{}, gen: gen, changed: true}
	for i := range nr.services {
		s := &nr.services[i]
		d.byHandle[nr.handles[i]] = s
		d.refs[s]++
	}
	return d
}

// current is the generation d is current at; 0 (before any) when d is nil.
func (d *dispatchRules) current() uint32 {
	if d == nil {
		return 0
	}
	return d.gen
}

// apply applies runs of decoded rule messages, in order; other chains' are skipped.
func (d *dispatchRules) apply(runs [][]RuleEvent) {
	if d.before == nil {
		d.before = map[*ruleset.Service]int{}
	}
	clear(d.before)
	count := func(s *ruleset.Service, delta int) {
		if _, ok := d.before[s]; !ok {
			d.before[s] = d.refs[s]
		}
		if d.refs[s] += delta; d.refs[s] == 0 {
			delete(d.refs, s)
		}
	}
	for _, run := range runs {
		for _, ev := range run {
			if ev.Chain != chainKubeServices {
				continue
			}
			if old, ok := d.byHandle[ev.Handle]; ok {
				delete(d.byHandle, ev.Handle)
				count(old, -1)
			}
			if !ev.Deleted && ev.rule != nil && ev.rule.svc != nil {
				d.byHandle[ev.Handle] = ev.rule.svc
				count(ev.rule.svc, +1)
			}
		}
	}
	for s, n := range d.before {
		if (n > 0) != (d.refs[s] > 0) {
			d.changed = true
			break
		}
	}
}

// services lists the dispatch rules sorted (sortServices), returning old, and false, when
// no service appeared or went since the list was last made.
func (d *dispatchRules) services(old []ruleset.Service) ([]ruleset.Service, bool) {
	if !d.changed && old != nil {
		return old, false
	}
	d.changed = false
	d.list = d.list[:0]
	for _, s := range d.byHandle {
		d.list = append(d.list, *s)
	}
	sortServices(d.list)
	if slices.Equal(d.list, old) {
		return old, false
	}
	return slices.Clone(d.list), true
}

// sortServices orders dispatch rules by cluster IP, port and protocol. kube-proxy writes
// KUBE-SERVICES in a new order at every sync (it walks a map); a sorted list is the same
// from one sync to the next, and the same from a dump as from rule messages.
func sortServices(s []ruleset.Service) {
	slices.SortFunc(s, func(a, b ruleset.Service) int {
		return cmp.Or(a.ClusterIP.Compare(b.ClusterIP), cmp.Compare(a.Port, b.Port), cmp.Compare(a.Protocol, b.Protocol), cmp.Compare(a.Chain, b.Chain))
	})
}

// dispatchUpdate is what a run of changes did to iptables-nft's KUBE-SERVICES, past the
// generation its dispatch rules are current at.
type dispatchUpdate struct {
	named  bool          // a change named the chain
	unkept bool          // a change named it without its rule messages: it must be dumped
	rules  [][]RuleEvent // the changes' decoded rule messages, in order
	gen    uint32        // the last such change's generation
}

// add notes change d, whose commit produced generation gen, to a table whose dispatch rules
// are current at generation since.
func (u *dispatchUpdate) add(gen, since uint32, d *TableChange) {
	if !slices.Contains(d.Chains, chainKubeServices) || !genAfter(gen, since) {
		return // in the dispatch rules already
	}
	u.named, u.gen = true, gen
	if d.RulesDropped || !slices.Contains(d.KeptChains, chainKubeServices) {
		u.unkept = true
		return
	}
	u.rules = append(u.rules, d.Rules)
}

// genAfter reports whether generation a came after b, the counter wrapping around.
func genAfter(a, b uint32) bool { return int32(a-b) > 0 }

// updateDispatch brings KUBE-SERVICES's dispatch rules up to date with u, from its rule
// messages when it can, else by dumping the chain; it reports whether the services changed.
func (f *Follower) updateDispatch(ctx context.Context, ft *followed, u *dispatchUpdate) (bool, error) {
	if u == nil || !u.named {
		return false, nil
	}
	family := ft.table.Family
	if u.unkept || ft.dispatch == nil {
		var nr *natReader
		gen, err := consistentlyAt(ctx, f.q, func() error {
			return f.dumpChain(ctx, family, "nat", chainKubeServices, func() { nr = newNATReader(family) }, func(r *ruleMsg) error { return nr.rule(r) })
		})
		if err != nil {
			return false, err
		}
		ft.dispatch = newDispatchRules(nr, gen)
	} else {
		ft.dispatch.apply(u.rules)
		ft.dispatch.gen = u.gen
	}
	var changed bool
	ft.services, changed = ft.dispatch.services(ft.services)
	return changed, nil
}
