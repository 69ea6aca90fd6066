// Package nft parses the JSON that `nft -j list ruleset` prints (libnftables JSON schema 1, as
// written by nftables 1.0.x) and answers whether the forward path drops conntrack INVALID
// packets in a native nftables chain.
//
// Only what the analysis needs is modelled: tables, chains (with base chain hook, type,
// priority and policy) and rules, whose statements are kept as raw JSON and decoded on demand.
package nft

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
)

// Ruleset is the parsed output of one `nft -j list ruleset`.
type Ruleset struct {
	// Version is the nftables version from the metainfo object, if present.
	Version string
	Tables  []*Table

	tables map[tableKey]*Table
}

type tableKey struct{ family, name string }

// Table returns the table of the given family ("ip", "ip6", "inet", ...) and name, or nil.
func (rs *Ruleset) Table(family, name string) *Table {
	if rs == nil {
		return nil
	}
	return rs.tables[tableKey{family, name}]
}

// Table is one nftables table.
type Table struct {
	Family string
	Name   string
	Handle int
	Chains []*Chain

	chains map[string]*Chain
}

// Chain returns the chain with the given name or nil.
func (t *Table) Chain(name string) *Chain {
	if t == nil {
		return nil
	}
	return t.chains[name]
}

// Chain is one chain. Hook, Type, Prio and Policy are set for base chains only.
type Chain struct {
	Family string
	Table  string
	Name   string
	Handle int
	Type   string // "filter", "nat", "route"
	Hook   string // "prerouting", "input", "forward", "output", "postrouting", "ingress", ...
	Prio   int
	Policy string // "accept" or "drop"
	Rules  []*Rule
}

// Base reports whether the chain is a base chain (attached to a hook).
func (c *Chain) Base() bool { return c.Hook != "" }

// Rule is one rule with its statements (expressions) as raw JSON, e.g.
// {"match": {"op": "in", "left": {"ct": {"key": "state"}}, "right": "invalid"}} and {"drop": null}.
type Rule struct {
	Family  string
	Table   string
	Chain   string
	Handle  int
	Comment string
	Expr    []json.RawMessage
}

// String names the rule the way `nft -a list` locates it.
func (r *Rule) String() string {
	return fmt.Sprintf("%s %s %s handle %d", r.Family, r.Table, r.Chain, r.Handle)
}

type document struct {
	Nftables []map[string]json.RawMessage `json:"nftables"`
}

// Parse reads `nft -j list ruleset` output. Objects other than tables, chains and rules (sets,
// maps, flowtables, counters, ...) are ignored. A rule or chain naming a table or chain that was
// not listed before it is an error, since nft lists them in that order.
func Parse(r io.Reader) (*Ruleset, error) {
	var doc document
	dec := json.NewDecoder(r)
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("decoding nft JSON: %w", err)
	}
	if doc.Nftables == nil {
		return nil, fmt.Errorf("decoding nft JSON: no \"nftables\" array")
	}
	rs := &Ruleset{tables: make(map[tableKey]*Table)}
	for i, obj := range doc.Nftables {
		for kind, raw := range obj {
			if err := rs.add(kind, raw); err != nil {
				return nil, fmt.Errorf("nft JSON object %d (%s): %w", i, kind, err)
			}
		}
	}
	return rs, nil
}

func (rs *Ruleset) add(kind string, raw json.RawMessage) error {
	switch kind {
	case "metainfo":
		var m struct {
			Version string `json:"version"`
		}
		if err := json.Unmarshal(raw, &m); err != nil {
			return err
		}
		rs.Version = m.Version
	case "table":
		var t struct {
			Family string `json:"family"`
			Name   string `json:"name"`
			Handle int    `json:"handle"`
		}
		if err := json.Unmarshal(raw, &t); err != nil {
			return err
		}
		k := tableKey{t.Family, t.Name}
		if _, dup := rs.tables[k]; dup {
			return fmt.Errorf("table %s %s listed twice", t.Family, t.Name)
		}
		tb := &Table{Family: t.Family, Name: t.Name, Handle: t.Handle, chains: make(map[string]*Chain)}
		rs.tables[k] = tb
		rs.Tables = append(rs.Tables, tb)
	case "chain":
		var c struct {
			Family string          `json:"family"`
			Table  string          `json:"table"`
			Name   string          `json:"name"`
			Handle int             `json:"handle"`
			Type   string          `json:"type"`
			Hook   string          `json:"hook"`
			Prio   json.RawMessage `json:"prio"`
			Policy string          `json:"policy"`
		}
		if err := json.Unmarshal(raw, &c); err != nil {
			return err
		}
		tb := rs.Table(c.Family, c.Table)
		if tb == nil {
			return fmt.Errorf("chain %s in unknown table %s %s", c.Name, c.Family, c.Table)
		}
		if _, dup := tb.chains[c.Name]; dup {
			return fmt.Errorf("chain %s listed twice in table %s %s", c.Name, c.Family, c.Table)
		}
		ch := &Chain{Family: c.Family, Table: c.Table, Name: c.Name, Handle: c.Handle, Type: c.Type, Hook: c.Hook, Policy: c.Policy}
		// prio is a number; some versions print a named priority ("filter") instead.
		if len(c.Prio) > 0 {
			if p, err := strconv.Atoi(string(c.Prio)); err == nil {
				ch.Prio = p
			}
		}
		tb.chains[c.Name] = ch
		tb.Chains = append(tb.Chains, ch)
	case "rule":
		var r struct {
			Family  string            `json:"family"`
			Table   string            `json:"table"`
			Chain   string            `json:"chain"`
			Handle  int               `json:"handle"`
			Comment string            `json:"comment"`
			Expr    []json.RawMessage `json:"expr"`
		}
		if err := json.Unmarshal(raw, &r); err != nil {
			return err
		}
		ch := rs.Table(r.Family, r.Table).Chain(r.Chain)
		if ch == nil {
			return fmt.Errorf("rule handle %d in unknown chain %s %s %s", r.Handle, r.Family, r.Table, r.Chain)
		}
		ch.Rules = append(ch.Rules, &Rule{Family: r.Family, Table: r.Table, Chain: r.Chain, Handle: r.Handle, Comment: r.Comment, Expr: r.Expr})
	}
	return nil
}
