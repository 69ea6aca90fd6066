package nft

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// iptablesTables are the table names iptables-nft creates in the ip and ip6 families.
var iptablesTables = map[string]bool{"filter": true, "nat": true, "mangle": true, "raw": true, "security": true}

// iptablesChains are iptables' built-in chain names.
var iptablesChains = map[string]bool{"PREROUTING": true, "INPUT": true, "FORWARD": true, "OUTPUT": true, "POSTROUTING": true}

// IptablesNFT reports whether the table belongs to iptables-nft: one of its rules uses an xt
// (x_tables compatibility) expression, which nft -j shows without its arguments, or it is an
// ip/ip6/arp/bridge table with an iptables table name whose base chains all carry iptables'
// built-in chain names. Such tables are read with iptables-nft-save instead.
func (t *Table) IptablesNFT() bool {
	for _, c := range t.Chains {
		for _, r := range c.Rules {
			for _, e := range r.Expr {
				if bytes.Contains(e, []byte(`"xt"`)) && stmtKind(e) == "xt" {
					return true
				}
			}
		}
	}
	switch t.Family {
	case "ip", "ip6", "arp", "bridge":
	default:
		return false
	}
	if !iptablesTables[t.Name] {
		return false
	}
	base := 0
	for _, c := range t.Chains {
		if c.Base() {
			if !iptablesChains[c.Name] {
				return false
			}
			base++
		}
	}
	return base > 0
}

func stmtKind(e json.RawMessage) string {
	var m map[string]json.RawMessage
	if json.Unmarshal(e, &m) != nil || len(m) != 1 {
		return ""
	}
	for k := range m {
		return k
	}
	return ""
}

// InvalidDropReachable reports whether a native nftables base chain on the forward hook (any
// family) reaches, directly or through jump/goto (also inside verdict maps), a rule that drops
// packets matching `ct state invalid`: a match of ct state against "invalid" or a set or list
// containing it (`ct state { invalid, untracked }`), `ct state & invalid == invalid`, or a
// `ct state vmap { invalid : drop, ... }`. `ct state != invalid` does not count. Other matches in
// the rule (an interface, an address) do not disqualify it. A jump that matches invalid into a
// chain with a plain drop counts too. Tables that iptables-nft owns are skipped (see
// Table.IptablesNFT). Every forward base chain is checked, since an accept in one does not stop
// the packet from traversing the others; within a chain, traversal stops at an unconditional
// accept, drop, reject, return or goto.
//
// path locates the rules followed, starting with the base chain, e.g.
// ["inet filter forward (hook forward)", "inet filter forward handle 3", "inet filter ct_checks handle 5"].
func InvalidDropReachable(rs *Ruleset) (bool, []string) {
	if rs == nil {
		return false, nil
	}
	for _, t := range rs.Tables {
		if t.IptablesNFT() {
			continue
		}
		for _, c := range t.Chains {
			if c.Hook != "forward" {
				continue
			}
			w := walker{t: t, seen: make(map[walkKey]bool)}
			start := fmt.Sprintf("%s %s %s (hook forward)", t.Family, t.Name, c.Name)
			if path, _ := w.walk(c, false, []string{start}); path != nil {
				return true, path
			}
		}
	}
	return false, nil
}

type walkKey struct {
	chain       string
	invalidOnly bool
}

type walker struct {
	t    *Table
	seen map[walkKey]bool
}

// ctMatch is how a rule's ct state matches relate to INVALID.
type ctMatch int

const (
	ctNone     ctMatch = iota // no ct state match
	ctInvalid                 // matches INVALID packets (among others, perhaps)
	ctExcludes                // matches only non-INVALID packets
)

// walk returns the path to an INVALID drop, or nil; terminal reports that the chain ends every
// packet's traversal (an unconditional accept or drop), so the caller must not continue.
func (w *walker) walk(c *Chain, invalidOnly bool, path []string) (found []string, terminal bool) {
	k := walkKey{c.Name, invalidOnly}
	if w.seen[k] {
		return nil, false
	}
	w.seen[k] = true
	for _, r := range c.Rules {
		here := append(path[:len(path):len(path)], r.String())
		ct := ctNone
		conditional := false
		for _, e := range r.Expr {
			var st map[string]json.RawMessage
			if json.Unmarshal(e, &st) != nil {
				conditional = true // unknown statement: assume it may not match
				continue
			}
			for kind, body := range st {
				switch kind {
				case "match":
					switch m := ctStateMatch(body); {
					case m == ctInvalid && ct != ctExcludes:
						ct = ctInvalid
					case m == ctExcludes:
						ct = ctExcludes
					default:
						conditional = true
					}
				case "counter", "comment", "log", "limit", "quota", "meta_set":
					// Do not restrict which packets reach the verdict (limit and quota do,
					// but only in rate: a drop behind them still drops INVALID packets).
				case "drop", "reject", "accept", "return", "jump", "goto":
					v := verdict{kind: kind}
					if kind == "jump" || kind == "goto" {
						v.target = verdictTarget(body)
					}
					matchesInvalid := ct == ctInvalid || (invalidOnly && ct != ctExcludes)
					uncond := !conditional && ct == ctNone
					if f, term := w.verdict(v, matchesInvalid, ct == ctExcludes, uncond, here); f != nil || term {
						return f, term
					}
					if uncond && (kind == "goto" || kind == "return") {
						return nil, false
					}
				case "vmap":
					if f := w.vmap(body, invalidOnly, ct, here); f != nil {
						return f, false
					}
				default:
					if kind != "xt" {
						conditional = true
					}
				}
			}
		}
	}
	return nil, false
}

type verdict struct{ kind, target string }

// verdict handles one verdict reached by packets that are INVALID (matchesInvalid) or are not
// (excludesInvalid). It returns a path when the verdict drops INVALID packets, and terminal when
// it is unconditional and ends the traversal.
func (w *walker) verdict(v verdict, matchesInvalid, excludesInvalid, uncond bool, here []string) (found []string, terminal bool) {
	switch v.kind {
	case "drop":
		if matchesInvalid {
			return here, false
		}
		return nil, uncond
	case "accept", "reject":
		return nil, uncond
	case "jump", "goto":
		next := w.t.Chain(v.target)
		if next == nil || excludesInvalid {
			return nil, false
		}
		f, term := w.walk(next, matchesInvalid, here)
		return f, term && uncond
	}
	return nil, false
}

// vmap handles `KEY vmap { k : verdict, ... }`. With KEY ct state, entries whose key includes
// invalid see INVALID packets; with any other key, entries see whatever reached the rule.
func (w *walker) vmap(body json.RawMessage, invalidOnly bool, ct ctMatch, here []string) []string {
	var m struct {
		Key  json.RawMessage `json:"key"`
		Data json.RawMessage `json:"data"`
	}
	if json.Unmarshal(body, &m) != nil {
		return nil
	}
	var data struct {
		Set []json.RawMessage `json:"set"`
	}
	if json.Unmarshal(m.Data, &data) != nil {
		return nil // a named map (@name) or an unknown form
	}
	onCtState := isCtState(m.Key)
	for _, elem := range data.Set {
		var pair []json.RawMessage
		if json.Unmarshal(elem, &pair) != nil || len(pair) != 2 {
			continue
		}
		var st map[string]json.RawMessage
		if json.Unmarshal(pair[1], &st) != nil {
			continue
		}
		for kind, vb := range st {
			v := verdict{kind: kind}
			if kind == "jump" || kind == "goto" {
				v.target = verdictTarget(vb)
			}
			matchesInvalid := ct == ctInvalid || (invalidOnly && ct != ctExcludes)
			excludes := ct == ctExcludes
			if onCtState {
				hasInvalid := containsInvalid(pair[0])
				matchesInvalid = hasInvalid && !excludes
				excludes = excludes || !hasInvalid
			}
			if f, _ := w.verdict(v, matchesInvalid, excludes, false, here); f != nil {
				return f
			}
		}
	}
	return nil
}

func verdictTarget(body json.RawMessage) string {
	var t struct {
		Target string `json:"target"`
	}
	_ = json.Unmarshal(body, &t)
	return t.Target
}

// ctStateMatch classifies a match statement's body.
func ctStateMatch(body json.RawMessage) ctMatch {
	var m struct {
		Op    string          `json:"op"`
		Left  json.RawMessage `json:"left"`
		Right json.RawMessage `json:"right"`
	}
	if json.Unmarshal(body, &m) != nil {
		return ctNone
	}
	if isCtState(m.Left) {
		switch m.Op {
		case "==", "in", "":
			if containsInvalid(m.Right) {
				return ctInvalid
			}
			return ctExcludes
		case "!=":
			if containsInvalid(m.Right) {
				return ctExcludes
			}
		}
		return ctNone
	}
	// ct state & MASK == VALUE, or ct state & MASK != 0.
	var bw struct {
		And []json.RawMessage `json:"&"`
	}
	if json.Unmarshal(m.Left, &bw) != nil || len(bw.And) != 2 || !isCtState(bw.And[0]) || !containsInvalid(bw.And[1]) {
		return ctNone
	}
	switch m.Op {
	case "==", "":
		if containsInvalid(m.Right) {
			return ctInvalid
		}
		return ctExcludes
	case "!=":
		if isZero(m.Right) {
			return ctInvalid
		}
		if containsInvalid(m.Right) {
			return ctExcludes
		}
	}
	return ctNone
}

func isCtState(raw json.RawMessage) bool {
	var e struct {
		Ct *struct {
			Key string `json:"key"`
		} `json:"ct"`
	}
	return json.Unmarshal(raw, &e) == nil && e.Ct != nil && e.Ct.Key == "state"
}

func isZero(raw json.RawMessage) bool {
	var n json.Number
	return json.Unmarshal(raw, &n) == nil && n == "0"
}

// containsInvalid reports whether a value is "invalid", or a list or anonymous set holding it.
func containsInvalid(raw json.RawMessage) bool {
	return containsInvalidDepth(raw, 0)
}

func containsInvalidDepth(raw json.RawMessage, depth int) bool {
	if depth > 8 {
		return false
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s == "invalid"
	}
	var list []json.RawMessage
	if json.Unmarshal(raw, &list) == nil {
		for _, e := range list {
			if containsInvalidDepth(e, depth+1) {
				return true
			}
		}
		return false
	}
	var set struct {
		Set json.RawMessage `json:"set"`
	}
	if json.Unmarshal(raw, &set) == nil && set.Set != nil {
		return containsInvalidDepth(set.Set, depth+1)
	}
	return false
}
