package nftnl

// The Follower's part both backends share: its tables, Apply's merging of changes, whole and
// partial reads dispatched by kind, and the service chains' state a ProxyTable is built from.
// Each backend's reading is in its own file: follownat.go (iptables-nft) and follownft.go
// (nftables mode).

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync/atomic"

	"golang.org/x/sys/unix"

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

	chains    map[string]*kpChain       // service chains that have rules
	endpoints map[string]netip.AddrPort // endpoint chains' DNAT destinations
	byTarget  chainIndex                // endpoint chain -> service chains naming it
	bySet     chainIndex                // set -> service chains using it
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
	mergeAnonSets(acc, d)
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
		err = f.fullNFT(ctx, ft)
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
	ft.byTarget, ft.bySet = chainIndex{}, chainIndex{}
	ft.services, ft.snap, ft.dispatch = nil, nil, nil
	ft.ruleCounts, ft.chainGen = map[string]int32{}, nil
}

// setChain replaces service chain name's state (c nil: the chain has no rules) and keeps the
// reverse indexes.
func (ft *followed) setChain(name string, c *kpChain) {
	if old := ft.chains[name]; old != nil {
		for _, t := range old.targets {
			ft.byTarget.remove(t, name)
		}
		for _, s := range old.sets() {
			ft.bySet.remove(s, name)
		}
		delete(ft.chains, name)
	}
	if c == nil {
		return
	}
	c.normalize()
	ft.chains[name] = c
	for _, t := range c.targets {
		ft.byTarget.add(t, name)
	}
	for _, s := range c.sets() {
		ft.bySet.add(s, name)
	}
}

// normalize sorts c's inline endpoints, without duplicates, into an array of their own size:
// the reader's appends leave up to twice the room, and the snapshots share the array
// (endpointsOf) of a chain without endpoint chains, kube-proxy's usual one.
func (c *kpChain) normalize() {
	slices.SortFunc(c.eps, netip.AddrPort.Compare)
	eps := slices.Compact(c.eps)
	c.eps = append(make([]netip.AddrPort, 0, len(eps)), eps...)
}

func (c *kpChain) sets() []string {
	out := slices.Clone(c.vmaps)
	for _, m := range c.dnatMaps {
		out = append(out, m.set)
	}
	return out
}

// chainIndex is a reverse index: an endpoint chain or a set to the service chains that name
// it. Nearly every key has one (kube-proxy names an endpoint chain and a map from one service
// chain), so each holds a short slice rather than a set of its own: a map per key cost about
// 250 bytes, 7.7 MiB of the iptables-nft Follower's heap at 3,000 Services x 10 endpoints.
type chainIndex map[string][]string

func (ix chainIndex) add(key, chain string) {
	if !slices.Contains(ix[key], chain) {
		ix[key] = append(ix[key], chain)
	}
}

func (ix chainIndex) remove(key, chain string) {
	chains := ix[key]
	i := slices.Index(chains, chain)
	switch {
	case i < 0:
	case len(chains) == 1:
		delete(ix, key)
	default:
		ix[key] = slices.Delete(chains, i, i+1)
	}
}

// endpointsOf is what service chain c DNATs to.
func (ft *followed) endpointsOf(c *kpChain) []netip.AddrPort {
	if len(c.targets) == 0 {
		return c.eps // normalized: the usual chain's endpoints, held once
	}
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
	pt := &ruleset.ProxyTable{Services: ft.services, ID: ruleset.NextID()}
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
	pt.Deltas = deltasAfter(old, affected)
	return pt
}

// A followed table tells what changed since the last maxDeltas tables before it, as long as
// no more than maxDeltaChains chains did: a drift check that compared an earlier table then
// compares again only the service ports whose chains changed, not every port at every sync.
const (
	maxDeltas      = 8
	maxDeltaChains = 1024
)

// deltasAfter is the Deltas of the table derived from old by changing the chains affected
// (which it keeps: the caller makes it for this build).
func deltasAfter(old *ruleset.ProxyTable, affected map[string]struct{}) []ruleset.Delta {
	if old.ID == 0 || len(affected) > maxDeltaChains {
		return nil
	}
	out := make([]ruleset.Delta, 0, min(len(old.Deltas)+1, maxDeltas))
	out = append(out, ruleset.Delta{Since: old.ID, Changed: affected})
	for _, d := range old.Deltas {
		if len(out) == maxDeltas || len(d.Changed)+len(affected) > maxDeltaChains {
			break
		}
		changed := maps.Clone(d.Changed)
		if changed == nil {
			changed = map[string]struct{}{}
		}
		maps.Copy(changed, affected)
		out = append(out, ruleset.Delta{Since: d.Since, Changed: changed})
	}
	return out
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
