package nftnl

import (
	"encoding/binary"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

// ruleEvent builds a NEWRULE or DELRULE event message of table ip nat.
func ruleEvent(typ uint16, chain string, handle uint64, exprs []byte) message {
	attrs := appendStrAttr(nil, unix.NFTA_RULE_TABLE, "nat")
	attrs = appendStrAttr(attrs, unix.NFTA_RULE_CHAIN, chain)
	attrs = appendAttr(attrs, unix.NFTA_RULE_HANDLE, binary.BigEndian.AppendUint64(nil, handle))
	if exprs != nil {
		attrs = appendAttr(attrs, unix.NFTA_RULE_EXPRESSIONS, exprs)
	}
	return message{typ: typ, family: unix.NFPROTO_IPV4, attrs: attrs}
}

func newGen(gen uint32) message {
	return message{typ: unix.NFT_MSG_NEWGEN, attrs: appendAttr(nil, unix.NFTA_GEN_ID, binary.BigEndian.AppendUint32(nil, gen))}
}

// commit feeds msgs and the commit's NEWGEN to a, and returns the Change it reports.
func commit(t *testing.T, a *changeAccumulator, gen uint32, msgs ...message) Change {
	t.Helper()
	for _, m := range msgs {
		if _, ok := a.event(m); ok {
			t.Fatalf("a Change before the commit's NEWGEN")
		}
	}
	chg, ok := a.event(newGen(gen))
	if !ok {
		t.Fatalf("no Change for generation %d", gen)
	}
	return chg
}

func TestWatchKeepsRules(t *testing.T) {
	nat := Table{Family: unix.NFPROTO_IPV4, Name: "nat"}
	a := &changeAccumulator{keepRules: FollowerKeepsRules}
	body := []byte("rule body")
	chg := commit(t, a, 7,
		ruleEvent(unix.NFT_MSG_DELRULE, "KUBE-SERVICES", 10, body),
		ruleEvent(unix.NFT_MSG_NEWRULE, "KUBE-SERVICES", 11, body),
		ruleEvent(unix.NFT_MSG_NEWRULE, "KUBE-SVC-AAAA", 12, body),
		ruleEvent(unix.NFT_MSG_NEWRULE, "KUBE-SERVICES", 13, body),
	)
	d := chg.Touched(nat)
	if d == nil {
		t.Fatalf("change %+v does not name %v", chg, nat)
	}
	if !slices.Equal(d.KeptChains, []string{"KUBE-SERVICES"}) || d.RulesDropped {
		t.Errorf("KeptChains %v, RulesDropped %v; want [KUBE-SERVICES], false", d.KeptChains, d.RulesDropped)
	}
	var got []uint64
	for _, r := range d.Rules {
		if r.Chain != "KUBE-SERVICES" {
			t.Errorf("kept a rule of chain %s", r.Chain)
		}
		if r.Deleted != (r.attrs == nil) {
			t.Errorf("rule %d: deleted %v with attributes %q", r.Handle, r.Deleted, r.attrs)
		}
		if !r.Deleted {
			if m, err := parseRule(r.attrs); err != nil || m.handle != r.Handle || string(m.exprs) != string(body) {
				t.Errorf("rule %d: attributes parse to %+v, %v", r.Handle, m, err)
			}
		}
		got = append(got, r.Handle)
	}
	if !slices.Equal(got, []uint64{10, 11, 13}) {
		t.Errorf("kept rule handles %v, want [10 11 13]", got)
	}

	// Past the bound, the commit's kept rules are dropped and the chain must be read.
	defer func(old int) { maxKeptRuleBytes = old }(maxKeptRuleBytes)
	maxKeptRuleBytes = 100
	big := make([]byte, 60)
	chg = commit(t, a, 8,
		ruleEvent(unix.NFT_MSG_NEWRULE, "KUBE-SERVICES", 20, big),
		ruleEvent(unix.NFT_MSG_NEWRULE, "KUBE-SERVICES", 21, big),
		ruleEvent(unix.NFT_MSG_NEWRULE, "KUBE-SERVICES", 22, big),
	)
	if d := chg.Touched(nat); d == nil || !d.RulesDropped || len(d.Rules) != 0 {
		t.Errorf("over the bound: %+v, want RulesDropped and no rules", d)
	}

	// A watch without KeepRules keeps nothing and says so.
	plain := &changeAccumulator{}
	chg = commit(t, plain, 9, ruleEvent(unix.NFT_MSG_NEWRULE, "KUBE-SERVICES", 30, body))
	if d := chg.Touched(nat); d == nil || len(d.KeptChains) != 0 || len(d.Rules) != 0 {
		t.Errorf("without KeepRules: %+v, want no kept chains or rules", d)
	}
}
