package nftnl

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/proxyhealth/proxyhealth/internal/kubeproxynames"
	"github.com/proxyhealth/proxyhealth/internal/ruleset"
)

// Follower keeps kube-proxy's tables of both families (iptables-nft's `ip nat` / `ip6 nat`
// and nftables mode's `ip kube-proxy` / `ip6 kube-proxy`) up to date from watch Changes. It
// reads each table whole once, keeping what a ProxyTable is derived from (each service chain's
// endpoint chain jumps and maps, each endpoint chain's DNAT destination, the dispatch), and
// then re-reads only the chains and sets a Change names: kube-proxy's partial syncs rewrite a
// few chains and maps, while a whole read of a large table costs seconds of CPU.
//
// A Follower is not safe for concurrent use. The ProxyTables it returns are never modified
// afterwards: each Apply that changes a table publishes a new one, sharing what did not change.
type Follower struct {
	q      *countingQuerier
	sock   *nlSocket
	tables []*followed
}

// FollowStats counts a Follower's reads.
type FollowStats struct {
	FullReads    uint64 // whole-table reads
	RuleDumps    uint64 // rule dumps (a whole table's, or one chain's)
	ElementDumps uint64 // element dumps, one set each
}

type followKind uint8

const (
	kindNAT followKind = iota // iptables-nft's nat table
	kindNFT                   // nftables mode's kube-proxy table
)

// followed is one table's state.
type followed struct {
	table Table
	kind  followKind
	read  bool  // read at least once
	err   error // the last read failed: the next Apply reads the table whole
	snap  *ruleset.ProxyTable

	chains    map[string]*kpChain            // service chains that have rules
	endpoints map[string]netip.AddrPort      // endpoint chains' DNAT destinations
	byTarget  map[string]map[string]struct{} // endpoint chain -> service chains naming it
	bySet     map[string]map[string]struct{} // set -> service chains using it
	services  []ruleset.Service

	// dispatch is iptables-nft's KUBE-SERVICES dispatch rules (kindNAT), nil until read.
	dispatch *dispatchRules

	// kindNAT: gen is the generation the state is current at, the changes up to it being in
	// it already; ruleCounts counts the rules of each service and endpoint chain that has any;
	// chainGen is, for chains read since, the generation their read is current at.
	gen        uint32
	ruleCounts map[string]int32
	chainGen   map[string]uint32
}

// Followed reports whether t is one of the tables a Follower follows.
func Followed(t Table) bool {
	return (t.Family == unix.NFPROTO_IPV4 || t.Family == unix.NFPROTO_IPV6) && (t.Name == "nat" || t.Name == kubeProxyTable)
}

// NewFollower opens the Follower's socket, whose replies lim bounds (a reply past it fails the
// read of its table with ErrDumpTooLarge); it reads nothing until Resync or Apply.
func NewFollower(lim Limits) (*Follower, error) {
	s, err := dial(lim)
	if err != nil {
		return nil, err
	}
	return newFollower(s, s), nil
}

func newFollower(q querier, s *nlSocket) *Follower {
	f := &Follower{q: &countingQuerier{q: q}, sock: s}
	for _, family := range []uint8{unix.NFPROTO_IPV4, unix.NFPROTO_IPV6} {
		f.tables = append(f.tables,
			&followed{table: Table{Family: family, Name: "nat"}, kind: kindNAT},
			&followed{table: Table{Family: family, Name: kubeProxyTable}, kind: kindNFT})
	}
	return f
}

// Close closes the Follower's socket.
func (f *Follower) Close() error {
	if f.sock == nil {
		return nil
	}
	return f.sock.Close()
}

// Generation asks for the ruleset's current generation on the Follower's socket.
func (f *Follower) Generation(ctx context.Context) (uint32, error) { return generation(ctx, f.q) }

// Stats returns the reads made so far; unlike the rest, it may be called concurrently.
func (f *Follower) Stats() FollowStats {
	return FollowStats{FullReads: f.q.full.Load(), RuleDumps: f.q.rules.Load(), ElementDumps: f.q.elements.Load()}
}

// IPTablesNAT returns kube-proxy's iptables-mode rules as of the last read (nil when the nat
// table or its KUBE-SERVICES chain does not exist), and the last read's error.
func (f *Follower) IPTablesNAT(ipv6 bool) (*ruleset.ProxyTable, error) {
	return f.get(Table{Family: nfproto(ipv6), Name: "nat"})
}

// KubeProxyNFT returns kube-proxy's nftables-mode rules as of the last read (nil when the table
// does not exist), and the last read's error.
func (f *Follower) KubeProxyNFT(ipv6 bool) (*ruleset.ProxyTable, error) {
	return f.get(Table{Family: nfproto(ipv6), Name: kubeProxyTable})
}

func (f *Follower) get(t Table) (*ruleset.ProxyTable, error) {
	for _, ft := range f.tables {
		if ft.table == t {
			return ft.snap, ft.err
		}
	}
	return nil, nil
}

// Resync reads every followed table whole.
func (f *Follower) Resync(ctx context.Context) error {
	var errs []error
	for _, ft := range f.tables {
		errs = append(errs, f.full(ctx, ft))
	}
	return errors.Join(errs...)
}

// Apply brings the tables up to date with changes, in the order they came: a table a change
// names has the chains and sets it names re-read; one created or deleted, one a Resync
// covers, one whose last read failed or one whose change overflowed its detail is read whole.
// With no changes it only retries the tables whose last read failed.
func (f *Follower) Apply(ctx context.Context, changes ...Change) error {
	resync := false
	touched := map[*followed]*TableChange{}
	dispatch := map[*followed]*dispatchUpdate{}
	edits := map[*followed]*chainEdits{}
	for i := range changes {
		c := &changes[i]
		if c.Resync {
			resync = true
			continue
		}
		for _, ft := range f.tables {
			d := c.Touched(ft.table)
			if d == nil {
				if slices.Contains(c.Tables, ft.table) { // no detail: read it whole
					touched[ft] = &TableChange{Table: ft.table, Overflow: true}
				}
				continue
			}
			touched[ft] = mergeDetail(touched[ft], d)
			if ft.kind == kindNAT {
				if dispatch[ft] == nil {
					dispatch[ft] = &dispatchUpdate{}
				}
				dispatch[ft].add(c.Generation, ft.dispatch.current(), d)
				if edits[ft] == nil {
					edits[ft] = &chainEdits{}
				}
				edits[ft].add(ft, c.Generation, d)
			}
		}
	}
	var errs []error
	for _, ft := range f.tables {
		d := touched[ft]
		switch {
		case resync || !ft.read || ft.err != nil:
			errs = append(errs, f.full(ctx, ft))
		case d == nil:
		case d.TableEvent || d.Overflow || ft.snap == nil:
			errs = append(errs, f.full(ctx, ft))
		default:
			if err := f.partial(ctx, ft, d, dispatch[ft], edits[ft]); err != nil {
				ft.err = fmt.Errorf("read %s table: %w", ft.table, err)
				errs = append(errs, ft.err)
			}
		}
	}
	return errors.Join(errs...)
}

// mergeDetail adds d to acc (a copy, nil at first).
func mergeDetail(acc, d *TableChange) *TableChange {
	if acc == nil {
		acc = &TableChange{Table: d.Table}
	}
	acc.TableEvent = acc.TableEvent || d.TableEvent
	acc.Overflow = acc.Overflow || d.Overflow
	acc.Other = acc.Other || d.Other
	acc.Chains = append(acc.Chains, d.Chains...)
	acc.ChainEvents = append(acc.ChainEvents, d.ChainEvents...)
	acc.Sets = append(acc.Sets, d.Sets...)
	// A chain deleted by one change may be created again by a later one: the last says.
	if len(d.ChainEvents) > 0 {
		deleted := make(map[string]bool, len(acc.DeletedChains)+len(d.ChainEvents))
		for _, c := range acc.DeletedChains {
			deleted[c] = true
		}
		for _, c := range d.ChainEvents {
			deleted[c] = false
		}
		for _, c := range d.DeletedChains {
			deleted[c] = true
		}
		acc.DeletedChains = nil
		for c, gone := range deleted {
			if gone {
				acc.DeletedChains = append(acc.DeletedChains, c)
			}
		}
		slices.Sort(acc.DeletedChains)
	}
	return acc
}

// full reads ft whole and replaces its state.
func (f *Follower) full(ctx context.Context, ft *followed) error {
	f.q.full.Add(1)
	ft.read = true
	var err error
	switch ft.kind {
	case kindNAT:
		var gen uint32
		gen, err = consistentlyAt(ctx, f.q, func() error { return f.fullNAT(ctx, ft) })
		if err == nil {
			ft.gen = gen
			if ft.dispatch != nil {
				ft.dispatch.gen = gen
			}
		}
	case kindNFT:
		err = consistently(ctx, f.q, func() error { return f.fullNFT(ctx, ft) })
	}
	if err != nil {
		ft.err = fmt.Errorf("read %s table: %w", ft.table, err)
		ft.chains, ft.endpoints, ft.byTarget, ft.bySet, ft.services, ft.dispatch = nil, nil, nil, nil, nil, nil
		ft.ruleCounts, ft.chainGen = nil, nil
		return ft.err
	}
	ft.err = nil
	return nil
}

func (ft *followed) reset() {
	ft.chains, ft.endpoints = map[string]*kpChain{}, map[string]netip.AddrPort{}
	ft.byTarget, ft.bySet = map[string]map[string]struct{}{}, map[string]map[string]struct{}{}
	ft.services, ft.snap, ft.dispatch = nil, nil, nil
	ft.ruleCounts, ft.chainGen = map[string]int32{}, nil
}

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

func (f *Follower) fullNFT(ctx context.Context, ft *followed) error {
	ft.reset()
	family := ft.table.Family
	ok, err := exists(ctx, f.q, family, kubeProxyTable, "")
	if err != nil || !ok {
		return err
	}
	kr := &kpReader{in: interp{family: family}, chains: map[string]*kpChain{}, endpoints: map[string]netip.AddrPort{}}
	if err := dumpRules(ctx, f.q, family, kubeProxyTable, "", kr.rule); err != nil {
		return err
	}
	if err := kr.resolveMaps(ctx, f.q); err != nil {
		return err
	}
	ft.endpoints = kr.endpoints
	for name, c := range kr.chains {
		ft.setChain(name, c)
	}
	if ft.services, err = readServiceIPs(ctx, f.q, family); err != nil {
		return err
	}
	ft.snap = ft.build(nil, nil)
	return nil
}

// setChain replaces service chain name's state (c nil: the chain has no rules) and keeps the
// reverse indexes.
func (ft *followed) setChain(name string, c *kpChain) {
	if old := ft.chains[name]; old != nil {
		for _, t := range old.targets {
			unindex(ft.byTarget, t, name)
		}
		for _, s := range old.sets() {
			unindex(ft.bySet, s, name)
		}
		delete(ft.chains, name)
	}
	if c == nil {
		return
	}
	ft.chains[name] = c
	for _, t := range c.targets {
		index(ft.byTarget, t, name)
	}
	for _, s := range c.sets() {
		index(ft.bySet, s, name)
	}
}

func (c *kpChain) sets() []string {
	out := slices.Clone(c.vmaps)
	for _, m := range c.dnatMaps {
		out = append(out, m.set)
	}
	return out
}

func index(ix map[string]map[string]struct{}, key, chain string) {
	m := ix[key]
	if m == nil {
		m = map[string]struct{}{}
		ix[key] = m
	}
	m[chain] = struct{}{}
}

func unindex(ix map[string]map[string]struct{}, key, chain string) {
	if m := ix[key]; m != nil {
		delete(m, chain)
		if len(m) == 0 {
			delete(ix, key)
		}
	}
}

// endpointsOf is what service chain c DNATs to.
func (ft *followed) endpointsOf(c *kpChain) []netip.AddrPort {
	eps := make([]netip.AddrPort, 0, len(c.eps)+len(c.targets))
	eps = append(eps, c.eps...)
	for _, t := range c.targets {
		if ap, ok := ft.endpoints[t]; ok {
			eps = append(eps, ap)
		}
	}
	slices.SortFunc(eps, netip.AddrPort.Compare)
	return slices.Compact(eps)
}

// build derives a ProxyTable: from the state alone when old is nil, else from old with only
// the affected service chains recomputed. old is not modified.
func (ft *followed) build(old *ruleset.ProxyTable, affected map[string]struct{}) *ruleset.ProxyTable {
	pt := &ruleset.ProxyTable{Services: ft.services}
	if old == nil {
		pt.Chains = make(map[string][]netip.AddrPort, len(ft.chains))
		for name, c := range ft.chains {
			pt.Chains[name] = ft.endpointsOf(c)
		}
		return pt
	}
	pt.Chains = maps.Clone(old.Chains)
	for name := range affected {
		if c := ft.chains[name]; c != nil {
			pt.Chains[name] = ft.endpointsOf(c)
		} else {
			delete(pt.Chains, name)
		}
	}
	return pt
}

// partial re-reads the chains and sets d names; u is what the changes did to KUBE-SERVICES
// and e to the service and endpoint chains (iptables-nft).
func (f *Follower) partial(ctx context.Context, ft *followed, d *TableChange, u *dispatchUpdate, e *chainEdits) error {
	affected := map[string]struct{}{}
	// Chains the changes deleted have no rules to read.
	gone := make(map[string]bool, len(d.DeletedChains))
	for _, c := range d.DeletedChains {
		gone[c] = true
	}
	servicesChanged := false
	var err error
	switch ft.kind {
	case kindNAT:
		servicesChanged, err = f.partialNAT(ctx, ft, gone, u, e, affected)
	case kindNFT:
		servicesChanged, err = f.partialNFT(ctx, ft, d, gone, affected)
	}
	if err != nil {
		return err
	}
	if len(affected) > 0 || servicesChanged {
		ft.snap = ft.build(ft.snap, affected)
	}
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
	for s := range ft.byTarget[name] {
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

func (f *Follower) partialNFT(ctx context.Context, ft *followed, d *TableChange, gone map[string]bool, affected map[string]struct{}) (bool, error) {
	family := ft.table.Family
	var svcChains []string
	for _, chain := range uniq(d.Chains) {
		switch {
		case kubeproxynames.IsNFTServiceChain(chain):
			svcChains = append(svcChains, chain)
		case kubeproxynames.IsNFTEndpointChain(chain):
			var kr *kpReader
			reset := func() { kr = &kpReader{in: interp{family: family}, endpoints: map[string]netip.AddrPort{}} }
			reset()
			if !gone[chain] {
				if err := f.dumpChain(ctx, family, kubeProxyTable, chain, reset, func(r *ruleMsg) error { return kr.rule(r) }); err != nil {
					return false, err
				}
			}
			if ap, ok := kr.endpoints[chain]; ok {
				ft.endpoints[chain] = ap
			} else {
				delete(ft.endpoints, chain)
			}
			for s := range ft.byTarget[chain] {
				affected[s] = struct{}{}
			}
		}
	}
	servicesChanged := false
	for _, set := range uniq(d.Sets) {
		if set == "service-ips" {
			var err error
			if ft.services, err = readServiceIPs(ctx, f.q, family); err != nil {
				return false, err
			}
			servicesChanged = true
			continue
		}
		// A map's elements changed: re-read the service chains that use it.
		for s := range ft.bySet[set] {
			svcChains = append(svcChains, s)
		}
	}
	svcChains = uniq(svcChains)
	if len(svcChains) == 0 {
		return servicesChanged, nil
	}
	var kr *kpReader
	reset := func() {
		kr = &kpReader{in: interp{family: family}, chains: map[string]*kpChain{}, endpoints: map[string]netip.AddrPort{}}
	}
	reset()
	for _, chain := range svcChains {
		if gone[chain] {
			continue
		}
		// One reader for all: a retried dump must not leave the chain's earlier rules.
		forget := func() { delete(kr.chains, chain) }
		if err := f.dumpChain(ctx, family, kubeProxyTable, chain, forget, func(r *ruleMsg) error { return kr.rule(r) }); err != nil {
			return false, err
		}
	}
	if err := kr.resolveMaps(ctx, f.q); err != nil {
		return false, err
	}
	for _, chain := range svcChains {
		ft.setChain(chain, kr.chains[chain])
		affected[chain] = struct{}{}
	}
	return servicesChanged, nil
}

// dumpChain dumps one chain's rules, starting over (after reset) when a commit interrupted the
// dump. A chain that does not exist (any more) has no rules.
func (f *Follower) dumpChain(ctx context.Context, family uint8, table, chain string, reset func(), fn func(r *ruleMsg) error) error {
	var err error
	for range maxAttempts {
		reset()
		err = dumpRules(ctx, f.q, family, table, chain, fn)
		switch {
		case errors.Is(err, errInterrupted):
			continue
		case isNotExist(err):
			reset()
			return nil
		}
		return err
	}
	return fmt.Errorf("chain %s: %w", chain, err)
}

func uniq(s []string) []string {
	if len(s) < 2 {
		return s
	}
	s = slices.Clone(s)
	slices.Sort(s)
	return slices.Compact(s)
}

// countingQuerier counts the requests a Follower makes; Stats may be called concurrently.
type countingQuerier struct {
	q                     querier
	full, rules, elements atomic.Uint64
}

func (c *countingQuerier) query(ctx context.Context, req request, fn func(m message) error) error {
	switch req.typ {
	case unix.NFT_MSG_GETRULE:
		c.rules.Add(1)
	case unix.NFT_MSG_GETSETELEM:
		c.elements.Add(1)
	}
	return c.q.query(ctx, req, fn)
}
