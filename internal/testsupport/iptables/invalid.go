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
// plain DROP counts too. Traversal stops after an unconditional ACCEPT, DROP or REJECT (also
// inside a chain jumped to unconditionally) and a chain's after an unconditional RETURN or goto,
// since later rules are never reached.
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
	// walk returns the path to a drop, or nil; terminal reports an unconditional ACCEPT, DROP
	// or REJECT that ends every packet's traversal, so the caller must stop too.
	var walk func(c *Chain, invalidOnly bool, path []string) (found []string, terminal bool)
	walk = func(c *Chain, invalidOnly bool, path []string) ([]string, bool) {
		k := key{c.Name, invalidOnly}
		if seen[k] {
			return nil, false
		}
		seen[k] = true
		for i := range c.Rules {
			r := &c.Rules[i]
			target := r.Target()
			matchesInvalid := r.matchesInvalid()
			if target == "DROP" && (matchesInvalid || invalidOnly) {
				return append(path, r.Raw), false
			}
			uncond := r.Unconditional()
			if next := t.Chain(target); next != nil && !next.Builtin() {
				found, terminal := walk(next, invalidOnly || matchesInvalid, append(path[:len(path):len(path)], r.Raw))
				if found != nil || (terminal && uncond) {
					return found, terminal
				}
				if uncond && r.Goto() {
					return nil, false
				}
			}
			if uncond {
				switch target {
				case "ACCEPT", "DROP", "REJECT":
					return nil, true
				case "RETURN":
					return nil, false
				}
			}
		}
		return nil, false
	}
	path, _ := walk(c, false, nil)
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
