package kubeproxy

import (
	"bytes"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// kube-proxy logs each rule sync it fails to apply with the tool's own error: iptables-restore's
// in iptables and IPVS mode, nft's in nftables mode (knftables keeps nft's stderr). That error
// is what an on-call needs, as it names what the node lacks ("Extension ipvs revision 0 not
// supported, missing kernel module?"). The forms (pkg/proxy/{iptables,ipvs,nftables}/proxier.go,
// v1.34 to v1.37), in klog text, klog JSON, or a CRI record of either:
//
//	E1128 08:01:02.345678    1234 proxier.go:1390] "Failed to execute iptables-restore" err="exit status 1: iptables-restore: line 51 failed" ipFamily="IPv4"
//	E1128 08:01:02.345678    1234 proxier.go:1390] "Failed to execute iptables-restore" err=<
//		exit status 4: iptables-restore v1.8.9 (nf_tables):
//		line 3: RULE_APPEND failed (No such file or directory): rule in chain KUBE-SERVICES
//	 > ipFamily="IPv4"
//	E1128 08:01:02.345678    1234 proxier.go:1874] "nftables sync failed" err=<
//		/dev/stdin:12:1-40: Error: Could not process rule: No such file or directory
//		...
//	 > ipFamily="IPv4"
//	{"ts":1764316862345.6,"msg":"Failed to execute iptables-restore","err":"exit status 4: ..."}
//
// klog text writes a value holding newlines as "err=<", its lines each after a tab, and " >":
// those lines are read as the message's continuation. IPVS mode adds the whole restore input as
// rules=, which is never read.

// Tools whose failure fails a sync.
const (
	toolIPTablesRestore = "iptables-restore"
	toolNFT             = "nft"
)

var (
	markRestoreFailed = []byte("Failed to execute iptables-restore")
	markNFTSyncFailed = []byte("nftables sync failed")
	markMultiLineErr  = []byte(` err=<`)
)

// Bounds of what is kept of an error: its lines, and the text they make.
const (
	maxSyncErrorLines = 12
	maxSyncErrorBytes = 512
)

// syncError is one failed sync as kube-proxy logged it.
type syncError struct {
	at   time.Time // zero when the line carried no readable time
	tool string    // toolIPTablesRestore or toolNFT
	text string    // the tool's error, sanitised: one line, at most maxSyncErrorBytes
}

// syncErrorReader finds failed syncs in the messages of one log file, in order. It keeps what
// it needs to join a klog text value written across lines; memory is bounded by
// maxSyncErrorLines lines of maxSyncErrorBytes.
type syncErrorReader struct {
	// emit is called with each failed sync completed (set once: a func value made per line
	// would allocate per line).
	emit func(syncError)
	// open is a failed sync whose err=< lines are being read; lines are those read so far.
	open  *syncError
	lines []string
}

// feed reads one complete message (a CRI record's message, or a plain line; criTS is the CRI
// record's time, if any) and calls r.emit with each failed sync it completes. now supplies the
// year of a klog text header.
func (r *syncErrorReader) feed(msg, criTS []byte, now time.Time) {
	if r.open != nil {
		if rest, ok := bytes.CutPrefix(msg, []byte{'\t'}); ok {
			if len(r.lines) < maxSyncErrorLines {
				r.lines = append(r.lines, clipLine(rest))
			}
			return
		}
		r.open.text = sanitizeSyncError(r.lines)
		r.emit(*r.open)
		r.open, r.lines = nil, r.lines[:0]
		if bytes.HasPrefix(msg, []byte(" >")) {
			return // the value's end, and what follows it on the line
		}
	}
	se, multiLine, ok := parseSyncFailure(msg, now)
	if !ok {
		return
	}
	if len(criTS) > 0 {
		if t := parseCRITime(criTS); !t.IsZero() {
			se.at = t
		}
	}
	if multiLine {
		r.open = &se
		return
	}
	r.emit(se)
}

// flush completes a failed sync whose value's end was never read (a file that ends, or a
// one-shot read that stops).
func (r *syncErrorReader) flush() {
	if r.open == nil {
		return
	}
	r.open.text = sanitizeSyncError(r.lines)
	r.emit(*r.open)
	r.open, r.lines = nil, r.lines[:0]
}

// parseSyncFailure reads one message that may report a failed sync. multiLine says its error
// follows on the next lines (klog text's err=<).
func parseSyncFailure(msg []byte, now time.Time) (se syncError, multiLine, ok bool) {
	switch {
	case bytes.Contains(msg, markRestoreFailed):
		se.tool = toolIPTablesRestore
	case bytes.Contains(msg, markNFTSyncFailed):
		se.tool = toolNFT
	default:
		return syncError{}, false, false
	}
	trimmed := bytes.TrimSpace(msg)
	if len(trimmed) > 0 && trimmed[0] == '{' {
		j, ok := parseJSONLine(trimmed)
		if !ok || !isSyncFailureMsg(j.Msg) {
			return syncError{}, false, false
		}
		se.at = jsonTime(j.TS)
		se.text = sanitizeSyncError(strings.Split(jsonString(j.Err), "\n"))
		return se, false, true
	}
	body := trimmed
	if hdrTime, rest, ok := splitKlogHeader(trimmed); ok {
		se.at = klogHeaderTime(hdrTime, now)
		body = rest
	}
	m, n := unquotePrefix(string(body))
	if n == 0 || !isSyncFailureMsg(m) {
		return syncError{}, false, false
	}
	rest := body[n:]
	if bytes.HasSuffix(rest, markMultiLineErr) || bytes.Contains(rest, append(markMultiLineErr, ' ')) {
		return se, true, true
	}
	se.text = sanitizeSyncError(strings.Split(kvValue(string(rest), "err"), "\n"))
	return se, false, true
}

func isSyncFailureMsg(m string) bool {
	return m == string(markRestoreFailed) || m == string(markNFTSyncFailed)
}

// clipLine keeps at most maxSyncErrorBytes of one line.
func clipLine(b []byte) string {
	if len(b) > maxSyncErrorBytes {
		b = b[:maxSyncErrorBytes]
	}
	return string(b)
}

// sanitizeSyncError makes one line of an error's lines for people: blank lines, the tools' usage
// hints and nft's carets dropped, each line trimmed, control characters and invalid UTF-8 replaced, joined
// with " | ", at most maxSyncErrorBytes (cut on a character, marked with "…").
func sanitizeSyncError(lines []string) string {
	var b strings.Builder
	for _, l := range lines {
		l = strings.TrimSpace(l)
		// Blank lines, usage hints, and nft's carets under the failing statement.
		if strings.Trim(l, "^~ ") == "" || strings.HasPrefix(l, "Try `") {
			continue
		}
		if b.Len() > 0 {
			b.WriteString(" | ")
		}
		b.WriteString(l)
		if b.Len() > maxSyncErrorBytes {
			break
		}
	}
	s := strings.Map(func(r rune) rune {
		if r == utf8.RuneError || unicode.IsControl(r) {
			return '?'
		}
		return r
	}, strings.ToValidUTF8(b.String(), "?"))
	if len(s) > maxSyncErrorBytes {
		cut := maxSyncErrorBytes - len("…")
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "…"
	}
	return s
}
