package conntrack

import (
	"strings"
	"testing"
)

func TestNormaliseInvalidReason(t *testing.T) {
	for _, tc := range []struct {
		prefix string
		want   string
	}{
		// The prefixes seen on 6.18 (the kernel ends them with a space).
		{"nf_ct_proto_6: invalid tcp flag combination ", "tcp_flags"},
		{"nf_ct_proto_6: bad checksum ", "checksum"},
		{"nf_ct_proto_17: bad checksum ", "checksum"},
		{"nf_ct_proto_1: bad hw icmp checksum ", "checksum"},
		{"nf_ct_proto_58: ICMPv6 checksum failed ", "checksum"},
		{"nf_ct_proto_6: invalid new ", "invalid_new"},
		{"nf_ct_proto_1: invalid icmp type ", "icmp_type"},
		{"nf_ct_proto_58: invalid icmpv6 type ", "icmp_type"},
		{"nf_ct_proto_6: SEQ is over upper bound 2296793663 (over the window of the receiver) ", "seq_over_window"},
		{"nf_ct_proto_6: 120 bytes more than expected ", "seq_over_window"},
		{"nf_ct_proto_6: SEQ is under lower bound 12 (already ACKed data retransmitted) ", "seq_under_window"},
		{"nf_ct_proto_6: ACK is over upper bound 4000 (ACKed data not seen yet) ", "ack_over_window"},
		{"nf_ct_proto_6: ignored ACK under lower bound 7 (possible overly delayed) ", "ack_under_window"},
		{"nf_ct_proto_6: packet (index 0) in dir 0 ignored, state ESTABLISHED ", "ignored"},
		{"nf_ct_proto_6: challenge-ack ignored ", "ignored"},
		{"nf_ct_proto_6: truncated packet ", "other"},
		{"nf_ct_proto_17: short packet ", "other"},
		{"", "other"},
		{"something else entirely", "other"},
		// Without the protocol part the text still decides.
		{"invalid tcp flag combination", "tcp_flags"},
	} {
		if got := normaliseInvalidReason(tc.prefix).String(); got != tc.want {
			t.Errorf("normaliseInvalidReason(%q) = %s, want %s", tc.prefix, got, tc.want)
		}
	}
}

func FuzzNormaliseInvalidReason(f *testing.F) {
	for _, s := range []string{"nf_ct_proto_6: invalid tcp flag combination ", "nf_ct_proto_6: SEQ is over upper bound 1 (over the window of the receiver) ", "nf_ct_: ", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, prefix string) {
		r := normaliseInvalidReason(prefix)
		if r >= invalidReasonCount {
			t.Fatalf("reason %d out of the set", r)
		}
		// Digits are dropped: the reason of a text never depends on its numbers.
		if r2 := normaliseInvalidReason(strings.Map(func(c rune) rune {
			if c >= '0' && c <= '9' {
				return '7'
			}
			return c
		}, prefix)); r2 != r {
			t.Fatalf("%q is %s but with other digits %s", prefix, r, r2)
		}
	})
}
