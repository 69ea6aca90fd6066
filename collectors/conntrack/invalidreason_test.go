package conntrack

import (
	"bytes"
	"strings"
	"testing"
)

func TestInvalidLogReason(t *testing.T) {
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
		{"nf_ct_proto_132: ", "other"},
		{"nf_ct_proto_255: bad checksum ", "checksum"},
		{"nf_ct_proto_0: invalid new ", "invalid_new"},
		// nf_log cuts the prefix at 127 bytes: the trailing space may be gone.
		{"nf_ct_proto_6: SEQ is over upper bound 2296793663 (over the window of the receiver)", "seq_over_window"},
	} {
		got, ok := invalidLogReason([]byte(tc.prefix))
		if !ok || got.String() != tc.want {
			t.Errorf("invalidLogReason(%q) = %s, %v; want %s, conntrack's", tc.prefix, got, ok, tc.want)
		}
	}
}

// Only conntrack's own prefix form counts as its INVALID log: whatever else NFLOG group 0
// carries is not classified, however much its text reads like one of conntrack's reasons.
func TestInvalidLogReasonRefusesForeignMessages(t *testing.T) {
	for _, prefix := range []string{
		"",
		"DROP bad checksum",
		"fw: ignored host",
		"invalid tcp flag combination",
		"iptables: invalid new ",
		// A conntrack helper's drop is no INVALID packet.
		"nf_ct_ftp: dropping packet: bad checksum ",
		"nf_ct_sip: dropping packet: cannot add expectation for voice ",
		// Not the kernel's "%d" of a protocol number (u8).
		"nf_ct_proto_: bad checksum ",
		"nf_ct_proto_256: bad checksum ",
		"nf_ct_proto_1000: bad checksum ",
		"nf_ct_proto_06: bad checksum ",
		"nf_ct_proto_-6: bad checksum ",
		"nf_ct_proto_6 bad checksum ",
		"nf_ct_proto_6:bad checksum ",
		"nf_ct_proto_tcp: bad checksum ",
		"NF_CT_PROTO_6: bad checksum ",
		" nf_ct_proto_6: bad checksum ",
	} {
		if r, ok := invalidLogReason([]byte(prefix)); ok {
			t.Errorf("invalidLogReason(%q) = %s, conntrack's; want a foreign message", prefix, r)
		}
	}
}

func FuzzInvalidLogReason(f *testing.F) {
	for _, s := range []string{"nf_ct_proto_6: invalid tcp flag combination ", "nf_ct_proto_6: SEQ is over upper bound 1 (over the window of the receiver) ",
		"nf_ct_proto_255: ", "nf_ct_proto_256: x", "DROP bad checksum", "nf_ct_ftp: dropping packet: x ", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, prefix string) {
		r, ok := invalidLogReason([]byte(prefix))
		if r >= invalidReasonCount {
			t.Fatalf("reason %d out of the set", r)
		}
		if !ok {
			if r != invalidOther {
				t.Fatalf("%q is foreign with reason %s", prefix, r)
			}
			return
		}
		// Conntrack's prefix form, exactly.
		head, text, found := strings.Cut(prefix, ": ")
		proto, isProto := strings.CutPrefix(head, "nf_ct_proto_")
		if !found || !isProto || !isDecimalUint8(proto) {
			t.Fatalf("%q taken for conntrack's INVALID log", prefix)
		}
		// Digits of the text are dropped: the reason never depends on its numbers.
		other := strings.Map(func(c rune) rune {
			if c >= '0' && c <= '9' {
				return '7'
			}
			return c
		}, text)
		if r2, ok2 := invalidLogReason([]byte(head + ": " + other)); !ok2 || r2 != r {
			t.Fatalf("%q is %s but with other digits %s", prefix, r, r2)
		}
		// The reason is the text's alone, whatever the protocol.
		if r3 := invalidTextReason([]byte(text)); r3 != r {
			t.Fatalf("%q is %s, its text %s", prefix, r, r3)
		}
	})
}

// isDecimalUint8 says whether s is a u8 as the kernel's %d writes it.
func isDecimalUint8(s string) bool {
	if s == "" || len(s) > 3 || (len(s) > 1 && s[0] == '0') || bytes.ContainsFunc([]byte(s), func(r rune) bool { return r < '0' || r > '9' }) {
		return false
	}
	n := 0
	for _, c := range s {
		n = n*10 + int(c-'0')
	}
	return n <= 255
}
