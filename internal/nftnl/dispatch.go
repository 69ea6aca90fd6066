package nftnl

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"github.com/proxyhealth/proxyhealth/internal/ruleset"
)

const chainKubeServices = "KUBE-SERVICES"

// FollowerKeepsRules selects the chains whose rule messages a Follower applies rather than
// dumping the chain again (see KeepRules): iptables-nft's KUBE-SERVICES, which kube-proxy
// rewrites whole at every sync.
func FollowerKeepsRules(t Table, chain []byte) bool {
	return t.Name == "nat" && string(chain) == chainKubeServices
}

// dispatchRules is iptables-nft's KUBE-SERVICES: its service dispatch rules by rule handle.
// kube-proxy deletes and adds every rule of that chain at every sync; the watch's rule
// messages are applied to it instead of dumping thousands of rules again.
type dispatchRules struct {
	byHandle map[uint64]ruleset.Service
	// gen is the generation the rules are current at: the messages of commits up to it are
	// in them already.
	gen uint32
	// decoded remembers what each rule body decodes to, a dispatch or not: the rules written
	// again at each sync are the same bytes, decoded once.
	decoded map[string]decodedRule
	// handles and list are scratch space for services.
	handles []uint64
	list    []ruleset.Service
}

type decodedRule struct {
	svc      ruleset.Service
	dispatch bool
}

// newDispatchRules keeps the dispatch rules nr read, current at generation gen.
func newDispatchRules(nr *natReader, gen uint32) *dispatchRules {
	d := &dispatchRules{byHandle: make(map[uint64]ruleset.Service, len(nr.services)), gen: gen, decoded: map[string]decodedRule{}}
	for i, s := range nr.services {
		d.byHandle[nr.handles[i]] = s
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

// apply applies a run of rule messages of the chain.
func (d *dispatchRules) apply(family uint8, events []RuleEvent) error {
	var nr *natReader
	for _, ev := range events {
		if ev.Deleted {
			delete(d.byHandle, ev.Handle)
			continue
		}
		r, err := parseRule(ev.attrs)
		if err != nil {
			return fmt.Errorf("rule message of chain %s: %w", chainKubeServices, err)
		}
		dec, ok := d.decoded[string(r.body)]
		if !ok || r.body == nil {
			if nr == nil {
				nr = newNATReader(family)
			}
			nr.services, nr.handles = nr.services[:0], nr.handles[:0]
			if err := nr.rule(&r); err != nil {
				return err
			}
			if len(nr.services) == 1 {
				dec = decodedRule{svc: nr.services[0], dispatch: true}
			}
			if r.body != nil {
				d.decoded[string(r.body)] = dec
			}
		}
		if dec.dispatch {
			d.byHandle[ev.Handle] = dec.svc
		} else {
			delete(d.byHandle, ev.Handle)
		}
	}
	// Bodies of rules long gone are forgotten, a generous bound keeping those of the rules
	// now in the chain.
	if len(d.decoded) > 2*len(d.byHandle)+64 {
		clear(d.decoded)
	}
	return nil
}

// services lists the dispatch rules in rule handle order, which is the chain's order for
// rules appended as iptables-restore writes them. It returns old, and false, when the list
// is the same.
func (d *dispatchRules) services(old []ruleset.Service) ([]ruleset.Service, bool) {
	d.handles = slices.AppendSeq(d.handles[:0], maps.Keys(d.byHandle))
	slices.Sort(d.handles)
	d.list = d.list[:0]
	for _, h := range d.handles {
		d.list = append(d.list, d.byHandle[h])
	}
	if slices.Equal(d.list, old) {
		return old, false
	}
	return slices.Clone(d.list), true
}

// dispatchUpdate is what a run of changes did to iptables-nft's KUBE-SERVICES, past the
// generation its dispatch rules are current at.
type dispatchUpdate struct {
	named  bool        // a change named the chain
	unkept bool        // a change named it without its rule messages: it must be dumped
	rules  []RuleEvent // the changes' rule messages of the chain, in order
	gen    uint32      // the last such change's generation
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
	for _, r := range d.Rules {
		if r.Chain == chainKubeServices {
			u.rules = append(u.rules, r)
		}
	}
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
		fresh := newDispatchRules(nr, gen)
		if ft.dispatch != nil {
			fresh.decoded = ft.dispatch.decoded
		}
		ft.dispatch = fresh
	} else {
		if err := ft.dispatch.apply(family, u.rules); err != nil {
			return false, err
		}
		ft.dispatch.gen = u.gen
	}
	var changed bool
	ft.services, changed = ft.dispatch.services(ft.services)
	return changed, nil
}
