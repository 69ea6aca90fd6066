package conntrack

import (
	"bytes"
)

// invalidReason is why conntrack marked a packet INVALID, normalised from the prefix of its
// log message (nf_l4proto_log_invalid: "nf_ct_proto_<protocol>: <text> "). The set is closed, so
// the reason label stays bounded whatever the kernel writes; sequence numbers and other
// variable parts are dropped.
type invalidReason uint8

const (
	invalidOther          invalidReason = iota
	invalidTCPFlags                     // "invalid tcp flag combination"
	invalidChecksum                     // "bad checksum", ICMP's "bad hw icmp checksum", ...
	invalidNew                          // "invalid new": no SYN for a new TCP connection
	invalidICMPType                     // "invalid icmp type", ICMPv6's too
	invalidSeqOverWindow                // "SEQ is over upper bound N (over the window of the receiver)"
	invalidSeqUnderWindow               // "SEQ is under lower bound N (already ACKed data retransmitted)"
	invalidAckOverWindow                // "ACK is over upper bound N (ACKed data not seen yet)"
	invalidAckUnderWindow               // "ignored ACK under lower bound N (possible overly delayed)"
	invalidIgnored                      // "packet (index 0) in dir 0 ignored, state ESTABLISHED", ...

	invalidReasonCount
)

var invalidReasonNames = [invalidReasonCount]string{
	"other", "tcp_flags", "checksum", "invalid_new", "icmp_type",
	"seq_over_window", "seq_under_window", "ack_over_window", "ack_under_window", "ignored",
}

func (r invalidReason) String() string { return invalidReasonNames[r] }

// invalidReasonPatterns are tried in order on the lower-cased text after the protocol; the
// first whose every part occurs names the reason. The window checks come before "ignored",
// which one of them contains.
var invalidReasonPatterns = []struct {
	parts  []string
	reason invalidReason
}{
	{[]string{"seq is over upper bound"}, invalidSeqOverWindow},
	// The kernel's older wording of the same check.
	{[]string{"bytes more than expected"}, invalidSeqOverWindow},
	{[]string{"seq is under lower bound"}, invalidSeqUnderWindow},
	{[]string{"ack is over upper bound"}, invalidAckOverWindow},
	{[]string{"ack under lower bound"}, invalidAckUnderWindow},
	{[]string{"checksum"}, invalidChecksum},
	{[]string{"flag combination"}, invalidTCPFlags},
	{[]string{"invalid new"}, invalidNew},
	{[]string{"icmp", "type"}, invalidICMPType},
	{[]string{"ignored"}, invalidIgnored},
}

// conntrackInvalidText is the text of conntrack's INVALID log prefix, and whether prefix is
// one. The kernel writes it as "nf_ct_proto_%d: %pV " (nf_l4proto_log_invalid in
// net/netfilter/nf_conntrack_proto.c, the same since 4.14 through 6.1, 6.12 and later):
// the protocol number in decimal (a u8: 0-255, no leading zero), a colon and a space, the
// text, a space; nf_log cuts the whole at 127 bytes. Anything else that reaches NFLOG group 0
// is not conntrack's INVALID log: an NFLOG rule without --nflog-group ("DROP bad checksum"),
// or a conntrack helper's "nf_ct_ftp: dropping packet: ..." (a helper's drop, not an INVALID
// packet).
func conntrackInvalidText(prefix []byte) (text []byte, ok bool) {
	rest, ok := bytes.CutPrefix(prefix, []byte("nf_ct_proto_"))
	if !ok {
		return nil, false
	}
	proto := 0
	digits := 0
	for digits < len(rest) && '0' <= rest[digits] && rest[digits] <= '9' {
		proto = proto*10 + int(rest[digits]-'0')
		digits++
		if digits > 3 {
			return nil, false
		}
	}
	if digits == 0 || proto > 255 || (digits > 1 && rest[0] == '0') {
		return nil, false
	}
	return bytes.CutPrefix(rest[digits:], []byte(": "))
}

// invalidLogReason is the reason of one message's prefix in NFLOG group 0; ok is false when
// it is not conntrack's INVALID log (conntrackInvalidText).
func invalidLogReason(prefix []byte) (r invalidReason, ok bool) {
	text, ok := conntrackInvalidText(prefix)
	if !ok {
		return invalidOther, false
	}
	return invalidTextReason(text), true
}

// invalidTextReason maps the text of conntrack's INVALID log, after "nf_ct_proto_N: ", to its
// reason, without allocating: it runs once per logged packet.
func invalidTextReason(text []byte) invalidReason {
	// The kernel's texts are far shorter; a longer one is judged by its start.
	var lower [160]byte
	n := copy(lower[:], bytes.TrimSpace(text))
	for i, c := range lower[:n] {
		if 'A' <= c && c <= 'Z' {
			lower[i] = c + 'a' - 'A'
		}
	}
	for _, p := range invalidReasonPatterns {
		if containsAll(lower[:n], p.parts) {
			return p.reason
		}
	}
	return invalidOther
}

func containsAll(s []byte, parts []string) bool {
	for _, p := range parts {
		if bytes.Index(s, []byte(p)) < 0 {
			return false
		}
	}
	return true
}
