package testvariant

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func TestRewriteShippedRules(t *testing.T) {
	shipped, err := os.ReadFile("../proxyhealth.rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	out, err := Rewrite(shipped, 60)
	if err != nil {
		t.Fatal(err)
	}
	text := string(out)
	// Nothing but seconds remains in for: and in ranges.
	if m := regexp.MustCompile(`(?m)^\s*for:\s*\S*[mhdwy]\s*$`).FindString(text); m != "" {
		t.Errorf("a for: not rewritten to seconds: %q", m)
	}
	if m := regexp.MustCompile(`\[[0-9]+[mhdwy]\]`).FindString(text); m != "" {
		t.Errorf("a range not rewritten to seconds: %q", m)
	}
	if !strings.Contains(text, "for: 5s") || !strings.Contains(text, "[5s]") || !strings.Contains(text, "[10s]") {
		t.Errorf("want for: 5s, [5s] and [10s] in the variant")
	}
	// Only durations changed: the same lines, and annotations untouched.
	in, got := strings.Split(string(shipped), "\n"), strings.Split(text, "\n")
	if len(in) != len(got) {
		t.Fatalf("%d lines in, %d out", len(in), len(got))
	}
	for i := range in {
		if in[i] != got[i] && !strings.Contains(in[i], "for:") && !strings.Contains(in[i], "[") {
			t.Errorf("line %d changed: %q -> %q", i+1, in[i], got[i])
		}
		if strings.Contains(in[i], "description") || strings.Contains(in[i], "{{") {
			if in[i] != got[i] {
				t.Errorf("annotation line %d changed: %q -> %q", i+1, in[i], got[i])
			}
		}
	}
	// A valid rule file, when promtool is at hand.
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Log("promtool not found: the variant is not checked by promtool")
		return
	}
	path := filepath.Join(t.TempDir(), "variant.rules.yml")
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := exec.Command(promtool, "check", "rules", path).CombinedOutput(); err != nil {
		t.Errorf("promtool check rules on the variant: %v\n%s", err, b)
	}
}

func TestRewriteForms(t *testing.T) {
	in := `groups:
  - name: g
    rules:
      - record: r
        expr: rate(x[1h]) offset 2m
      - alert: A
        expr: |
          max_over_time(rate(y[5m])[30m:1m]) > 0
          # [10m] in a comment inside the block is PromQL's business too
        for: 90s
        annotations:
          description: 'in the last [10m]'
      - alert: B
        expr: z > 0
        for: 30s
`
	want := `groups:
  - name: g
    rules:
      - record: r
        expr: rate(x[60s]) offset 2s
      - alert: A
        expr: |
          max_over_time(rate(y[5s])[30s:1s]) > 0
          # [10s] in a comment inside the block is PromQL's business too
        for: 2s
        annotations:
          description: 'in the last [10m]'
      - alert: B
        expr: z > 0
        for: 1s
`
	out, err := Rewrite([]byte(in), 60)
	if err != nil {
		t.Fatal(err)
	}
	if string(out) != want {
		t.Errorf("got:\n%s\nwant:\n%s", out, want)
	}
	if _, err := Rewrite([]byte("foo: bar\n"), 60); err == nil {
		t.Error("no error for a file without expr")
	}
}
