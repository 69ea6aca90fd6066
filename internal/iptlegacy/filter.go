package iptlegacy

import (
	"fmt"

	"github.com/proxyhealth/proxyhealth/internal/ruleset"
)

// decodeFilter reads a filter table into the graph the INVALID-drop search walks from FORWARD.
// Filter tables are small (kube-proxy writes a few dozen rules there), so every rule is kept,
// and the blob is walked twice: once for where the user chains start, since a jump names its
// chain by offset and may point forward, then for the rules.
func decodeFilter(info *Info, blob []byte) (*ruleset.Graph, error) {
	name := "iptables-legacy filter"
	if info.IPv6 {
		name = "ip6tables-legacy filter"
	}
	idx := chainIndex{starts: map[int]string{}}
	if err := walk(info, blob, &idx, nil); err != nil {
		return nil, err
	}
	d := filterDecoder{
		g:      &ruleset.Graph{Name: name, Chains: map[string]*ruleset.Chain{}, Entries: []string{"FORWARD"}},
		starts: idx.starts,
	}
	if err := walk(info, blob, &d, nil); err != nil {
		return nil, err
	}
	return d.g, nil
}

// chainIndex records where each user chain starts.
type chainIndex struct {
	starts map[int]string // by the offset a jump into the chain names
}

func (x *chainIndex) chain(name []byte, builtin bool, firstRule int) error {
	if !builtin {
		x.starts[firstRule] = string(name)
	}
	return nil
}

func (x *chainIndex) rule(entry, int) error { return nil }

type filterDecoder struct {
	g      *ruleset.Graph
	cur    *ruleset.Chain
	starts map[int]string
}

func (d *filterDecoder) chain(nameBytes []byte, _ bool, _ int) error {
	name := string(nameBytes)
	if _, dup := d.g.Chains[name]; dup {
		return fmt.Errorf("chain %s appears twice", name)
	}
	d.cur = &ruleset.Chain{Name: name}
	d.g.Chains[name] = d.cur
	return nil
}

func (d *filterDecoder) rule(e entry, num int) error {
	h := ipHeaderOf(e)
	r := ruleset.Rule{Conditional: h.restricts()}
	it := e.matches()
	for m, ok := it.next(); ok; m, ok = it.next() {
		if st, isCt := ctStateOf(m); isCt {
			r.Ct = combineCt(r.Ct, st.ct)
			r.Conditional = r.Conditional || st.restricts
			continue
		}
		switch string(m.name) {
		case "comment", "nfacct", "limit":
			// Neither restricts which packets reach the verdict in a way that matters here:
			// a rate-limited drop still drops INVALID packets, a counted one all of them.
		default:
			r.Conditional = true
		}
	}
	if it.err != nil {
		return it.err
	}
	v, err := d.verdict(e, &h)
	if err != nil {
		return err
	}
	r.Verdict = v
	r.Desc = describe(d.cur.Name, num, e, &h, v)
	d.cur.Rules = append(d.cur.Rules, r)
	return nil
}

// verdict reads the rule's target: a standard verdict or jump, REJECT, or any other target,
// which lets the packet go on to the next rule (LOG, MARK, ...) as far as this search goes.
func (d *filterDecoder) verdict(e entry, h *ipHeader) (ruleset.Verdict, error) {
	t := e.target()
	v, ok := t.standardVerdict()
	if !ok {
		if string(t.name) == "REJECT" {
			return ruleset.Verdict{Kind: ruleset.Reject}, nil
		}
		return ruleset.Verdict{}, nil
	}
	switch {
	case v == verdictAccept:
		return ruleset.Verdict{Kind: ruleset.Accept}, nil
	case v == verdictDrop:
		return ruleset.Verdict{Kind: ruleset.Drop}, nil
	case v == verdictReturn:
		return ruleset.Verdict{Kind: ruleset.Return}, nil
	case v < 0 || int(v) == e.off+len(e.raw):
		return ruleset.Verdict{}, nil // QUEUE, or a rule without -j: on to the next rule
	}
	target, ok := d.starts[int(v)]
	if !ok {
		return ruleset.Verdict{}, fmt.Errorf("%s rule at offset %d jumps to offset %d, where no chain starts", d.cur.Name, e.off, v)
	}
	if h.gotoFlag {
		return ruleset.Verdict{Kind: ruleset.Goto, Target: target}, nil
	}
	return ruleset.Verdict{Kind: ruleset.Jump, Target: target}, nil
}
