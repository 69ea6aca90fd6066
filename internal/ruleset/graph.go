package ruleset

// Graph is one table's chains reduced to what decides whether a packet in conntrack state
// INVALID is dropped on the forward path: per rule, how it matches ct state, whether anything
// else restricts it, and its verdict. Readers of every backend build it; InvalidDropPath
// searches it.
type Graph struct {
	// Name says where the graph came from, for paths and errors ("iptables-legacy filter",
	// "iptables-nft filter", "inet fw").
	Name string
	// Chains by name.
	Chains map[string]*Chain
	// Entries are the chains a forwarded packet traverses: iptables' FORWARD, or every
	// nftables base chain on the forward hook (an accept in one does not stop the packet
	// from traversing the others).
	Entries []string
}

// Chain is one chain's rules in order.
type Chain struct {
	Name  string
	Rules []Rule
}

// CtMatch is how a rule's conntrack state matches relate to INVALID.
type CtMatch uint8

const (
	CtNone     CtMatch = iota // no ct state match
	CtInvalid                 // matches INVALID packets (among others, perhaps)
	CtExcludes                // matches only packets that are not INVALID
)

// VerdictKind is what a rule does with the packets it matches.
type VerdictKind uint8

const (
	Continue VerdictKind = iota // no verdict (a counter, a log, a mark): on to the next rule
	Accept
	Drop
	Reject
	Return
	Jump
	Goto
)

// Verdict is a rule's verdict; Target names the chain of a Jump or Goto.
type Verdict struct {
	Kind   VerdictKind
	Target string
}

// Rule is one rule as the INVALID-drop search sees it.
type Rule struct {
	// Desc locates the rule for an operator: its iptables-save form, or
	// "inet fw forward handle 3".
	Desc string
	Ct   CtMatch
	// Conditional is set when anything besides a ct state match restricts which packets
	// reach the verdict (an interface, an address, a match the reader does not know). Rate
	// limits and counters do not: a drop behind them still drops INVALID packets.
	Conditional bool
	Verdict     Verdict
	// VMap holds the entries of an anonymous verdict map (nftables' `KEY vmap { ... }`),
	// tried after Verdict.
	VMap []VMapEntry
}

// VMapEntry is one verdict of a verdict map. SeesInvalid is whether INVALID packets can take
// it: with a ct state key, whether the entry's key includes invalid; with any other key, whether
// INVALID packets reach the rule at all.
type VMapEntry struct {
	KeyIsCtState bool
	KeyInvalid   bool // with KeyIsCtState: the key includes invalid
	Verdict      Verdict
}

// InvalidDropPath returns the rules followed from an entry chain to a rule that drops packets
// in state INVALID, or nil when none is reachable. A rule counts when its verdict is a drop
// and it matches INVALID positively (a ct state match whose set includes invalid); other
// matches do not disqualify it (kube-proxy's own rule carries an nfacct match; a drop limited
// to one interface is still reported, with the rule in the path to show it). A jump that
// matches INVALID into a chain whose rule is a plain drop counts too. Within a chain the search
// stops at an unconditional accept, drop, reject, return or goto, and an unconditional jump
// into a chain that ends every packet's traversal ends the caller's too. Cycles are visited
// once.
func (g *Graph) InvalidDropPath() []string {
	if g == nil {
		return nil
	}
	for _, entry := range g.Entries {
		c := g.Chains[entry]
		if c == nil {
			continue
		}
		w := walker{g: g, seen: map[walkKey]bool{}}
		if path, _ := w.walk(c, false, []string{g.Name + " " + entry}); path != nil {
			return path
		}
	}
	return nil
}

type walkKey struct {
	chain       string
	invalidOnly bool
}

type walker struct {
	g    *Graph
	seen map[walkKey]bool
}

// walk returns the path to an INVALID drop, or nil; terminal reports that the chain ends every
// packet's traversal (an unconditional accept, drop or reject), so the caller must stop too.
// invalidOnly is set when only INVALID packets can reach c (it was jumped to by a rule that
// matched INVALID).
func (w *walker) walk(c *Chain, invalidOnly bool, path []string) (found []string, terminal bool) {
	k := walkKey{c.Name, invalidOnly}
	if w.seen[k] {
		return nil, false
	}
	w.seen[k] = true
	for i := range c.Rules {
		r := &c.Rules[i]
		here := append(path[:len(path):len(path)], r.Desc)
		matchesInvalid := r.Ct == CtInvalid || (invalidOnly && r.Ct != CtExcludes)
		uncond := !r.Conditional && r.Ct == CtNone
		if f, term := w.verdict(r.Verdict, matchesInvalid, r.Ct == CtExcludes, uncond, here); f != nil || term {
			return f, term
		}
		if uncond && (r.Verdict.Kind == Goto || r.Verdict.Kind == Return) {
			return nil, false
		}
		for _, e := range r.VMap {
			mi, excludes := matchesInvalid, r.Ct == CtExcludes
			if e.KeyIsCtState {
				mi = e.KeyInvalid && !excludes
				excludes = excludes || !e.KeyInvalid
			}
			if f, _ := w.verdict(e.Verdict, mi, excludes, false, here); f != nil {
				return f, false
			}
		}
	}
	return nil, false
}

// verdict handles one verdict taken by packets that may be INVALID (matchesInvalid) or that
// are certainly not (excludesInvalid). It returns a path when the verdict drops INVALID
// packets, and terminal when it is unconditional and ends the traversal.
func (w *walker) verdict(v Verdict, matchesInvalid, excludesInvalid, uncond bool, here []string) (found []string, terminal bool) {
	switch v.Kind {
	case Drop:
		if matchesInvalid {
			return here, false
		}
		return nil, uncond
	case Accept, Reject:
		return nil, uncond
	case Jump, Goto:
		next := w.g.Chains[v.Target]
		if next == nil || excludesInvalid {
			return nil, false
		}
		f, term := w.walk(next, matchesInvalid, here)
		return f, term && uncond
	}
	return nil, false
}
