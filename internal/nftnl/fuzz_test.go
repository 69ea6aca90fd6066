package nftnl

import (
	"testing"

	"golang.org/x/sys/unix"
)

// The decoders of this package read kernel bytes without trusting them: no input may panic.

func FuzzRuleDecode(f *testing.F) {
	for _, path := range []string{"testdata/kube-proxy-v1.36.3-nat.replay.json", "testdata/kube-proxy-v1.36.3-nftables.replay.json", "testdata/graph-nft-mixed.replay.json"} {
		for _, reply := range loadReplay(f, path).rec {
			for _, m := range reply.Msgs {
				f.Add(m.Attrs, uint8(unix.NFPROTO_IPV4))
			}
		}
	}
	f.Fuzz(func(t *testing.T, b []byte, family uint8) {
		r, err := parseRule(b)
		if err != nil {
			return
		}
		in := interp{family: family}
		f, _ := in.rule(r.exprs)
		_, _ = ruleComment(r.userdata)
		_ = hasXT(r.exprs)
		if f.hasDNAT && !f.dnat.IsValid() {
			t.Errorf("DNAT reported without a destination")
		}
		_ = eachElement(b, func(e *element) error {
			_, _ = addrPort(family, e.value)
			_, _, _, _ = serviceKey(family, e.key)
			return nil
		})
		_, _ = eventTable(message{typ: unix.NFT_MSG_NEWRULE, attrs: b})
		_, _ = genID(b)
	})
}

func FuzzRuleComment(f *testing.F) {
	f.Add([]byte("\x00\x0bhello world"))
	f.Add([]byte("\x00\x05ab\x00"))
	f.Add([]byte("\x01\x02xy\x00\x03ok\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, ok := ruleComment(b)
		if ok && len(c) > len(b) {
			t.Errorf("comment longer than its input")
		}
	})
}

func FuzzSplitConcat(f *testing.F) {
	f.Add([]byte{10, 96, 0, 10, 17, 0, 0, 0, 0, 53, 0, 0}, 4, 1, 2)
	f.Add(make([]byte, 20), 16, 2, 0)
	f.Fuzz(func(t *testing.T, b []byte, l1, l2, l3 int) {
		lens := []int{l1 % 64, l2 % 64}
		if l3 != 0 {
			lens = append(lens, l3%64)
		}
		fields, ok := splitConcat(b, lens...)
		if !ok {
			return
		}
		total := 0
		for i, fl := range fields {
			if len(fl) != lens[i] {
				t.Fatalf("field %d: %d bytes, want %d", i, len(fl), lens[i])
			}
			total += (lens[i] + 3) &^ 3
		}
		if total != len(b) {
			t.Fatalf("fields cover %d bytes of %d", total, len(b))
		}
	})
}

func FuzzWatchDatagram(f *testing.F) {
	f.Add([]byte{20, 0, 0, 0, 0x0f, 0x0a, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		a := changeAccumulator{rules: newNATRuleDecoder()}
		_ = a.datagram(b)
		_, _ = splitMessages(b, 0, func(message) error { return nil })
	})
}
