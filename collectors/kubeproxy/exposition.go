package kubeproxy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"
	"unicode/utf8"
)

// kube-proxy's metrics are read by a line scan of its text exposition (the Prometheus text
// format 0.0.4, or OpenMetrics text when the response says so) that keeps only the samples of
// the families read here. Memory does not depend on the body: one line buffer of
// metricsLineBytes, a few IP families, and sums. Every line is checked for syntax, so a body
// that is not an exposition (an HTML page, a stream cut by a failed read) still makes
// kube-proxy count as not answering, as the full parse did; what spans lines (a second TYPE
// line for a family, duplicate label names on lines not read) is not checked.

// Families read, as indexes into familyNames.
const (
	famLastSync = iota
	famLastQueued
	famEndpointsPending
	famServicesPending
	famIPTablesRestore
	famNFTablesSync
	famInvalidDropped
	famEndpointChanges
	famServiceChanges
	famFullSyncs
	famBuildInfo
	famStartTime
	numFamilies
)

var familyNames = [numFamilies]string{
	famLastSync:         kpLastSync,
	famLastQueued:       kpLastQueued,
	famEndpointsPending: kpEndpointsPending,
	famServicesPending:  kpServicesPending,
	famIPTablesRestore:  kpIPTablesRestore,
	famNFTablesSync:     kpNFTablesSync,
	famInvalidDropped:   kpInvalidDropped,
	famEndpointChanges:  kpEndpointChanges,
	famServiceChanges:   kpServiceChanges,
	famFullSyncs:        kpFullSyncs,
	famBuildInfo:        kpBuildInfo,
	famStartTime:        kpStartTime,
}

const (
	// metricsLineBytes is the longest line of kube-proxy's metrics read; longer lines are
	// skipped and counted (kube-proxy's own lines are a few hundred bytes at most).
	metricsLineBytes = 64 << 10
	// maxIPFamilies bounds the ip_family values kept from the sync timestamps and failure
	// counters; kube-proxy has IPv4 and IPv6 (or no label at all on old versions). Samples of
	// further values are counted and left out.
	maxIPFamilies = 8
)

// familyOf is the index of the family read that a sample's name belongs to, or -1. A quoted
// name with an escape in it matches none: no family read has a quote, backslash or newline.
func familyOf(name []byte, escaped bool) int {
	if escaped || !bytes.HasPrefix(name, []byte("kubeproxy_")) && !bytes.HasPrefix(name, []byte("kubernetes_")) &&
		string(name) != kpStartTime {
		return -1
	}
	for i, f := range familyNames {
		if string(name) == f {
			return i
		}
	}
	return -1
}

// kpMetrics is what is kept of kube-proxy's metrics while they are scanned.
type kpMetrics struct {
	// Per IP family, the last applied sync and the last queued one (a later sample of the same
	// series overwrites an earlier one), and the failed syncs.
	families        [maxIPFamilies]ipFamilySyncs
	numFamilies     int
	droppedFamilies int // samples of IP families past maxIPFamilies, left out
	sums            [numFamilies]float64
	has             [numFamilies]bool
	// version is kubernetes_build_info's git_version: the version kube-proxy was built at.
	version string
}

// maxVersionBytes bounds the version kept from kube-proxy's build info (a release's is
// "v1.37.2", a distribution's a few dozen bytes more at most).
const maxVersionBytes = 128

type ipFamilySyncs struct {
	name         string
	last, queued time.Time
	failures     float64 // iptables-restore and nftables sync failures
}

func (k *kpMetrics) add(fam int, s *sampleLine) {
	k.has[fam] = true
	switch fam {
	case famLastSync, famLastQueued:
		f := k.family(s.ipFamily)
		if f == nil {
			k.droppedFamilies++
			return
		}
		if fam == famLastSync {
			f.last = secondsTime(s.value)
		} else {
			f.queued = secondsTime(s.value)
		}
	case famBuildInfo:
		// Compared first: a repeated sample allocates nothing.
		if s.hasGitVersion && len(s.gitVersion) <= maxVersionBytes && string(s.gitVersion) != k.version {
			k.version = string(s.gitVersion)
		}
	case famIPTablesRestore, famNFTablesSync:
		k.sums[fam] += s.value
		if f := k.family(s.ipFamily); f != nil {
			f.failures += s.value
		} else {
			k.droppedFamilies++
		}
	default:
		k.sums[fam] += s.value
	}
}

func (k *kpMetrics) family(name []byte) *ipFamilySyncs {
	for i := range k.numFamilies {
		if k.families[i].name == string(name) {
			return &k.families[i]
		}
	}
	if k.numFamilies == maxIPFamilies {
		return nil
	}
	f := &k.families[k.numFamilies]
	k.numFamilies++
	f.name = string(name)
	return f
}

// apply takes what an on-call needs from kube-proxy's metrics into res: per IP family the last
// applied and queued syncs, folded to the worst family, and the pending and failure figures
// summed over IP families.
func (k *kpMetrics) apply(res *probeResult) {
	for _, f := range k.families[:k.numFamilies] {
		res.families[res.numFamilies] = familySyncs{name: f.name, last: f.last, failures: f.failures}
		res.numFamilies++
		last, queued := f.last, f.queued
		if !last.IsZero() && (!res.hasLastSync || last.Before(res.lastSync)) {
			res.lastSync, res.hasLastSync = last, true
		}
		if last.After(res.newestSync) {
			res.newestSync = last
		}
		// A queued change is pending while kube-proxy queued a sync after its last applied one.
		if queued.After(last) && (res.pendingSince.IsZero() || queued.Before(res.pendingSince)) {
			res.pendingSince = queued
		}
	}
	res.endpointsPending, res.hasEndpointsPending = k.sums[famEndpointsPending], k.has[famEndpointsPending]
	res.servicesPending, res.hasServicesPending = k.sums[famServicesPending], k.has[famServicesPending]
	// 0 when kube-proxy has not failed yet (a labelled counter has no series until then).
	res.iptablesRestoreFailures = k.sums[famIPTablesRestore]
	res.nftablesSyncFailures = k.sums[famNFTablesSync]
	res.restoreFailures = res.iptablesRestoreFailures + res.nftablesSyncFailures
	res.started = secondsTime(k.sums[famStartTime])
	res.invalidDropped, res.hasInvalidDropped = k.sums[famInvalidDropped], k.has[famInvalidDropped]
	res.changes.received = k.sums[famEndpointChanges] + k.sums[famServiceChanges]
	res.changes.fullSyncs = k.sums[famFullSyncs]
	res.changes.known = k.has[famEndpointChanges] && k.has[famServiceChanges] && k.has[famFullSyncs] &&
		k.has[famEndpointsPending] && k.has[famServicesPending]
	res.version = k.version
}

// metricsScan says how a scan of kube-proxy's metrics went, beyond the families read.
type metricsScan struct {
	lines           int  // lines read
	longLines       int  // lines longer than the line buffer, skipped
	longLinesRead   int  // of those, lines of a family read (a sample lost)
	truncated       bool // the body went on past the byte cap; what was past it was not read
	droppedFamilies int  // sync timestamp samples of IP families past maxIPFamilies
}

// scanMetrics reads an exposition from r, at most limit bytes of it, through a line buffer of
// lineBytes, into k. It fails on the first line that is not valid syntax, and on a read error.
// A line cut by the byte cap is dropped; a last line without a newline is read.
func scanMetrics(r io.Reader, limit int64, lineBytes int, openMetrics bool, k *kpMetrics) (st metricsScan, _ error) {
	cr := &capReader{r: r, left: limit}
	br := bufio.NewReaderSize(cr, lineBytes)
	p := expoParser{openMetrics: openMetrics}
	defer func() { st.droppedFamilies = k.droppedFamilies }()
	for {
		line, err := br.ReadSlice('\n')
		long := errors.Is(err, bufio.ErrBufferFull)
		if long {
			st.lines++
			st.longLines++
			if name, escaped, ok := sampleName(line); ok && familyOf(name, escaped) >= 0 {
				st.longLinesRead++
			}
			for errors.Is(err, bufio.ErrBufferFull) {
				_, err = br.ReadSlice('\n')
			}
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return st, err
		}
		eof := err != nil
		if eof && cr.over {
			st.truncated = true
			return st, nil // the line the cap cut, if any, is dropped
		}
		if !long && len(line) > 0 {
			st.lines++
			kind, s, err := p.parseLine(line)
			if err != nil {
				return st, fmt.Errorf("line %d: %w", st.lines, err)
			}
			switch kind {
			case expoEOF:
				return st, nil
			case expoSample:
				if fam := familyOf(s.name, s.nameEscaped); fam >= 0 {
					k.add(fam, &s)
				}
			}
		}
		if eof {
			return st, nil
		}
	}
}

// capReader reads at most left bytes of r, and tells whether r had more.
type capReader struct {
	r       io.Reader
	left    int64
	checked bool // whether r was asked for a byte past the cap
	over    bool // it had one
	one     [1]byte
}

func (c *capReader) Read(p []byte) (int, error) {
	if c.left <= 0 {
		if !c.checked {
			n, _ := io.ReadFull(c.r, c.one[:])
			c.checked, c.over = true, n > 0
		}
		return 0, io.EOF
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.r.Read(p)
	c.left -= int64(n)
	return n, err
}

// expoKind is what a line of an exposition is.
type expoKind uint8

const (
	expoSkip   expoKind = iota // blank, or a comment (HELP, TYPE, UNIT or other)
	expoSample                 // a sample
	expoEOF                    // OpenMetrics' "# EOF": the end of the exposition
)

// sampleLine is one sample line. name, ipFamily and gitVersion point into the line or the
// parser's scratch buffers: they are valid until the next line is parsed.
type sampleLine struct {
	name        []byte // the metric name as written, without its quotes when quoted
	nameEscaped bool   // name is quoted and holds an escape, left as written
	ipFamily    []byte // the ip_family label's value, unescaped; empty when absent
	hasIPFamily bool
	// gitVersion is the git_version label's value, unescaped (kubernetes_build_info has it).
	gitVersion    []byte
	hasGitVersion bool
	value         float64
}

// expoParser parses lines of the Prometheus text format (0.0.4, with the quoted UTF-8 names
// of later versions) or of OpenMetrics text. It keeps nothing between lines but its scratch
// buffer, which never grows past the longest line.
type expoParser struct {
	openMetrics bool
	// scratch and versionScratch hold the ip_family and git_version values unescaped.
	scratch, versionScratch []byte
}

// expoError is a syntax error in one line.
type expoError string

func (e expoError) Error() string { return string(e) }

// parseLine parses one line, with or without its newline.
func (p *expoParser) parseLine(line []byte) (expoKind, sampleLine, error) {
	line = bytes.TrimSuffix(line, []byte{'\n'})
	line = bytes.TrimSuffix(line, []byte{'\r'})
	var s sampleLine
	i := skipBlanks(line, 0)
	if i == len(line) {
		return expoSkip, s, nil
	}
	if line[i] == '#' {
		kind, err := p.parseComment(line[i+1:])
		return kind, s, err
	}
	hasName := false
	if line[i] != '{' {
		name, escaped, n, err := readName(line[i:], true)
		if err != nil {
			return expoSkip, s, err
		}
		if n == 0 {
			return expoSkip, s, expoError(fmt.Sprintf("invalid metric name at %q", clip(line[i:])))
		}
		s.name, s.nameEscaped, hasName = name, escaped, true
		i = skipBlanks(line, i+n)
	}
	if i < len(line) && line[i] == '{' {
		var err error
		if i, err = p.parseLabels(line, i+1, !hasName, &s); err != nil {
			return expoSkip, s, err
		}
		i = skipBlanks(line, i)
	}
	if len(s.name) == 0 {
		return expoSkip, s, expoError("no metric name")
	}
	end := tokenEnd(line, i)
	if end == i {
		return expoSkip, s, expoError(fmt.Sprintf("no value for metric %q", clip(s.name)))
	}
	v, err := parseValue(line[i:end])
	if err != nil {
		return expoSkip, s, expoError(fmt.Sprintf("expected a float as value, got %q", clip(line[i:end])))
	}
	s.value = v
	i = skipBlanks(line, end)
	if i < len(line) && !(p.openMetrics && line[i] == '#') {
		end = tokenEnd(line, i)
		if !p.validTimestamp(line[i:end]) {
			return expoSkip, s, expoError(fmt.Sprintf("expected a timestamp, got %q", clip(line[i:end])))
		}
		i = skipBlanks(line, end)
	}
	if i < len(line) && !(p.openMetrics && line[i] == '#') { // OpenMetrics: an exemplar follows
		return expoSkip, s, expoError(fmt.Sprintf("spurious text after the value: %q", clip(line[i:])))
	}
	return expoSample, s, nil
}

// parseLabels parses a label set from line[i:], just after its '{', into s; nameInside says
// the metric name may be given inside it (the line starts with '{'). It returns the index
// after the closing '}'.
func (p *expoParser) parseLabels(line []byte, i int, nameInside bool, s *sampleLine) (int, error) {
	for {
		i = skipBlanks(line, i)
		if i == len(line) {
			return i, expoError("unterminated label set")
		}
		if line[i] == '}' {
			return i + 1, nil
		}
		name, escaped, n, err := readName(line[i:], false)
		if err != nil {
			return i, err
		}
		if n == 0 {
			return i, expoError(fmt.Sprintf("invalid label name at %q", clip(line[i:])))
		}
		i = skipBlanks(line, i+n)
		switch {
		case i < len(line) && line[i] == '=':
			if !escaped && string(name) == "__name__" {
				return i, expoError(`label name "__name__" is reserved`)
			}
			i = skipBlanks(line, i+1)
			if i == len(line) || line[i] != '"' {
				return i, expoError(fmt.Sprintf("expected '\"' at the start of the value of label %q", clip(name)))
			}
			value, vescaped, n, err := readQuoted(line[i:])
			if err != nil {
				return i, err
			}
			i += n
			switch {
			case escaped:
			case string(name) == "ip_family":
				if s.hasIPFamily {
					return i, expoError("duplicate label ip_family")
				}
				s.hasIPFamily = true
				s.ipFamily = value
				if vescaped {
					p.scratch = unescape(p.scratch[:0], value)
					s.ipFamily = p.scratch
				}
			case string(name) == "git_version":
				if s.hasGitVersion {
					return i, expoError("duplicate label git_version")
				}
				s.hasGitVersion = true
				s.gitVersion = value
				if vescaped {
					p.versionScratch = unescape(p.versionScratch[:0], value)
					s.gitVersion = p.versionScratch
				}
			}
		case nameInside:
			if len(s.name) > 0 {
				return i, expoError("two metric names")
			}
			s.name, s.nameEscaped = name, escaped
		default:
			return i, expoError(fmt.Sprintf("expected '=' after label name %q", clip(name)))
		}
		i = skipBlanks(line, i)
		switch {
		case i == len(line):
			return i, expoError("unterminated label set")
		case line[i] == ',':
			i++
		case line[i] == '}':
			return i + 1, nil
		default:
			return i, expoError(fmt.Sprintf("expected ',' or '}' in the label set, got %q", line[i]))
		}
	}
}

// parseComment parses what follows a '#'.
func (p *expoParser) parseComment(rest []byte) (expoKind, error) {
	i := skipBlanks(rest, 0)
	end := tokenEnd(rest, i)
	keyword := rest[i:end]
	if p.openMetrics && string(keyword) == "EOF" && skipBlanks(rest, end) == len(rest) {
		return expoEOF, nil
	}
	if string(keyword) != "HELP" && string(keyword) != "TYPE" {
		return expoSkip, nil // any other comment
	}
	i = skipBlanks(rest, end)
	if i == len(rest) {
		return expoSkip, nil
	}
	_, _, n, err := readName(rest[i:], true)
	if err != nil {
		return expoSkip, err
	}
	i += n
	if i == len(rest) {
		return expoSkip, nil
	}
	if n == 0 || !isBlank(rest[i]) {
		return expoSkip, expoError(fmt.Sprintf("invalid metric name in a %s line", keyword))
	}
	i = skipBlanks(rest, i)
	if i == len(rest) {
		return expoSkip, nil
	}
	text := bytes.TrimRight(rest[i:], " \t")
	if string(keyword) == "HELP" {
		for j := 0; j < len(text); j++ {
			if text[j] == '\\' {
				if j+1 == len(text) || !validEscape(text[j+1]) {
					return expoSkip, expoError("invalid escape in a HELP line")
				}
				j++
			}
		}
		return expoSkip, nil
	}
	for _, t := range metricTypes {
		if bytes.EqualFold(text, []byte(t)) {
			return expoSkip, nil
		}
	}
	return expoSkip, expoError(fmt.Sprintf("unknown metric type %q", clip(text)))
}

// metricTypes are the TYPE values of the text format and of OpenMetrics.
var metricTypes = []string{"counter", "gauge", "summary", "untyped", "histogram", "gauge_histogram", "gaugehistogram", "unknown", "info", "stateset"}

// readName reads a name at the start of b: a quoted one (any UTF-8, with escapes), or a bare
// one ([a-zA-Z_:][a-zA-Z0-9_:]* for a metric, no ':' for a label). n is the bytes taken, 0 when
// b starts with no name.
func readName(b []byte, metric bool) (name []byte, escaped bool, n int, err error) {
	if len(b) == 0 {
		return nil, false, 0, nil
	}
	if b[0] == '"' {
		name, escaped, n, err = readQuoted(b)
		if err == nil && len(name) == 0 {
			return nil, false, 0, expoError("empty quoted name")
		}
		return name, escaped, n, err
	}
	for n < len(b) && nameByte(b[n], n > 0, metric) {
		n++
	}
	return b[:n], false, n, nil
}

func nameByte(c byte, later, metric bool) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_' || later && c >= '0' && c <= '9' || metric && c == ':'
}

// readQuoted reads the quoted string at the start of b (b[0] is '"'): s is what is between the
// quotes as written, escaped says it holds an escape (\\, \" or \n: no other is valid). It must
// be valid UTF-8.
func readQuoted(b []byte) (s []byte, escaped bool, n int, err error) {
	for i := 1; i < len(b); i++ {
		switch b[i] {
		case '\\':
			if i+1 == len(b) || !validEscape(b[i+1]) {
				return nil, false, 0, expoError("invalid escape in a quoted string")
			}
			escaped = true
			i++
		case '"':
			s = b[1:i]
			if !utf8.Valid(s) {
				return nil, false, 0, expoError("quoted string is not valid UTF-8")
			}
			return s, escaped, i + 1, nil
		}
	}
	return nil, false, 0, expoError("unterminated quoted string")
}

func validEscape(c byte) bool { return c == '\\' || c == '"' || c == 'n' }

// unescape appends s, whose escapes readQuoted checked, unescaped to dst.
func unescape(dst, s []byte) []byte {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '\\' && i+1 < len(s) {
			i++
			c = s[i]
			if c == 'n' {
				c = '\n'
			}
		}
		dst = append(dst, c)
	}
	return dst
}

// parseValue parses a sample value as the text format has it: a Go float, "NaN", "+Inf",
// "-Inf", without hexadecimal exponents or underscores.
func parseValue(b []byte) (float64, error) {
	if bytes.ContainsAny(b, "pP_") {
		return 0, strconv.ErrSyntax
	}
	return strconv.ParseFloat(string(b), 64)
}

// validTimestamp: milliseconds as an integer in the text format, seconds as a float in
// OpenMetrics.
func (p *expoParser) validTimestamp(b []byte) bool {
	if p.openMetrics {
		_, err := parseValue(b)
		return err == nil
	}
	_, err := strconv.ParseInt(string(b), 10, 64)
	return err == nil
}

// sampleName is the metric name at the start of a (possibly partial) sample line, outside its
// braces or first inside them.
func sampleName(line []byte) (name []byte, escaped bool, ok bool) {
	i := skipBlanks(line, 0)
	if i < len(line) && line[i] == '#' {
		return nil, false, false
	}
	if i < len(line) && line[i] == '{' {
		i = skipBlanks(line, i+1)
	}
	name, escaped, n, err := readName(line[i:], true)
	return name, escaped, err == nil && n > 0
}

func isBlank(c byte) bool { return c == ' ' || c == '\t' }

func skipBlanks(b []byte, i int) int {
	for i < len(b) && isBlank(b[i]) {
		i++
	}
	return i
}

func tokenEnd(b []byte, i int) int {
	for i < len(b) && !isBlank(b[i]) {
		i++
	}
	return i
}

// clip shortens b for an error message.
func clip(b []byte) string {
	const most = 64
	if len(b) > most {
		return string(b[:most]) + "..."
	}
	return string(b)
}
