//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/html"
	"golang.org/x/net/html/atom"

	"github.com/proxyhealth/proxyhealth/internal/testsupport/prereq"
)

const (
	chromiumBinary = "chromium" // Debian's package of the same name
	// artifactsEnv names the directory the page renders (PNG and rendered DOM) are kept in;
	// default os.TempDir()/proxyhealth-e2e-screens. The tests log where each one went.
	artifactsEnv = "PROXYHEALTH_E2E_ARTIFACTS"

	renderTimeout = 60 * time.Second
	screenWidth   = 1280
	screenHeight  = 1600
)

// requireChromium skips the test when headless Chromium is not installed, or fails it when the
// labs must run ($PROXYHEALTH_REQUIRE_KUBE, set by .ci/run), as the other lab prerequisites do.
func requireChromium(t *testing.T) {
	t.Helper()
	requireLab(t)
	if _, err := exec.LookPath(chromiumBinary); err != nil {
		msg := chromiumBinary + " not found; install: apt-get install -y --no-install-recommends chromium"
		if os.Getenv(requireKubeEnv) != "" {
			t.Fatalf("%s (%s is set)", msg, requireKubeEnv)
		}
		prereq.Skip(t, msg)
	}
}

// artifactsDir is where the renders of t's top-level test are kept: outside t.TempDir, which is
// removed, so that a person can look at them after the run.
func artifactsDir(t *testing.T) string {
	t.Helper()
	base := os.Getenv(artifactsEnv)
	if base == "" {
		base = filepath.Join(os.TempDir(), "proxyhealth-e2e-screens")
	}
	test, _, _ := strings.Cut(t.Name(), "/")
	dir := filepath.Join(base, test)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("creating the artifacts directory: %v", err)
	}
	return dir
}

// renderedPage is a page as headless Chromium rendered it: the DOM after load (parsed), and a
// screenshot of the same load.
type renderedPage struct {
	DOM        *html.Node
	Screenshot string // PNG file
}

// renderPage loads url in headless Chromium inside network namespace ns (where the lab's
// exporter listens) with a fresh profile, and returns the rendered DOM and a screenshot of the
// same load, both kept in artifactsDir as <name>.html and <name>.png. Chromium runs in a process
// group of its own: a timeout kills it with every renderer and helper it started.
func renderPage(t *testing.T, ns, url, name string) renderedPage {
	t.Helper()
	profile, err := os.MkdirTemp("", "ph-e2e-chromium-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(profile)
	dir := artifactsDir(t)
	shot := filepath.Join(dir, name+".png")
	if err := os.Remove(shot); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), renderTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", ns, chromiumBinary,
		"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--hide-scrollbars",
		"--user-data-dir="+profile,
		fmt.Sprintf("--window-size=%d,%d", screenWidth, screenHeight),
		"--screenshot="+shot,
		"--dump-dom", url)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err = cmd.Run()
	took := time.Since(start)
	if cmd.Process != nil {
		// A helper that outlived the browser (zygote, crash handler) goes with its group.
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	if err != nil {
		t.Fatalf("chromium rendering %s: %v (after %s)\n%s", url, err, took.Round(time.Millisecond), stderr.String())
	}
	dom := stdout.String()
	if err := os.WriteFile(filepath.Join(dir, name+".html"), []byte(dom), 0o644); err != nil {
		t.Fatal(err)
	}
	doc, err := html.Parse(strings.NewReader(dom))
	if err != nil {
		t.Fatalf("parsing the DOM chromium rendered from %s: %v\n%s", url, err, dom)
	}
	checkScreenshot(t, shot)
	t.Logf("rendered %s in %s: screenshot %s, DOM %s", url, took.Round(time.Millisecond), shot, filepath.Join(dir, name+".html"))
	return renderedPage{DOM: doc, Screenshot: shot}
}

// checkScreenshot fails unless file is a PNG of the window's size.
func checkScreenshot(t *testing.T, file string) {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatalf("chromium wrote no screenshot: %v", err)
	}
	defer f.Close()
	cfg, err := png.DecodeConfig(f)
	if err != nil {
		t.Fatalf("screenshot %s: %v", file, err)
	}
	if cfg.Width != screenWidth || cfg.Height != screenHeight {
		t.Errorf("screenshot %s is %dx%d, want %dx%d", file, cfg.Width, cfg.Height, screenWidth, screenHeight)
	}
}

// findAll returns the elements under n (n included) that match, in document order.
func findAll(n *html.Node, match func(*html.Node) bool) []*html.Node {
	var out []*html.Node
	if n.Type == html.ElementNode && match(n) {
		out = append(out, n)
	}
	for c := n.FirstChild; c != nil; c = c.NextSibling {
		out = append(out, findAll(c, match)...)
	}
	return out
}

// find returns the first element under n that matches, or nil.
func find(n *html.Node, match func(*html.Node) bool) *html.Node {
	if all := findAll(n, match); len(all) > 0 {
		return all[0]
	}
	return nil
}

func attr(n *html.Node, key string) string {
	for _, a := range n.Attr {
		if a.Namespace == "" && a.Key == key {
			return a.Val
		}
	}
	return ""
}

func hasClass(n *html.Node, class string) bool {
	for _, c := range strings.Fields(attr(n, "class")) {
		if c == class {
			return true
		}
	}
	return false
}

func tagged(a atom.Atom) func(*html.Node) bool {
	return func(n *html.Node) bool { return n.DataAtom == a }
}

func classed(a atom.Atom, class string) func(*html.Node) bool {
	return func(n *html.Node) bool { return n.DataAtom == a && hasClass(n, class) }
}

// text is n's text as a reader sees it: the text nodes joined, whitespace collapsed.
func text(n *html.Node) string {
	var b strings.Builder
	var walk func(*html.Node)
	walk = func(n *html.Node) {
		switch n.Type {
		case html.TextNode:
			b.WriteString(n.Data)
		case html.ElementNode:
			if n.DataAtom == atom.Style || n.DataAtom == atom.Script {
				return
			}
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c)
		}
	}
	if n != nil {
		walk(n)
	}
	return strings.Join(strings.Fields(b.String()), " ")
}

// landingView is what the landing page shows a person, read from the rendered DOM.
type landingView struct {
	Node     string // the verdict section's heading, "Node lab-node: critical"
	Verdict  string // the verdict word
	Class    string // the verdict section's class attribute
	Findings []findingView
	// VerdictFirst: the verdict section is the first thing in the page's main element.
	VerdictFirst bool
	// CollectorsAfter: the collector table follows the verdict.
	CollectorsAfter bool
	NoFindingText   string   // the sentence of a page without findings (healthy, or unknown and why)
	MetricsRefHref  string   // the "metrics reference" link
	ProfileLinks    []string // links to the profiler, served only with --web.enable-pprof
}

// findingView is one finding as the page shows it.
type findingView struct {
	Class    string // "finding critical"
	Heading  string // "critical: stale_rules · lab/backend:http (80/tcp)"
	Summary  string
	Evidence map[string]string // the evidence table: row heading to value
	Runbook  string            // the runbook link's href
}

// readLanding reads the landing page's verdict, findings and layout from a rendered DOM.
func readLanding(t *testing.T, doc *html.Node) landingView {
	t.Helper()
	main := find(doc, tagged(atom.Main))
	if main == nil {
		t.Fatalf("the rendered landing page has no main element:\n%s", renderDOM(doc))
	}
	section := find(main, func(n *html.Node) bool { return n.DataAtom == atom.Section && attr(n, "id") == "verdict" })
	if section == nil {
		t.Fatalf("the rendered landing page has no verdict section:\n%s", renderDOM(doc))
	}
	var v landingView
	v.Class = attr(section, "class")
	v.Node = text(find(section, tagged(atom.H2)))
	v.Verdict = text(find(section, classed(atom.Span, "word")))
	first := main.FirstChild
	for first != nil && first.Type != html.ElementNode {
		first = first.NextSibling
	}
	v.VerdictFirst = first == section
	// In document order: the verdict section, then the Collectors heading and its table.
	seen := 0
	for _, n := range findAll(doc, func(*html.Node) bool { return true }) {
		switch {
		case n == section:
			seen = 1
		case seen == 1 && n.DataAtom == atom.H2 && text(n) == "Collectors":
			seen = 2
		case seen == 2 && n.DataAtom == atom.Table:
			v.CollectorsAfter = true
			seen = 3
		}
	}
	for _, f := range findAll(section, classed(atom.Div, "finding")) {
		fv := findingView{Class: attr(f, "class"), Heading: text(find(f, tagged(atom.H3))),
			Summary: text(find(f, classed(atom.P, "summary"))), Evidence: map[string]string{}}
		if table := find(f, classed(atom.Table, "evidence")); table != nil {
			for _, row := range findAll(table, tagged(atom.Tr)) {
				fv.Evidence[text(find(row, tagged(atom.Th)))] = text(find(row, tagged(atom.Td)))
			}
		}
		if a := find(f, func(n *html.Node) bool { return n.DataAtom == atom.A && text(n) == "runbook" }); a != nil {
			fv.Runbook = attr(a, "href")
		}
		v.Findings = append(v.Findings, fv)
	}
	if len(v.Findings) == 0 {
		v.NoFindingText = text(find(section, tagged(atom.P)))
	}
	if a := find(doc, func(n *html.Node) bool { return n.DataAtom == atom.A && text(n) == "metrics reference" }); a != nil {
		v.MetricsRefHref = attr(a, "href")
	}
	for _, a := range findAll(doc, func(n *html.Node) bool {
		return n.DataAtom == atom.A && strings.Contains(attr(n, "href"), "debug/pprof")
	}) {
		v.ProfileLinks = append(v.ProfileLinks, attr(a, "href"))
	}
	return v
}

func renderDOM(n *html.Node) string {
	var b bytes.Buffer
	if err := html.Render(&b, n); err != nil {
		return err.Error()
	}
	return b.String()
}

// findingWant is what a finding must show on the page.
type findingWant struct {
	Severity, Cause, Service string   // Service empty: the finding concerns no one service port
	Summary                  []string // parts the summary must contain
	// Evidence: rows the evidence table must show, each row heading to its exact value.
	Evidence map[string]string
	Runbook  string // the anchor the runbook link ends with
}

// checkLandingPage renders the exporter's landing page in headless Chromium from the lab's node
// namespace, as subtest "page/<name>" (skipped, or failed under $PROXYHEALTH_REQUIRE_KUBE,
// without Chromium), and checks the verdict the page opens with: the word, and for each finding
// its heading (severity, cause, service), summary, evidence and runbook link, in that order.
func checkLandingPage(t *testing.T, e *Exporter, name, verdict string, findings ...findingWant) {
	t.Helper()
	t.Run("page/"+name, func(t *testing.T) {
		requireChromium(t)
		page := renderPage(t, e.l.Node, strings.TrimSuffix(e.URL, "metrics"), name)
		v := readLanding(t, page.DOM)
		dom := func() string { return renderDOM(page.DOM) }
		node := e.status(t).Node
		if v.Verdict != verdict || v.Node != "Node "+node+": "+verdict || v.Class != "verdict "+verdict {
			t.Errorf("the page shows %q (word %q, class %q), want verdict %s:\n%s", v.Node, v.Verdict, v.Class, verdict, dom())
		}
		if !v.VerdictFirst || !v.CollectorsAfter {
			t.Errorf("the verdict does not open the page with the collector table after it (verdict first %v, collectors after %v):\n%s",
				v.VerdictFirst, v.CollectorsAfter, dom())
		}
		if !strings.HasPrefix(v.MetricsRefHref, "https://github.com/") {
			t.Errorf("metrics reference link %q", v.MetricsRefHref)
		}
		// The labs' exporters run without --web.enable-pprof: a profiler link would be a 404.
		if len(v.ProfileLinks) != 0 {
			t.Errorf("the page links to the profiler, which is off: %q", v.ProfileLinks)
		}
		noFinding := "No finding: Service traffic on this node shows none of the causes proxyhealth knows"
		if verdict == "unknown" {
			noFinding = "Not known to be healthy: "
		}
		if len(findings) == 0 && !strings.HasPrefix(v.NoFindingText, noFinding) {
			t.Errorf("%s page without findings: %q, want %q...", verdict, v.NoFindingText, noFinding)
		}
		if len(v.Findings) != len(findings) {
			t.Fatalf("the page shows %d findings, want %d:\n%s", len(v.Findings), len(findings), dom())
		}
		for i, want := range findings {
			got := v.Findings[i]
			heading := want.Severity + ": " + want.Cause
			if want.Service != "" {
				heading += " · " + want.Service
			}
			if got.Heading != heading || got.Class != "finding "+want.Severity {
				t.Errorf("finding %d: heading %q (class %q), want %q", i, got.Heading, got.Class, heading)
			}
			for _, s := range want.Summary {
				if !strings.Contains(got.Summary, s) {
					t.Errorf("finding %s: summary %q lacks %q", want.Cause, got.Summary, s)
				}
			}
			for key, val := range want.Evidence {
				if got, ok := got.Evidence[key]; !ok || got != val {
					t.Errorf("finding %s: evidence %s = %q (shown: %v), want %q", want.Cause, key, got, ok, val)
				}
			}
			if !strings.HasSuffix(got.Runbook, want.Runbook) || !strings.HasPrefix(got.Runbook, "https://") {
				t.Errorf("finding %s: runbook link %q, want https://...%s", want.Cause, got.Runbook, want.Runbook)
			}
		}
	})
}
