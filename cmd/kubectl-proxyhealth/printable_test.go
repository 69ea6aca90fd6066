package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/proxyhealth/proxyhealth/internal/verdict"
)

func TestPrintable(t *testing.T) {
	for in, want := range map[string]string{
		"worker-1":                     "worker-1",
		"lab/web: 1163 INVALID (é, ü)": "lab/web: 1163 INVALID (é, ü)",
		"\x1b[2J\x1b[H":                `\x1b[2J\x1b[H`,
		"\x1b]0;owned\x07":             `\x1b]0;owned\a`,
		"a\tb\nc\rd":                   `a\tb\nc\rd`,
		"evil\u202etxt.exe":            `evil\u202etxt.exe`,
		"\u200bzero width":             `\u200bzero width`,
		"del\x7f":                      `del\x7f`,
		"c1\u009b31m":                  `c1\u009b31m`,
		"bad\xff\xfeutf8":              `bad\xff\xfeutf8`,
		`back\slash`:                   `back\slash`,
	} {
		if got := printable(in); got != want {
			t.Errorf("printable(%q) = %q, want %q", in, got, want)
		}
	}
}

// Whatever an exporter sends, what is printed is valid UTF-8 of printable runes only.
func FuzzPrintable(f *testing.F) {
	f.Add("\x1b[31mred\x1b[0m")
	f.Add("evil\u202etxt\xff")
	f.Fuzz(func(t *testing.T, in string) {
		out := printable(in)
		if !utf8.ValidString(out) {
			t.Fatalf("printable(%q) = %q: not UTF-8", in, out)
		}
		for _, r := range out {
			if !unicode.IsPrint(r) {
				t.Fatalf("printable(%q) = %q holds %U", in, out, r)
			}
		}
	})
}

// hostile are strings an exporter, or whoever answers in its place, could put in /status:
// a screen clear, a window title, a right-to-left override, a C1 CSI, a tab and a newline
// that would break the table, and invalid UTF-8.
var hostile = []string{"\x1b[2J\x1b[H", "\x1b]0;owned\x07", "evil\u202etxt", "\u009b31m", "a\tb\nc", "\xff\xfe"}

// hostileStatus is a critical /status whose every string holds the hostile ones.
func hostileStatus(t *testing.T, node string) []byte {
	t.Helper()
	h := strings.Join(hostile, "")
	svc := verdict.Service{Namespace: "lab" + h, Name: "web" + h, Port: 80, Protocol: "tcp" + h, PortName: "http" + h}
	stale := staleFinding(svc, []string{"10.0.0.1:80" + h}, []string{"10.0.0.2:80" + h}, 1, 2)
	b, err := json.Marshal(verdict.Report{Node: node + h, Verdict: verdict.CriticalFound, Time: time.Now().UTC(),
		Findings: []verdict.Finding{stale,
			{Cause: verdict.Cause("cause" + h), Severity: verdict.Warning, Summary: "summary" + h}},
		NotChecked: []verdict.NotChecked{{Causes: []verdict.Cause{verdict.Cause("unchecked" + h)}, Reason: "reason" + h}},
		Notes:      []string{"note" + h}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// onlyPrintable fails the test if text holds anything but printable runes and newlines.
func onlyPrintable(t *testing.T, what, text string) {
	t.Helper()
	if !utf8.ValidString(text) {
		t.Errorf("%s is not UTF-8:\n%q", what, text)
		return
	}
	for _, r := range text {
		if r != '\n' && !unicode.IsPrint(r) {
			t.Errorf("%s holds %U:\n%q", what, r, text)
			return
		}
	}
}

// Every string the plugin prints as text from an exporter or the API server is escaped: the
// fleet view, one Service's view, and the errors; -o json stays JSON that gives the strings
// back as they were.
func TestOutputEscapesControlCharacters(t *testing.T) {
	a := newFakeAPIServer(t)
	h := strings.Join(hostile, "")
	a.set(func(a *fakeAPIServer) {
		a.configMaps = append(a.configMaps, *reportObject("worker-1"+h, hostileStatus(t, "worker-1")))
	})
	a.addNode(t, "worker-2", []byte("<html>"+h+"</html>"))
	// The Service as the exporter's JSON gives it back: invalid UTF-8 replaced.
	valid := string([]rune(h))
	for _, args := range [][]string{nil, {"--service=lab" + valid + "/web" + valid}, {"--node=worker-1" + valid}} {
		out, errOut, code := a.run(t, args...)
		if code != exitCritical {
			t.Errorf("%q: exit %d, want %d:\n%s%s", args, code, exitCritical, out, errOut)
		}
		onlyPrintable(t, fmt.Sprintf("%q: stdout", args), out)
		onlyPrintable(t, fmt.Sprintf("%q: stderr", args), errOut)
		if !strings.Contains(out, `\x1b[2J\x1b[H\x1b]0;owned\a`) {
			t.Errorf("%q: the escapes are not shown:\n%s", args, out)
		}
	}
	// An error of the plugin's own that quotes what it was given.
	_, errOut, code := a.run(t, "--service=lab"+h)
	onlyPrintable(t, "a flag's error", errOut)
	if code != exitCannotRun || !strings.Contains(errOut, `\x1b[2J`) {
		t.Errorf("--service with no name: exit %d, %q", code, errOut)
	}

	out, errOut, code := a.run(t, "-o", "json")
	var got fleetJSON
	if code != exitCritical || json.Unmarshal([]byte(out), &got) != nil {
		t.Fatalf("-o json: exit %d, not JSON:\n%s%s", code, out, errOut)
	}
	onlyPrintable(t, "-o json", out)
	if len(got.Nodes) != 2 || got.Nodes[0].Status == nil || len(got.Nodes[0].Status.Notes) != 1 || got.Nodes[0].Status.Notes[0] != "note"+valid {
		t.Errorf("-o json does not give the strings back: %q", out)
	}
}

// escapeJSON keeps the JSON and its meaning, runes beyond the BMP included.
func TestEscapeJSON(t *testing.T) {
	in := map[string]string{"k\u202e": "del\x7f c1\u0085 tag\U000E0001 ok é \x1b"}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	out := escapeJSON(b)
	onlyPrintable(t, "escaped JSON", string(out))
	var back map[string]string
	if err := json.Unmarshal(out, &back); err != nil || back["k\u202e"] != in["k\u202e"] {
		t.Errorf("escapeJSON(%s) = %s: %v, gives back %q", b, out, err, back)
	}
}
