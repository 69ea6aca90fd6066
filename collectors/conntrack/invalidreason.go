package conntrack

import (
	"bytes"
)

// invalidReason is why conntrack marked a packet INVALID, normalised from the prefix of its
// log message (nf_l4proto_log_invalid: "nf_ct_proto_<protocol>: <text>"). The set is closed, so
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

// normaliseInvalidReason maps a conntrack INVALID log prefix to its reason.
func normaliseInvalidReason(prefix string) invalidReason {
	return normaliseInvalidReasonBytes([]byte(prefix))
}

// normaliseInvalidReasonBytes is normaliseInvalidReason on the prefix as the log message
// carries it, without allocating: it runs once per logged packet.
func normaliseInvalidReasonBytes(prefix []byte) invalidReason {
	text := prefix
	if rest, ok := bytes.CutPrefix(text, []byte("nf_ct_")); ok {
		// "nf_ct_proto_6: text", or another conntrack module's "nf_ct_<name>: text".
		if _, after, found := bytes.Cut(rest, []byte(": ")); found {
			text = after
		}
	}
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
