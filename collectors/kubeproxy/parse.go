package kubeproxy

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"time"
)

// Reflector failures are counted per resource and verb. The resources are a fixed set (what
// kube-proxy's informers watch, now and in older versions) plus "other", so a strange log line
// can never add series.
const (
	resServices = iota
	resEndpoints
	resEndpointSlices
	resNodes
	resServiceCIDRs
	resOther
	numResources
)

var resourceNames = [numResources]string{"services", "endpoints", "endpointslices", "nodes", "servicecidrs", "other"}

const (
	verbList = iota
	verbWatch
	numVerbs
)

var verbNames = [numVerbs]string{"list", "watch"}

// logEvent is one reflector failure found in a log line.
type logEvent struct {
	resource int
	verb     int
	ts       time.Time // zero when the line carries no time that could be read
}

// resourceOf maps a reflector's type description (`*v1.Service`, `*v1beta1.ServiceCIDR`, or a
// bare kind) to the plural lowercase resource name: unknown kinds are lowercased with an "s"
// appended, and anything outside the fixed set counts as "other".
func resourceOf(typ string) int {
	kind := strings.TrimLeft(strings.TrimSpace(typ), "*")
	if i := strings.LastIndexByte(kind, '.'); i >= 0 {
		kind = kind[i+1:]
	}
	plural := strings.ToLower(kind)
	if plural != "endpoints" {
		plural += "s"
	}
	for i, name := range resourceNames[:resOther] {
		if plural == name {
			return i
		}
	}
	return resOther
}

// splitCRI splits a line of the CRI log format that the kubelet's container runtime writes
// under /var/log/pods: `<RFC3339Nano time> <stdout|stderr> <F|P> <message>`. partial is true for
// a P (partial) record, whose message continues in the next record of the same file.
func splitCRI(line []byte) (ts, msg []byte, partial, ok bool) {
	// The time is at least "2006-01-02T15:04:05Z".
	if len(line) < 20 || line[0] < '0' || line[0] > '9' || line[4] != '-' || line[10] != 'T' {
		return nil, nil, false, false
	}
	sp := bytes.IndexByte(line, ' ')
	if sp < 0 {
		return nil, nil, false, false
	}
	ts, rest := line[:sp], line[sp+1:]
	switch {
	case bytes.HasPrefix(rest, []byte("stdout ")):
		rest = rest[len("stdout "):]
	case bytes.HasPrefix(rest, []byte("stderr ")):
		rest = rest[len("stderr "):]
	default:
		return nil, nil, false, false
	}
	if len(rest) < 1 || (rest[0] != 'F' && rest[0] != 'P') {
		return nil, nil, false, false
	}
	partial = rest[0] == 'P'
	rest = rest[1:]
	// The tag may carry more fields after a colon in future formats ("F:x"); the message
	// follows the first space, and an empty message has none.
	if i := bytes.IndexByte(rest, ' '); i >= 0 {
		msg = rest[i+1:]
	} else {
		msg = rest[len(rest):]
	}
	return ts, msg, partial, true
}

// parseCRITime reads a CRI record's time.
func parseCRITime(ts []byte) time.Time {
	t, err := time.Parse(time.RFC3339Nano, string(ts))
	if err != nil {
		return time.Time{}
	}
	return t
}

// Markers of every reflector failure form; a line containing none of them is skipped without
// further work (and without allocating), which is what almost every kube-proxy line is.
var (
	markFailedTo   = []byte("ailed to ")
	markEndedWith  = []byte("ended with")
	markUnhandled  = []byte("Unhandled Error")
	klogTextHeader = []byte("] ")
)

// parseLine classifies one complete log line: a CRI record (its message is classified; a
// partial record on its own is classified as far as it goes), plain klog text, or klog JSON.
// now supplies the year of a klog text header (which has none).
func parseLine(line []byte, now time.Time) (logEvent, bool) {
	if ts, msg, _, ok := splitCRI(line); ok {
		ev, found := parseMessage(msg, now)
		if found {
			if t := parseCRITime(ts); !t.IsZero() {
				ev.ts = t
			}
		}
		return ev, found
	}
	return parseMessage(line, now)
}

// parseMessage classifies one kube-proxy log message, as klog writes it in text or JSON, and
// returns the reflector failure it reports, if any.
//
// The forms, oldest first:
//
//	E... reflector.go:153] k8s.io/client-go/informers/factory.go:135: Failed to list *v1.Service: <err>
//	W... reflector.go:302] <name>: watch of *v1.Endpoints ended with: <err>
//	E... reflector.go:147] <name>: Failed to watch *v1.Service: failed to list *v1.Service: <err>
//	E... reflector.go:158] "Unhandled Error" err="<name>: Failed to watch *v1.Service: failed to list ..." logger="UnhandledError"
//	E... reflector.go:205] "Failed to watch" err="failed to list *v1.EndpointSlice: <err>" logger="UnhandledError" reflector="..." type="*v1.EndpointSlice"
//	I... reflector.go:664] "Warning: watch ended with error" reflector="..." type="*v1.Service" err="<err>"
//
// and the same messages as klog JSON ({"ts":<ms>,"msg":"Failed to watch","err":"..."}). The verb
// comes from the inner error: a "Failed to watch" whose error says "failed to list" is a list
// failure. Client-go versions that log a lower-case "failed to list *v1.Service: ..." warning
// before the "Failed to watch" error of the same failure have that warning skipped, so each
// failure counts once.
func parseMessage(msg []byte, now time.Time) (logEvent, bool) {
	if !bytes.Contains(msg, markFailedTo) && !bytes.Contains(msg, markEndedWith) && !bytes.Contains(msg, markUnhandled) {
		return logEvent{}, false
	}
	trimmed := bytes.TrimSpace(msg)
	if len(trimmed) > 0 && trimmed[0] == '{' {
		return parseJSON(trimmed)
	}
	var ts time.Time
	body := trimmed
	if hdrTime, rest, ok := splitKlogHeader(trimmed); ok {
		ts = klogHeaderTime(hdrTime, now)
		body = rest
	}
	var ev logEvent
	var ok bool
	if len(body) > 0 && body[0] == '"' {
		m, n := unquotePrefix(string(body))
		if n == 0 {
			return logEvent{}, false
		}
		s := string(body[n:])
		ev, ok = classifyStructured(m, kvValue(s, "err"), kvValue(s, "type"))
	} else {
		ev, ok = classifyText(string(body))
	}
	if ok {
		ev.ts = ts
	}
	return ev, ok
}

// splitKlogHeader splits klog's text header "Lmmdd hh:mm:ss.uuuuuu threadid file:line] " from
// the message; hdrTime is "mmdd hh:mm:ss.uuuuuu".
func splitKlogHeader(line []byte) (hdrTime, rest []byte, ok bool) {
	if len(line) < 22 || !strings.ContainsRune("IWEF", rune(line[0])) || line[5] != ' ' || line[8] != ':' {
		return nil, nil, false
	}
	end := bytes.Index(line, klogTextHeader)
	if end < 0 {
		return nil, nil, false
	}
	return line[1:21], line[end+2:], true
}

// klogHeaderTime reads the header's time in the local zone; the year is now's, or the one
// before when that would put the line more than a day in the future (a log read across New Year).
func klogHeaderTime(hdr []byte, now time.Time) time.Time {
	t, err := time.ParseInLocation("0102 15:04:05.000000", string(hdr), now.Location())
	if err != nil {
		return time.Time{}
	}
	t = t.AddDate(now.Year(), 0, 0)
	if t.After(now.Add(24 * time.Hour)) {
		t = t.AddDate(-1, 0, 0)
	}
	return t
}

// classifyStructured classifies a structured (key=value or JSON) reflector message.
func classifyStructured(msg, errText, typ string) (logEvent, bool) {
	switch {
	case msg == "Failed to watch" || (msg == "Failed to list" && typ != ""):
		verb := verbWatch
		inner := strings.TrimSpace(errText)
		if msg == "Failed to list" || strings.HasPrefix(inner, "failed to list") {
			verb = verbList
		}
		if typ == "" {
			// A multi-line err value hides type= on a later line; the inner error names it too.
			if rest, ok := strings.CutPrefix(inner, "failed to list "); ok {
				typ, _, _ = strings.Cut(rest, ":")
			}
		}
		return logEvent{resource: resourceOf(typ), verb: verb}, true
	case msg == "Warning: watch ended with error" || strings.HasPrefix(msg, "watch ended with"):
		return logEvent{resource: resourceOf(typ), verb: verbWatch}, true
	case msg == "Unhandled Error":
		return classifyText(errText)
	}
	return logEvent{}, false
}

// classifyText classifies an unstructured client-go reflector message ("<name>: Failed to ...").
// The reflector names its type as a Go pointer type ("*v1.Service"); other messages that happen
// to say "Failed to list" (kube-proxy's own, about iptables or nftables) name none and do not count.
func classifyText(s string) (logEvent, bool) {
	if _, rest, ok := strings.Cut(s, "Failed to watch "); ok {
		if typ, inner, ok := cutType(rest, ": "); ok {
			verb := verbWatch
			if strings.HasPrefix(strings.TrimSpace(inner), "failed to list") {
				verb = verbList
			}
			return logEvent{resource: resourceOf(typ), verb: verb}, true
		}
	}
	if _, rest, ok := strings.Cut(s, "Failed to list "); ok {
		if typ, _, ok := cutType(rest, ":"); ok {
			return logEvent{resource: resourceOf(typ), verb: verbList}, true
		}
	}
	if _, rest, ok := strings.Cut(s, "watch of "); ok {
		// An expired resource version ends a watch in the normal course of things.
		if typ, inner, ok := cutType(rest, " ended with"); ok && !strings.Contains(inner, "too old resource version") {
			return logEvent{resource: resourceOf(typ), verb: verbWatch}, true
		}
	}
	return logEvent{}, false
}

// cutType cuts a reflector type description ("*v1.Service") at sep; ok is false when s does not
// start with one.
func cutType(s, sep string) (typ, rest string, ok bool) {
	typ, rest, found := strings.Cut(s, sep)
	if !found || len(typ) < 2 || typ[0] != '*' || strings.ContainsAny(typ, " \t") {
		return "", "", false
	}
	return typ, rest, true
}

// unquotePrefix reads the Go-quoted string at the start of s (klog quotes messages and string
// values with strconv.Quote); n is how many bytes it took, 0 when s does not start with one.
func unquotePrefix(s string) (string, int) {
	if len(s) == 0 || s[0] != '"' {
		return "", 0
	}
	for i := 1; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '"':
			if u, err := strconv.Unquote(s[:i+1]); err == nil {
				return u, i + 1
			}
			return s[1:i], i + 1
		}
	}
	return "", 0
}

// kvValue finds ` key="value"` in a klog text line and returns the unquoted value. Inside a
// quoted value every quote is escaped, so ` key="` cannot match there.
func kvValue(s, key string) string {
	needle := " " + key + `="`
	i := strings.Index(s, needle)
	if i < 0 {
		return ""
	}
	v, _ := unquotePrefix(s[i+len(needle)-1:])
	return v
}

// jsonLine is the part of a klog JSON line that matters here.
type jsonLine struct {
	TS   json.RawMessage `json:"ts"`
	Msg  string          `json:"msg"`
	Err  any             `json:"err"`
	Type any             `json:"type"`
}

func parseJSON(line []byte) (logEvent, bool) {
	j, ok := parseJSONLine(line)
	if !ok {
		return logEvent{}, false
	}
	ev, ok := classifyStructured(j.Msg, jsonString(j.Err), jsonString(j.Type))
	if ok {
		ev.ts = jsonTime(j.TS)
	}
	return ev, ok
}

func parseJSONLine(line []byte) (jsonLine, bool) {
	var j jsonLine
	if err := json.Unmarshal(line, &j); err != nil {
		return jsonLine{}, false
	}
	return j, true
}

func jsonString(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case nil:
		return ""
	default:
		b, _ := json.Marshal(v)
		return string(b)
	}
}

// jsonTime reads klog JSON's "ts": milliseconds since the epoch as a float (component-base's
// encoder), seconds in some older or custom setups, or an RFC 3339 string.
func jsonTime(raw json.RawMessage) time.Time {
	if len(raw) == 0 {
		return time.Time{}
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return time.Time{}
		}
		return t
	}
	var f float64
	if json.Unmarshal(raw, &f) != nil || f <= 0 || f > 1e15 {
		return time.Time{}
	}
	if f < 1e11 { // seconds: 1e11 s is the year 5138, 1e11 ms is 1973
		return time.Unix(0, int64(f*1e9))
	}
	return time.Unix(0, int64(f*1e6))
}
