package nftnl

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/proxyhealth/proxyhealth/internal/ruleset"
)

// ForwardReader reads the forward path's rules for the conntrack INVALID drop search
// (ruleset.Graph.InvalidDropPath): the filter table of iptables-nft ("iptables-nft filter",
// "ip6tables-nft filter", entry FORWARD), and every native nf_tables table with base chains on
// the forward hook (named "inet fw", entries those base chains by priority). Only the chains
// reachable from the entries are read, each with a chain-filtered dump, so kube-proxy's own
// nftables table (whose filter-forward chain is on the forward hook) costs a few chains, not
// its thousands of service chains. Tables iptables-nft owns other than filter are left out,
// as the iptables-save based check does.
//
// It follows them as they change. Listing the base
// chains takes a dump of every chain of every table (at 10,000 Services, over 100,000 of
// kube-proxy's), so it is done again only when a change may have added or removed a base
// chain; a forward table's graph is read again only when a change touched that table.
//
// It keeps one socket open between reads (closing a netfilter netlink socket costs the kernel
// more than the small reads it serves); Close closes it.
type ForwardReader struct {
	// Limits bounds the replies the reader accepts (the zero value: the defaults); a reply past
	// them fails the Read with ErrDumpTooLarge. It takes effect when the reader opens its
	// socket: at the first Read, and at the first after Close.
	Limits Limits

	tables []tableChains // the tables with forward base chains, from the last listing
	graphs []*ruleset.Graph
	listed bool
	sock   *nlSocket
}

// Read returns the forward graphs after changes (the Watch's, since the last Read); nil
// changes, or a Resync among them, read everything again.
func (r *ForwardReader) Read(ctx context.Context, changes []Change) ([]*ruleset.Graph, error) {
	if r.sock == nil {
		s, err := dial(r.Limits)
		if err != nil {
			return nil, err
		}
		r.sock = s
	}
	return r.read(ctx, r.sock, changes)
}

// Close closes the reader's socket; a later Read opens another.
func (r *ForwardReader) Close() error {
	if r.sock == nil {
		return nil
	}
	err := r.sock.Close()
	r.sock = nil
	return err
}

func (r *ForwardReader) read(ctx context.Context, q querier, changes []Change) ([]*ruleset.Graph, error) {
	if !r.listed || relist(changes) {
		r.listed = false
		var tables []tableChains
		var graphs []*ruleset.Graph
		err := consistently(ctx, q, func() error {
			var err error
			tables, graphs, err = forwardTablesAndGraphs(ctx, q)
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("read forward path rules: %w", err)
		}
		r.tables, r.graphs, r.listed = tables, graphs, true
		return nonNil(r.graphs), nil
	}
	for i, t := range r.tables {
		if !touched(changes, Table{Family: t.family, Name: t.name}) {
			continue
		}
		var g *ruleset.Graph
		err := consistently(ctx, q, func() error {
			var err error
			g, err = readGraph(ctx, q, t)
			return err
		})
		if err != nil {
			r.listed = false // start over next time
			return nil, fmt.Errorf("read forward path rules of %s: %w", Table{Family: t.family, Name: t.name}, err)
		}
		r.graphs[i] = g
	}
	return nonNil(r.graphs), nil
}

// relist says whether changes may have added or removed a base chain, or lost track.
func relist(changes []Change) bool {
	if changes == nil {
		return true
	}
	for _, c := range changes {
		if c.Resync {
			return true
		}
		for _, d := range c.Details {
			if d.TableEvent || d.BaseChainEvent {
				return true
			}
		}
	}
	return false
}

func touched(changes []Change, t Table) bool {
	for _, c := range changes {
		if slices.Contains(c.Tables, t) {
			return true
		}
	}
	return false
}

// forwardTablesAndGraphs lists the tables with forward base chains and reads each one's graph
// (nil where there is none to read), in the same order.
func forwardTablesAndGraphs(ctx context.Context, q querier) ([]tableChains, []*ruleset.Graph, error) {
	chains, err := dumpBaseChains(ctx, q)
	if err != nil {
		return nil, nil, err
	}
	tables := forwardTables(chains)
	graphs := make([]*ruleset.Graph, len(tables))
	for i, t := range tables {
		if graphs[i], err = readGraph(ctx, q, t); err != nil {
			return nil, nil, err
		}
	}
	return tables, graphs, nil
}

func nonNil(graphs []*ruleset.Graph) []*ruleset.Graph {
	var out []*ruleset.Graph
	for _, g := range graphs {
		if g != nil {
			out = append(out, g)
		}
	}
	return out
}

// tableChains is one table with its base chains.
type tableChains struct {
	family uint8
	name   string
	base   []baseChain
}

// forwardTables groups base chains by table and keeps the tables with a forward base chain,
// in a stable order.
func forwardTables(chains []baseChain) []tableChains {
	type key struct {
		family uint8
		name   string
	}
	byTable := map[key]*tableChains{}
	var order []key
	for _, c := range chains {
		k := key{c.family, c.table}
		t := byTable[k]
		if t == nil {
			t = &tableChains{family: c.family, name: c.table}
			byTable[k] = t
			order = append(order, k)
		}
		t.base = append(t.base, c)
	}
	var out []tableChains
	for _, k := range order {
		t := byTable[k]
		if slices.ContainsFunc(t.base, isForward) {
			out = append(out, *t)
		}
	}
	return out
}

// iptables' table and built-in chain names: a table of these names in ip, ip6, arp or bridge
// whose base chains all carry built-in names is iptables-nft's (as internal/testsupport/nft decides from
// `nft -j` output), as is any table with an x_tables compatibility expression.
var (
	iptablesTables = map[string]bool{"filter": true, "nat": true, "mangle": true, "raw": true, "security": true}
	iptablesChains = map[string]bool{"PREROUTING": true, "INPUT": true, "FORWARD": true, "OUTPUT": true, "POSTROUTING": true}
)

func namedLikeIPTables(t tableChains) bool {
	switch t.family {
	case unix.NFPROTO_IPV4, unix.NFPROTO_IPV6, unix.NFPROTO_ARP, unix.NFPROTO_BRIDGE:
	default:
		return false
	}
	if !iptablesTables[t.name] {
		return false
	}
	for _, c := range t.base {
		if !iptablesChains[c.name] {
			return false
		}
	}
	return true
}

// graphReader reads the chains reachable from a table's forward base chains.
type graphReader struct {
	in      interp
	t       tableChains
	g       *ruleset.Graph
	queue   []string
	sawXT   bool
	pending []pendingSet // set lookups to resolve once the chains are read
}

// pendingSet is a verdict map or ct state set a rule looks up, resolved from the set's
// elements.
type pendingSet struct {
	chain string
	rule  int
	ref   setRef
	vmap  bool
}

func readGraph(ctx context.Context, q querier, t tableChains) (*ruleset.Graph, error) {
	gr := &graphReader{in: interp{family: t.family}, t: t,
		g: &ruleset.Graph{Name: familyName(t.family) + " " + t.name, Chains: map[string]*ruleset.Chain{}}}
	fwd := slices.DeleteFunc(slices.Clone(t.base), func(c baseChain) bool { return !isForward(c) })
	slices.SortStableFunc(fwd, func(a, b baseChain) int { return cmp.Compare(a.priority, b.priority) })
	for _, c := range fwd {
		gr.g.Entries = append(gr.g.Entries, c.name)
		gr.enqueue(c.name)
	}
	// Bounded by the table's chains: each is read once.
	for len(gr.queue) > 0 || len(gr.pending) > 0 {
		for len(gr.queue) > 0 {
			name := gr.queue[0]
			gr.queue = gr.queue[1:]
			if err := gr.readChain(ctx, q, name); err != nil {
				return nil, err
			}
		}
		pending := gr.pending
		gr.pending = nil
		for _, p := range pending {
			if err := gr.resolve(ctx, q, p); err != nil {
				return nil, err
			}
		}
	}
	if gr.sawXT || namedLikeIPTables(t) {
		if t.name != "filter" || (t.family != unix.NFPROTO_IPV4 && t.family != unix.NFPROTO_IPV6) {
			return nil, nil
		}
		gr.g.Name = "iptables-nft filter"
		if t.family == unix.NFPROTO_IPV6 {
			gr.g.Name = "ip6tables-nft filter"
		}
	}
	return gr.g, nil
}

func (gr *graphReader) enqueue(chain string) {
	if _, seen := gr.g.Chains[chain]; seen {
		return
	}
	gr.g.Chains[chain] = &ruleset.Chain{Name: chain}
	gr.queue = append(gr.queue, chain)
}

func (gr *graphReader) readChain(ctx context.Context, q querier, name string) error {
	c := gr.g.Chains[name]
	err := dumpRules(ctx, q, gr.t.family, gr.t.name, name, func(r *ruleMsg) error {
		f, err := gr.in.rule(r.exprs)
		if err != nil {
			return fmt.Errorf("chain %s handle %d: %w", name, r.handle, err)
		}
		gr.sawXT = gr.sawXT || hasXT(r.exprs)
		rule := ruleset.Rule{Desc: gr.desc(name, r, f), Ct: f.ct, Conditional: f.other}
		if f.hasVerdict {
			rule.Verdict = ruleset.Verdict{Kind: f.verdict}
			if f.verdict == ruleset.Jump || f.verdict == ruleset.Goto {
				rule.Verdict.Target = string(f.target)
				gr.enqueue(rule.Verdict.Target)
			}
		}
		c.Rules = append(c.Rules, rule)
		for _, v := range f.vmaps {
			gr.pending = append(gr.pending, pendingSet{chain: name, rule: len(c.Rules) - 1, ref: cloneRef(v), vmap: true})
		}
		for _, s := range f.setLookups {
			gr.pending = append(gr.pending, pendingSet{chain: name, rule: len(c.Rules) - 1, ref: cloneRef(s)})
		}
		return nil
	})
	if isNotExist(err) {
		return nil // a jump to a chain deleted since: nothing to follow
	}
	return err
}

func cloneRef(r setRef) setRef {
	r.set = bytes.Clone(r.set)
	return r
}

// desc locates a rule: "inet fw forward handle 3", with its comment when it has one (kube-proxy
// comments its iptables rules).
func (gr *graphReader) desc(chain string, r *ruleMsg, f *ruleFacts) string {
	d := familyName(gr.t.family) + " " + gr.t.name + " " + chain + " handle " + strconv.FormatUint(r.handle, 10)
	comment, ok := ruleComment(r.userdata)
	if !ok {
		comment = f.comment
	}
	if len(comment) > 0 {
		d += " " + strconv.Quote(string(comment))
	}
	return d
}

// resolve reads a looked-up set's elements into the rule: a verdict map's entries (and the
// chains they lead to), or whether a ct state set holds invalid.
func (gr *graphReader) resolve(ctx context.Context, q querier, p pendingSet) error {
	rule := &gr.g.Chains[p.chain].Rules[p.rule]
	hasInvalid := false
	err := dumpElements(ctx, q, gr.t.family, gr.t.name, string(p.ref.set), func(e *element) error {
		keyInvalid := p.ref.keyCtState && bytes.Equal(e.key, ctStateInvalid)
		hasInvalid = hasInvalid || keyInvalid
		if !p.vmap || !e.hasVerdict || e.intervalEnd {
			return nil
		}
		v := ruleset.Verdict{Kind: e.verdict}
		if e.verdict == ruleset.Jump || e.verdict == ruleset.Goto {
			v.Target = string(e.target)
			gr.enqueue(v.Target)
		}
		rule.VMap = append(rule.VMap, ruleset.VMapEntry{KeyIsCtState: p.ref.keyCtState, KeyInvalid: keyInvalid, Verdict: v})
		return nil
	})
	if err != nil {
		return err
	}
	if !p.vmap {
		// `ct state @set` (or `!= @set`): as a comparison, evaluated for an INVALID packet.
		if hasInvalid != p.ref.invert {
			if rule.Ct != ruleset.CtExcludes {
				rule.Ct = ruleset.CtInvalid
			}
		} else {
			rule.Ct = ruleset.CtExcludes
		}
	}
	return nil
}

// hasXT reports an x_tables compatibility expression: iptables-nft's mark on its tables.
func hasXT(exprs []byte) bool {
	found := false
	_ = eachExpr(exprs, func(name, _ []byte) {
		found = found || string(name) == "match" || string(name) == "target"
	})
	return found
}
