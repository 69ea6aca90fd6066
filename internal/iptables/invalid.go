package iptables

import "strings"

// InvalidDropReachable reports whether a packet traversing fromChain of table can reach a rule
// that drops packets in conntrack state INVALID, following -j and -g jumps into user-defined
// chains (cycles are visited once).
//
// A rule counts when its target is DROP and it matches INVALID positively with
// `-m conntrack --ctstate LIST` or `-m state --state LIST` where LIST contains INVALID (so
// INVALID,UNTRACKED counts, `! --ctstate INVALID` does not). Extra matches do not disqualify
// it: kube-proxy's rule also carries `-m nfacct`, and a drop restricted by e.g. `-s` or `-i`
// is still reported as present. A jump that itself matches INVALID into a chain whose rule is a
// plain DROP counts too. Traversal of a chain stops after an unconditional ACCEPT, DROP,
// REJECT, RETURN or goto, since later rules are never reached.
//
// path lists the rule lines followed, from the jump in fromChain to the drop rule itself, so
// any restricting match on the way is visible in it. It is nil when nothing is reachable.
func (rs *Ruleset) InvalidDropReachable(table, fromChain string) (bool, []string) {
	t := rs.Table(table)
	c := t.Chain(fromChain)
	if c == nil {
		return false, nil
	}
	type key struct {
		chain       string
		invalidOnly bool
	}
	seen := make(map[key]bool)
	var walk func(c *Chain, invalidOnly bool, path []string) []string
	walk = func(c *Chain, invalidOnly bool, path []string) []string {
		k := key{c.Name, invalidOnly}
		if seen[k] {
			return nil
		}
		seen[k] = true
		for i := range c.Rules {
			r := &c.Rules[i]
			target := r.Target()
			matchesInvalid := r.matchesInvalid()
			if target == "DROP" && (matchesInvalid || invalidOnly) {
				return append(path, r.Raw)
			}
			if next := t.Chain(target); next != nil && !next.Builtin() && target != c.Name {
				if found := walk(next, invalidOnly || matchesInvalid, append(path[:len(path):len(path)], r.Raw)); found != nil {
					return found
				}
			}
			if r.Unconditional() {
				switch {
				case r.Goto(), target == "ACCEPT", target == "DROP", target == "REJECT", target == "RETURN":
					return nil
				}
			}
		}
		return nil
	}
	path := walk(c, false, nil)
	return path != nil, path
}

// matchesInvalid reports whether the rule matches conntrack state INVALID positively.
func (r *Rule) matchesInvalid() bool {
	for o := range r.Options() {
		if o.Negated || o.Target {
			continue
		}
		if (o.Module == "conntrack" && o.Name == "--ctstate") || (o.Module == "state" && o.Name == "--state") {
			if listHas(o.Value(), "INVALID") {
				return true
			}
		}
	}
	return false
}

func listHas(list, want string) bool {
	for list != "" {
		item := list
		if i := strings.IndexByte(list, ','); i >= 0 {
			item, list = list[:i], list[i+1:]
		} else {
			list = ""
		}
		if strings.EqualFold(item, want) {
			return true
		}
	}
	return false
}
