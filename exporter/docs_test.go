package exporter

import (
	"flag"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/alecthomas/kingpin/v2"
)

var updateDocs = flag.Bool("update-docs", false, "rewrite the generated tables of docs/flags.md and docs/metrics.md from this build (go test ./exporter -run TestGeneratedDocs -update-docs)")

// TestGeneratedDocs holds docs/flags.md to the flags as defined and docs/metrics.md to the
// descriptors the collectors send: each table between its markers is what this build writes.
// The prose around the tables is the docs' own.
func TestGeneratedDocs(t *testing.T) {
	cl := newCommandLine()
	model := cl.app.Model()
	var diagnose *kingpin.CmdModel
	for _, c := range model.Commands {
		if c.Name == "diagnose" {
			diagnose = c
		}
	}
	if diagnose == nil {
		t.Fatal("no diagnose command in the command line")
	}
	checkGenerated(t, "../docs/flags.md", map[string]string{
		"serve flags":    flagTable(model.Flags),
		"diagnose flags": flagTable(diagnose.Flags),
	})
	checkGenerated(t, "../docs/metrics.md", map[string]string{"metrics": metricTable(describedDescs(t))})
}

// flagTable renders flags as a Markdown table: name, default and help, in definition order.
func flagTable(flags []*kingpin.FlagModel) string {
	var b strings.Builder
	b.WriteString("| flag | default | meaning |\n|---|---|---|\n")
	for _, f := range flags {
		if f.Hidden || f.Name == "help" || f.Name == "version" {
			continue
		}
		name := "--" + f.Name
		def := strings.Join(f.Default, ", ")
		if f.IsBoolFlag() {
			name = "--[no-]" + f.Name
			if def == "" {
				def = "false"
			}
		}
		if f.Short != 0 {
			name += fmt.Sprintf(", -%c", f.Short)
		}
		if def != "" {
			def = "`" + def + "`"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s |\n", name, def, cell(f.HelpWithEnvar()))
	}
	return b.String()
}

// metricTable renders the descriptors as the metrics reference's rows, which
// internal/testsupport/metricsref reads back: name, type, label names and help, sorted by name. The type
// follows the metric contract (counters, and only counters, end in _total; there are no
// histograms or summaries); the golden scrapes and the lab's scrapes hold every row's type
// to what the exporter really sends.
func metricTable(descs []describedDesc) string {
	slices.SortFunc(descs, func(a, b describedDesc) int { return strings.Compare(a.name, b.name) })
	var b strings.Builder
	b.WriteString("| metric | type | labels | meaning |\n|---|---|---|---|\n")
	for _, d := range descs {
		typ := "gauge"
		if strings.HasSuffix(d.name, "_total") {
			typ = "counter"
		}
		var labels []string
		for _, l := range d.labels {
			labels = append(labels, "`"+l+"`")
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", d.name, typ, strings.Join(labels, ", "), cell(d.help))
	}
	return b.String()
}

// cell makes text fit one Markdown table cell.
func cell(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	return strings.ReplaceAll(s, "|", `\|`)
}

var generatedSection = regexp.MustCompile(`(?s)(<!-- BEGIN GENERATED: ([a-z ]+) -->\n)(.*?)(<!-- END GENERATED: ([a-z ]+) -->)`)

// checkGenerated compares each marked section of file with want (by section name), or
// rewrites them with -update-docs. Every section wanted must be in the file.
func checkGenerated(t *testing.T, file string, want map[string]string) {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	out := generatedSection.ReplaceAllStringFunc(string(b), func(section string) string {
		m := generatedSection.FindStringSubmatch(section)
		name := m[2]
		if m[5] != name {
			t.Errorf("%s: section %q ends as %q", file, name, m[5])
			return section
		}
		w, ok := want[name]
		if !ok {
			t.Errorf("%s: no generator for section %q", file, name)
			return section
		}
		seen[name] = true
		if m[3] != w && !*updateDocs {
			t.Errorf("%s: section %q is stale: run go test ./exporter -run TestGeneratedDocs -update-docs", file, name)
		}
		return m[1] + w + m[4]
	})
	for name := range want {
		if !seen[name] {
			t.Errorf("%s: no section %q (<!-- BEGIN GENERATED: %s --> ... <!-- END GENERATED: %s -->)", file, name, name, name)
		}
	}
	if *updateDocs && out != string(b) {
		if err := os.WriteFile(file, []byte(out), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
