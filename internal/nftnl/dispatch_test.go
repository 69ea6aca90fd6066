package nftnl

import (
	"encoding/binary"
	"fmt"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

var natV4 = Table{Family: unix.NFPROTO_IPV4, Name: "nat"}

// kubeServicesRules returns the attributes of the recorded dump's KUBE-SERVICES rules, each
// with its handle set to handle(i), as a watch receives them.
func kubeServicesRules(t *testing.T, handle func(i int) uint64) [][]byte {
	t.Helper()
	rules := recordedChainRules(t, chainKubeServices)
	for i, r := range rules {
		rules[i] = withHandle(t, r, handle(i))
	}
	return rules
}

// withHandle returns a copy of rule attributes with NFTA_RULE_HANDLE set to h.
func withHandle(t *testing.T, attrs []byte, h uint64) []byte {
	t.Helper()
	return withAttr(t, attrs, unix.NFTA_RULE_HANDLE, func(val []byte) { binary.BigEndian.PutUint64(val, h) })
}

// withAttr returns a copy of rule attributes whose attribute typ set rewrote in place.
func withAttr(t *testing.T, attrs []byte, typ uint16, set func(val []byte)) []byte {
	t.Helper()
	out := slices.Clone(attrs)
	a := newAttrs(out)
	for a.next() {
		if a.typ == typ {
			set(a.val)
			return out
		}
	}
	t.Fatalf("rule message without attribute %d", typ)
	return nil
}

func handleOf(t *testing.T, attrs []byte) uint64 {
	t.Helper()
	r, err := parseRule(attrs)
	if err != nil {
		t.Fatal(err)
	}
	return r.handle
}

func newRule(attrs []byte) message {
	return message{typ: unix.NFT_MSG_NEWRULE, family: unix.NFPROTO_IPV4, attrs: attrs}
}

func delRule(attrs []byte) message {
	return message{typ: unix.NFT_MSG_DELRULE, family: unix.NFPROTO_IPV4, attrs: attrs}
}

// TestDispatchFollowsRewrites writes KUBE-SERVICES as kube-proxy does (every rule deleted and
// added again at each sync) with the rules of a real capture, through a decoding watch's
// accumulator, and applies what it reports.
func TestDispatchFollowsRewrites(t *testing.T) {
	acc := &changeAccumulator{rules: newNATRuleDecoder()}
	dd := acc.rules.(*natRuleDecoder)
	apply := func(d *dispatchRules, chg Change) {
		t.Helper()
		tc := chg.Touched(natV4)
		if tc == nil || tc.RulesDropped || !slices.Contains(tc.KeptChains, chainKubeServices) {
			t.Fatalf("change %+v: want KUBE-SERVICES's rules kept", tc)
		}
		d.apply([][]RuleEvent{tc.Rules})
	}

	first := kubeServicesRules(t, func(i int) uint64 { return uint64(100 + i) })
	var msgs []message
	for _, r := range first {
		msgs = append(msgs, newRule(r))
	}
	d := newDispatchRules(newNATReader(unix.NFPROTO_IPV4), 0)
	apply(d, commit(t, acc, 1, msgs...))
	want, changed := d.services(nil)
	if !changed || len(want) == 0 {
		t.Fatalf("first write: %d services, changed %v", len(want), changed)
	}
	// The same as a whole read of the recording.
	pt, err := readIPTablesNAT(t.Context(), loadReplay(t, "testdata/kube-proxy-v1.36.3-nat.replay.json"), nfproto(false))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(want, pt.Services) {
		t.Fatalf("from rule messages\n %+v\nwhole read\n %+v", want, pt.Services)
	}
	bodies := len(dd.bodies)

	// A sync: every rule deleted, the same rules added with new handles, in another order.
	msgs = msgs[:0]
	for _, r := range first {
		msgs = append(msgs, delRule(r))
	}
	second := kubeServicesRules(t, func(i int) uint64 { return uint64(1000 + i) })
	slices.Reverse(second)
	for _, r := range second {
		msgs = append(msgs, newRule(r))
	}
	apply(d, commit(t, acc, 2, msgs...))
	got, changed := d.services(want)
	if changed || !slices.Equal(got, want) || &got[0] != &want[0] {
		t.Errorf("the same rules again: changed %v, %d services (want the old list kept)", changed, len(got))
	}
	if len(dd.bodies) != bodies {
		t.Errorf("the same rules again: %d decoded bodies, want %d (none new)", len(dd.bodies), bodies)
	}
	for h := range d.byHandle {
		if h < 1000 {
			t.Errorf("rule handle %d of the first write is still kept after the sync", h)
		}
	}

	// One dispatch rule deleted: listed no more.
	var gone []byte
	for _, r := range second {
		if _, ok := d.byHandle[handleOf(t, r)]; ok {
			gone = r
			break
		}
	}
	apply(d, commit(t, acc, 3, delRule(gone)))
	got, changed = d.services(want)
	if !changed || len(got) != len(want)-1 {
		t.Errorf("a rule deleted: changed %v, %d services, want %d", changed, len(got), len(want)-1)
	}

	// Bodies no rule used in a commit are forgotten once they outnumber its own, generously.
	for i := range 100 {
		dd.bodies[fmt.Sprint("gone", i)] = &decodedBody{}
	}
	apply(d, commit(t, acc, 4, newRule(withHandle(t, first[0], 7000))))
	if len(dd.bodies) != 1 {
		t.Errorf("%d decoded bodies after a commit that used one, want 1", len(dd.bodies))
	}
}

// TestWatchKeepsRules checks what a decoding watch's Change carries: the kept chain's rules
// only, decoded, and none past the bound or after a message it cannot decode.
func TestWatchKeepsRules(t *testing.T) {
	rules := kubeServicesRules(t, func(i int) uint64 { return uint64(10 + i) })
	other := withHandle(t, rules[0], 99)
	// The same rule in another chain: not kept.
	otherChain := appendStrAttr(appendStrAttr(nil, unix.NFTA_RULE_TABLE, "nat"), unix.NFTA_RULE_CHAIN, "KUBE-NODEPORTS")
	otherChain = appendAttr(otherChain, unix.NFTA_RULE_HANDLE, binary.BigEndian.AppendUint64(nil, 99))
	a := &changeAccumulator{rules: newNATRuleDecoder()}
	chg := commit(t, a, 7, delRule(other), newRule(rules[0]), newRule(otherChain), newRule(rules[1]))
	d := chg.Touched(natV4)
	if d == nil {
		t.Fatalf("change %+v does not name %v", chg, natV4)
	}
	if !slices.Equal(d.KeptChains, []string{chainKubeServices}) || d.RulesDropped {
		t.Errorf("KeptChains %v, RulesDropped %v; want [KUBE-SERVICES], false", d.KeptChains, d.RulesDropped)
	}
	var got []uint64
	for _, r := range d.Rules {
		if r.Chain != chainKubeServices {
			t.Errorf("kept a rule of chain %s", r.Chain)
		}
		if r.Deleted && r.rule != nil {
			t.Errorf("deleted rule %d carries a service", r.Handle)
		}
		got = append(got, r.Handle)
	}
	if !slices.Equal(got, []uint64{99, 10, 11}) {
		t.Errorf("kept rule handles %v, want [99 10 11]", got)
	}

	// Past the bound, the commit's kept rules are dropped and the chain must be read.
	defer func(old int) { maxKeptRules = old }(maxKeptRules)
	maxKeptRules = 2
	chg = commit(t, a, 8, newRule(rules[0]), newRule(rules[1]), newRule(rules[2]))
	if d := chg.Touched(natV4); d == nil || !d.RulesDropped || len(d.Rules) != 0 {
		t.Errorf("over the bound: %+v, want RulesDropped and no rules", d)
	}
	maxKeptRules = 1 << 19

	// A rule message it cannot decode drops the commit's rules too.
	bad := appendStrAttr(appendStrAttr(nil, unix.NFTA_RULE_TABLE, "nat"), unix.NFTA_RULE_CHAIN, chainKubeServices)
	bad = appendAttr(bad, unix.NFTA_RULE_HANDLE, binary.BigEndian.AppendUint64(nil, 50))
	bad = append(bad, 0xff, 0xff, 0xff)
	chg = commit(t, a, 9, newRule(rules[0]), newRule(bad))
	if d := chg.Touched(natV4); d == nil || !d.RulesDropped || len(d.Rules) != 0 {
		t.Errorf("an undecodable rule: %+v, want RulesDropped and no rules", d)
	}

	// A watch without FollowNATRules keeps nothing and says so.
	plain := &changeAccumulator{}
	chg = commit(t, plain, 10, newRule(rules[0]))
	if d := chg.Touched(natV4); d == nil || len(d.KeptChains) != 0 || len(d.Rules) != 0 {
		t.Errorf("without FollowNATRules: %+v, want no kept chains or rules", d)
	}
}
