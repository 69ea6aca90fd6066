package nftnl

import (
	"context"
	"net/netip"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

// recordedChainRules returns the attributes of the recorded nat dump's rules of chain, in
// order, with their handles.
func recordedChainRules(t *testing.T, chain string) [][]byte {
	t.Helper()
	rec := loadReplay(t, "testdata/kube-proxy-v1.36.3-nat.replay.json")
	var out [][]byte
	for _, reply := range rec.rec {
		for _, m := range reply.Msgs {
			if m.Type != unix.NFT_MSG_NEWRULE || m.Family != unix.NFPROTO_IPV4 {
				continue
			}
			r, err := parseRule(m.Attrs)
			if err != nil {
				t.Fatal(err)
			}
			if string(r.chain) == chain {
				out = append(out, m.Attrs)
			}
		}
	}
	if len(out) == 0 {
		t.Fatalf("no rule of %s in the recording", chain)
	}
	return out
}

// TestChainRewriteFromMessages rewrites service and endpoint chains of the real capture as
// kube-proxy does (every rule deleted, the new ones added) through a decoding watch's
// accumulator: the Follower takes the new rules from the messages and reads nothing (the
// recording has no reply to a chain's dump, so a read would fail the Apply).
func TestChainRewriteFromMessages(t *testing.T) {
	const svc = "KUBE-SVC-ZKJWP2ZV4NN5G7EZ" // lab/backend, 11 endpoints
	// The recording holds the ip nat table only: the other tables' reads fail, and are tried
	// again at each Apply.
	f := newFollower(loadReplay(t, "testdata/kube-proxy-v1.36.3-nat.replay.json"), nil)
	_ = f.Resync(context.Background())
	apply := func(c Change) {
		t.Helper()
		_ = f.Apply(context.Background(), c)
		if _, err := f.IPTablesNAT(false); err != nil {
			t.Fatal(err)
		}
	}
	before, err := f.IPTablesNAT(false)
	if err != nil {
		t.Fatal(err)
	}
	gen := f.tables[0].gen
	if f.tables[0].table != natV4 || gen == 0 {
		t.Fatalf("table 0 is %v at generation %d, want the ip nat table read", f.tables[0].table, gen)
	}
	acc := &changeAccumulator{rules: newNATRuleDecoder()}

	// The service chain written again without its last endpoint's jump.
	rules := recordedChainRules(t, svc)
	var msgs []message
	for _, r := range rules {
		msgs = append(msgs, delRule(r))
	}
	for i, r := range rules[:len(rules)-1] {
		msgs = append(msgs, newRule(withHandle(t, r, uint64(10000+i))))
	}
	// A rule added and deleted within the commit counts as neither.
	msgs = append(msgs, newRule(withHandle(t, rules[len(rules)-1], 20000)), delRule(withHandle(t, rules[len(rules)-1], 20000)))
	gen++
	apply(commit(t, acc, gen, msgs...))
	got, _ := f.IPTablesNAT(false)
	want := before.Chains[svc]
	lastEP := func() netip.AddrPort {
		t.Helper()
		r, err := parseRule(rules[len(rules)-1])
		if err != nil {
			t.Fatal(err)
		}
		in := interp{family: unix.NFPROTO_IPV4}
		fa, err := in.rule(r.exprs)
		if err != nil {
			t.Fatal(err)
		}
		return f.tables[0].endpoints[string(sepTarget(fa))]
	}()
	want = slices.DeleteFunc(slices.Clone(want), func(ap netip.AddrPort) bool { return ap == lastEP })
	if !lastEP.IsValid() || !slices.Equal(got.Chains[svc], want) {
		t.Errorf("%s after the rewrite: %v, want %v (without %v)", svc, got.Chains[svc], want, lastEP)
	}
	if n := f.tables[0].ruleCounts[svc]; int(n) != len(rules)-1 {
		t.Errorf("%s counts %d rules, want %d", svc, n, len(rules)-1)
	}

	// An endpoint chain written again with another destination: every service chain that
	// jumps to it follows.
	sep := "KUBE-SEP-HUGL6XOLN2FXI7EB"
	seps := recordedChainRules(t, sep)
	msgs = msgs[:0]
	for _, r := range seps {
		msgs = append(msgs, delRule(r))
	}
	other := recordedChainRules(t, "KUBE-SEP-RX36DMIICQEWPEUB") // 10.244.3.50:8080
	for i, r := range other {
		msgs = append(msgs, newRule(withChain(t, withHandle(t, r, uint64(30000+i)), sep)))
	}
	gen++
	apply(commit(t, acc, gen, msgs...))
	got, _ = f.IPTablesNAT(false)
	for _, chain := range []string{"KUBE-SVC-FEK7IJ3KIWHUKSBD", "KUBE-SVL-FEK7IJ3KIWHUKSBD"} { // both jump to it
		if want := []netip.AddrPort{netip.MustParseAddrPort("10.244.3.50:8080")}; !slices.Equal(got.Chains[chain], want) {
			t.Errorf("%s: %v, want %v (was %v)", chain, got.Chains[chain], want, before.Chains[chain])
		}
	}
	if s := f.Stats(); s.RuleDumps != 1 {
		t.Errorf("%d rule dumps, want only the Resync's dump of the ip nat table", s.RuleDumps)
	}
}

// TestRewrite counts what one commit's messages did to a chain.
func TestRewrite(t *testing.T) {
	a, b := &natRule{sep: "KUBE-SEP-A"}, &natRule{sep: "KUBE-SEP-B"}
	added, deleted := rewrite([]RuleEvent{
		{Handle: 1, Deleted: true}, {Handle: 2, Deleted: true},
		{Handle: 5, rule: a}, {Handle: 6, rule: b}, {Handle: 5, Deleted: true}, {Handle: 3, Deleted: true},
	})
	if deleted != 3 || !slices.Equal(added, []*natRule{b}) {
		t.Errorf("rewrite: added %v, deleted %d; want [b], 3", added, deleted)
	}
}

// withChain returns a copy of rule attributes with NFTA_RULE_CHAIN set to chain, a name as
// long as the one it replaces.
func withChain(t *testing.T, attrs []byte, chain string) []byte {
	t.Helper()
	return withAttr(t, attrs, unix.NFTA_RULE_CHAIN, func(val []byte) {
		if old := cstr(val); len(old) != len(chain) {
			t.Fatalf("chain %q in place of %q: not as long", chain, old)
		}
		copy(val, chain)
	})
}
