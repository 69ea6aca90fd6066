package nftnl

// The Follower's iptables-nft side: kube-proxy's iptables mode in table ip/ip6 nat, read
// whole (fullNAT) and then kept up to date from the rules a change carries (KUBE-SERVICES by
// rule handle, service and endpoint chains rewritten whole) or by re-reading the chains it
// names (partialNAT, readNATChains).

import (
	"context"
	"net/netip"
	"slices"

	"github.com/proxyhealth/proxyhealth/internal/kubeproxynames"
)

func (f *Follower) fullNAT(ctx context.Context, ft *followed) error {
	ft.reset()
	ok, err := exists(ctx, f.q, ft.table.Family, "nat", "KUBE-SERVICES")
	if err != nil || !ok {
		return err
	}
	nr := newNATReader(ft.table.Family)
	if err := dumpRules(ctx, f.q, ft.table.Family, "nat", "", nr.rule); err != nil {
		return err
	}
	names := make([]string, len(nr.sepDNAT))
	for name, i := range nr.sepIndex {
		names[i] = name
	}
	for i, ap := range nr.sepDNAT {
		if ap.IsValid() {
			ft.endpoints[names[i]] = ap
		}
		if n := nr.sepRules[i]; n > 0 {
			ft.ruleCounts[names[i]] = n
		}
	}
	for chain, j := range nr.jumps {
		ft.setChain(chain, &kpChain{targets: sepNames(j.seps, names)})
		ft.ruleCounts[chain] = j.rules
	}
	ft.dispatch = newDispatchRules(nr, 0) // the generation is set once the read proves consistent
	ft.services = slices.Clone(nr.services)
	sortServices(ft.services)
	ft.snap = ft.build(nil, nil)
	return nil
}

func (f *Follower) partialNAT(ctx context.Context, ft *followed, gone map[string]bool, u *dispatchUpdate, e *chainEdits, affected map[string]struct{}) (bool, error) {
	family := ft.table.Family
	if gone[chainKubeServices] {
		// Declared again at each sync (an update of the chain); deleted, the table is not
		// kube-proxy's any more, unless it was created again since.
		ok, err := exists(ctx, f.q, family, "nat", "KUBE-SERVICES")
		if err != nil {
			return false, err
		}
		if !ok {
			ft.reset()
			return false, nil
		}
	}
	servicesChanged, err := f.updateDispatch(ctx, ft, u)
	if err != nil {
		return false, err
	}
	if e == nil {
		return servicesChanged, nil
	}
	var reads []string
	for _, chain := range e.order {
		ed := e.edits[chain]
		switch {
		case ed.read:
			reads = append(reads, chain)
		case kubeproxynames.IsIPTablesServiceChain(chain):
			ft.setServiceChain(chain, targets(ed.rules), int32(len(ed.rules)), affected)
		default:
			ft.setEndpointChain(chain, endpoint(ed.rules), int32(len(ed.rules)), affected)
		}
	}
	if err := f.readNATChains(ctx, ft, reads, e.gen, affected); err != nil {
		return false, err
	}
	if genAfter(e.gen, ft.gen) {
		ft.gen = e.gen
	}
	for chain, g := range ft.chainGen {
		if !genAfter(g, ft.gen) {
			delete(ft.chainGen, chain) // no change to come can be older than its read
		}
	}
	return servicesChanged, nil
}

// readNATChains reads service and endpoint chains whose rules the changes, up to generation
// last, did not tell.
func (f *Follower) readNATChains(ctx context.Context, ft *followed, chains []string, last uint32, affected map[string]struct{}) error {
	if len(chains) == 0 {
		return nil
	}
	family := ft.table.Family
	var nr *natReader
	gen, err := consistentlyAt(ctx, f.q, func() error {
		nr = newNATReader(family)
		for _, chain := range chains {
			// One reader for all: a retried dump must not leave the chain's earlier rules.
			forget := func() {
				delete(nr.jumps, chain)
				if i, ok := nr.sepIndex[chain]; ok {
					nr.sepDNAT[i], nr.sepRules[i] = netip.AddrPort{}, 0
				}
			}
			if err := f.dumpChain(ctx, family, "nat", chain, forget, func(r *ruleMsg) error { return nr.rule(r) }); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	names := make([]string, len(nr.sepDNAT))
	for n, i := range nr.sepIndex {
		names[i] = n
	}
	for _, chain := range chains {
		if kubeproxynames.IsIPTablesServiceChain(chain) {
			j := nr.jumps[chain]
			ft.setServiceChain(chain, sepNames(j.seps, names), j.rules, affected)
		} else {
			var ap netip.AddrPort
			var n int32
			if i, ok := nr.sepIndex[chain]; ok {
				ap, n = nr.sepDNAT[i], nr.sepRules[i]
			}
			ft.setEndpointChain(chain, ap, n, affected)
		}
		// Changes up to gen are in the read: their messages must not be applied again.
		if genAfter(gen, last) {
			if ft.chainGen == nil {
				ft.chainGen = map[string]uint32{}
			}
			ft.chainGen[chain] = gen
		}
	}
	return nil
}

// setServiceChain records service chain name's jumps to endpoint chains and its rule count
// (0: it has no rules, or is gone).
func (ft *followed) setServiceChain(name string, targets []string, rules int32, affected map[string]struct{}) {
	var c *kpChain
	if rules > 0 {
		c = &kpChain{targets: targets}
	}
	ft.setChain(name, c)
	ft.setRuleCount(name, rules)
	affected[name] = struct{}{}
}

// setEndpointChain records endpoint chain name's DNAT destination (invalid: none) and its rule
// count (0: it has no rules, or is gone).
func (ft *followed) setEndpointChain(name string, ap netip.AddrPort, rules int32, affected map[string]struct{}) {
	if ap.IsValid() {
		ft.endpoints[name] = ap
	} else {
		delete(ft.endpoints, name)
	}
	ft.setRuleCount(name, rules)
	for _, s := range ft.byTarget[name] {
		affected[s] = struct{}{}
	}
}

func (ft *followed) setRuleCount(name string, rules int32) {
	if rules > 0 {
		ft.ruleCounts[name] = rules
	} else {
		delete(ft.ruleCounts, name)
	}
}
