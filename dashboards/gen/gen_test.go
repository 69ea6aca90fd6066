package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the committed dashboards")

// TestCommittedIsGenerated: the JSON under dashboards/ is exactly what the generator writes.
func TestCommittedIsGenerated(t *testing.T) {
	if *update {
		if err := write(".."); err != nil {
			t.Fatal(err)
		}
	}
	for name, d := range Files() {
		want, err := d.JSON()
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join("..", name))
		if err != nil {
			t.Fatalf("%v (run: go run ./dashboards/gen)", err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("dashboards/%s differs from the generator's output; run: go run ./dashboards/gen", name)
		}
	}
	entries, err := os.ReadDir("..")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".json") && Files()[e.Name()] == nil {
			t.Errorf("dashboards/%s is not generated (remove it or add it to Files)", e.Name())
		}
	}
}

// The committed JSON, read back generically: what Grafana and the query test read.
type jsonDashboard struct {
	UID        string `json:"uid"`
	Title      string `json:"title"`
	Editable   bool   `json:"editable"`
	Templating struct {
		List []struct {
			Name       string          `json:"name"`
			Type       string          `json:"type"`
			Query      json.RawMessage `json:"query"`
			Datasource *Datasource     `json:"datasource"`
			Multi      bool            `json:"multi"`
			AllValue   string          `json:"allValue"`
			Refresh    int             `json:"refresh"`
		} `json:"list"`
	} `json:"templating"`
	Panels []struct {
		ID          int         `json:"id"`
		Type        string      `json:"type"`
		Title       string      `json:"title"`
		Description string      `json:"description"`
		Datasource  *Datasource `json:"datasource"`
		GridPos     GridPos     `json:"gridPos"`
		FieldConfig *struct {
			Defaults struct {
				Unit string `json:"unit"`
			} `json:"defaults"`
		} `json:"fieldConfig"`
		Targets []struct {
			Expr       string      `json:"expr"`
			RefID      string      `json:"refId"`
			Datasource *Datasource `json:"datasource"`
		} `json:"targets"`
	} `json:"panels"`
}

func readCommitted(t *testing.T, name string) jsonDashboard {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", name))
	if err != nil {
		t.Fatal(err)
	}
	var d jsonDashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return d
}

var (
	selectorRE = regexp.MustCompile(`\{[^}]*\}`)
	rangeRE    = regexp.MustCompile(`\[[^\]]*\]`)
)

// TestDashboardConventions: what an on-call engineer relies on in every panel, beyond what
// grafana's dashboard-linter checks (dashboards/lint/lint.sh).
func TestDashboardConventions(t *testing.T) {
	uids := map[string]string{"proxyhealth-overview.json": overviewUID, "proxyhealth-node.json": nodeUID}
	// The node matcher each dashboard must put on every selector.
	nodeMatcher := map[string]string{
		"proxyhealth-overview.json": `node=~"$node"`,
		"proxyhealth-node.json":     `node="$node"`,
	}
	for name := range Files() {
		t.Run(name, func(t *testing.T) {
			d := readCommitted(t, name)
			if d.UID != uids[name] {
				t.Errorf("uid %q, want %q (stable: links and provisioning use it)", d.UID, uids[name])
			}
			if d.Editable {
				t.Error("editable: provisioned dashboards are changed in the generator")
			}
			vars := map[string]int{}
			for i, v := range d.Templating.List {
				vars[v.Name] = i
			}
			for _, want := range []struct{ name, typ string }{{"datasource", "datasource"}, {"cluster", "query"}, {"job", "query"}, {"node", "query"}} {
				i, ok := vars[want.name]
				if !ok {
					t.Errorf("variable %q missing", want.name)
					continue
				}
				v := d.Templating.List[i]
				if v.Type != want.typ {
					t.Errorf("variable %q has type %q, want %q", want.name, v.Type, want.typ)
				}
				if v.Type == "query" {
					if v.Datasource == nil || v.Datasource.UID != "${datasource}" {
						t.Errorf("variable %q does not query ${datasource}: %+v", want.name, v.Datasource)
					}
					if v.Refresh != 2 {
						t.Errorf("variable %q refresh %d, want 2 (on time range change)", want.name, v.Refresh)
					}
				}
			}
			if i, ok := vars["node"]; ok && !strings.Contains(string(d.Templating.List[i].Query), `, node)`) {
				t.Errorf("node variable does not list the node label: %s", d.Templating.List[i].Query)
			}
			// cluster, as kubernetes-mixin's: one value (an empty one matches series without the
			// label), before the variables whose values it narrows.
			if i, ok := vars["cluster"]; ok {
				if v := d.Templating.List[i]; v.Multi || v.AllValue != "" {
					t.Errorf("cluster variable is multi-valued or has All; cluster=\"$cluster\" takes one value")
				}
				for _, name := range []string{"job", "node"} {
					j, ok := vars[name]
					if !ok {
						continue
					}
					if j < i {
						t.Errorf("variable %q comes before cluster, which it depends on", name)
					}
					var q struct{ Query string }
					if err := json.Unmarshal(d.Templating.List[j].Query, &q); err != nil || !strings.Contains(q.Query, `cluster="$cluster"`) {
						t.Errorf("variable %q does not select the cluster: %s (%v)", name, d.Templating.List[j].Query, err)
					}
				}
			}

			ids := map[int]bool{}
			panels := 0
			for _, p := range d.Panels {
				if ids[p.ID] {
					t.Errorf("panel id %d used twice", p.ID)
				}
				ids[p.ID] = true
				if p.GridPos.X+p.GridPos.W > 24 || p.GridPos.W <= 0 || p.GridPos.H <= 0 {
					t.Errorf("panel %q: gridPos %+v outside the 24 columns", p.Title, p.GridPos)
				}
				if p.Type == "row" {
					continue
				}
				panels++
				if p.Title == "" {
					t.Errorf("panel %d has no title", p.ID)
				}
				if len(p.Description) < 40 {
					t.Errorf("panel %q: description %q does not say what it shows and what to do", p.Title, p.Description)
				}
				if p.FieldConfig == nil || p.FieldConfig.Defaults.Unit == "" {
					t.Errorf("panel %q has no unit", p.Title)
				}
				if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
					t.Errorf("panel %q does not use ${datasource}", p.Title)
				}
				if len(p.Targets) == 0 {
					t.Errorf("panel %q has no query", p.Title)
				}
				for _, tg := range p.Targets {
					checkExpr(t, p.Title, tg.Expr, nodeMatcher[name])
					if tg.Datasource == nil || tg.Datasource.UID != "${datasource}" {
						t.Errorf("panel %q query %s does not use ${datasource}", p.Title, tg.RefID)
					}
				}
			}
			if panels < 10 {
				t.Errorf("only %d panels", panels)
			}
		})
	}
}

// checkExpr: every selector carries the cluster, job and node matchers, every range is
// $__rate_interval, and brackets balance (the full parse is the linter's and Prometheus's).
func checkExpr(t *testing.T, panel, expr, nodeMatcher string) {
	t.Helper()
	if strings.TrimSpace(expr) == "" {
		t.Errorf("panel %q: empty query", panel)
		return
	}
	sels := selectorRE.FindAllString(expr, -1)
	if len(sels) == 0 {
		t.Errorf("panel %q: %s selects no series", panel, expr)
	}
	for _, s := range sels {
		if !strings.Contains(s, `cluster="$cluster"`) || !strings.Contains(s, `job=~"$job"`) || !strings.Contains(s, nodeMatcher) {
			t.Errorf("panel %q: selector %s lacks cluster=\"$cluster\", job=~\"$job\" or %s", panel, s, nodeMatcher)
		}
	}
	for _, r := range rangeRE.FindAllString(expr, -1) {
		if r != "[$__rate_interval]" {
			t.Errorf("panel %q: range %s, want [$__rate_interval]", panel, r)
		}
	}
	for _, pair := range []string{"()", "{}", "[]"} {
		if strings.Count(expr, pair[:1]) != strings.Count(expr, pair[1:]) {
			t.Errorf("panel %q: unbalanced %s in %s", panel, pair, expr)
		}
	}
	if strings.Contains(expr, "_total") && !strings.Contains(expr, "rate(") && !strings.Contains(expr, "increase(") {
		t.Errorf("panel %q: counter not rated in %s", panel, expr)
	}
}
