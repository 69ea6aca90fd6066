package nftnl

import (
	"bytes"
	"encoding/binary"
	"slices"
	"testing"

	"github.com/proxyhealth/proxyhealth/internal/ruleset"

	"golang.org/x/sys/unix"
)

// kubeServicesMessages returns the recorded dump's NEWRULE messages of KUBE-SERVICES, each
// with its handle replaced by handle(i), as a watch would carry them.
func kubeServicesMessages(t *testing.T, handle func(i int) uint64) []RuleEvent {
	t.Helper()
	rec := loadReplay(t, "testdata/kube-proxy-v1.36.3-nat.replay.json")
	var out []RuleEvent
	for _, reply := range rec.rec {
		for _, m := range reply.Msgs {
			if m.Type != unix.NFT_MSG_NEWRULE || m.Family != unix.NFPROTO_IPV4 {
				continue
			}
			r, err := parseRule(m.Attrs)
			if err != nil {
				t.Fatal(err)
			}
			if string(r.chain) != chainKubeServices {
				continue
			}
			h := handle(len(out))
			out = append(out, RuleEvent{Chain: chainKubeServices, Handle: h, attrs: withHandle(t, m.Attrs, h)})
		}
		if len(out) > 0 {
			break // one reply holds the whole table
		}
	}
	if len(out) == 0 {
		t.Fatal("no KUBE-SERVICES rule in the recording")
	}
	return out
}

// withHandle returns a copy of rule attributes with NFTA_RULE_HANDLE set to h.
func withHandle(t *testing.T, attrs []byte, h uint64) []byte {
	t.Helper()
	out := slices.Clone(attrs)
	a := newAttrs(out)
	for a.next() {
		if a.typ == unix.NFTA_RULE_HANDLE {
			binary.BigEndian.PutUint64(a.val, h)
			return out
		}
	}
	t.Fatal("rule message without a handle")
	return nil
}

// TestDispatchRulesFollowsRewrites applies kube-proxy's way of writing KUBE-SERVICES (every
// rule deleted and added again) to the rules read from a real capture.
func TestDispatchRulesFollowsRewrites(t *testing.T) {
	first := kubeServicesMessages(t, func(i int) uint64 { return uint64(100 + i) })
	d := &dispatchRules{byHandle: map[uint64]ruleset.Service{}, decoded: map[string]decodedRule{}}
	if err := d.apply(unix.NFPROTO_IPV4, first); err != nil {
		t.Fatal(err)
	}
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
	decoded := len(d.decoded)

	// A sync: every rule deleted, the same rules added with new handles.
	var sync []RuleEvent
	for _, ev := range first {
		sync = append(sync, RuleEvent{Chain: chainKubeServices, Handle: ev.Handle, Deleted: true})
	}
	sync = append(sync, kubeServicesMessages(t, func(i int) uint64 { return uint64(1000 + i) })...)
	if err := d.apply(unix.NFPROTO_IPV4, sync); err != nil {
		t.Fatal(err)
	}
	got, changed := d.services(want)
	if changed || !slices.Equal(got, want) || &got[0] != &want[0] {
		t.Errorf("the same rules again: changed %v, %d services (want the old list kept)", changed, len(got))
	}
	if len(d.decoded) != decoded {
		t.Errorf("the same rules again: %d decoded bodies, want %d (none new)", len(d.decoded), decoded)
	}
	for h := range d.byHandle {
		if h < 1000 {
			t.Errorf("rule handle %d of the first write is still kept after the sync", h)
		}
	}

	// One dispatch rule deleted: listed no more.
	var gone RuleEvent
	for _, ev := range sync {
		if _, ok := d.byHandle[ev.Handle]; ok && !ev.Deleted {
			gone = RuleEvent{Chain: chainKubeServices, Handle: ev.Handle, Deleted: true}
			break
		}
	}
	if err := d.apply(unix.NFPROTO_IPV4, []RuleEvent{gone}); err != nil {
		t.Fatal(err)
	}
	got, changed = d.services(want)
	if !changed || len(got) != len(want)-1 {
		t.Errorf("a rule deleted: changed %v, %d services, want %d", changed, len(got), len(want)-1)
	}

	// A malformed message is an error, not a guess.
	bad := RuleEvent{Chain: chainKubeServices, Handle: 5000, attrs: bytes.Repeat([]byte{0xff}, 3)}
	if err := d.apply(unix.NFPROTO_IPV4, []RuleEvent{bad}); err == nil {
		t.Error("a malformed rule message was applied without an error")
	}
}
