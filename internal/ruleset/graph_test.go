package ruleset

import (
	"slices"
	"testing"
)

func chain(name string, rules ...Rule) *Chain { return &Chain{Name: name, Rules: rules} }

func graph(entries []string, chains ...*Chain) *Graph {
	g := &Graph{Name: "t", Chains: map[string]*Chain{}, Entries: entries}
	for _, c := range chains {
		g.Chains[c.Name] = c
	}
	return g
}

func TestInvalidDropPath(t *testing.T) {
	drop := Verdict{Kind: Drop}
	accept := Verdict{Kind: Accept}
	jump := func(c string) Verdict { return Verdict{Kind: Jump, Target: c} }
	gotoV := func(c string) Verdict { return Verdict{Kind: Goto, Target: c} }
	cases := []struct {
		name string
		g    *Graph
		want []string
	}{
		{"direct drop", graph([]string{"FORWARD"}, chain("FORWARD", Rule{Desc: "d", Ct: CtInvalid, Verdict: drop})), []string{"t FORWARD", "d"}},
		{"drop with other matches still counts", graph([]string{"FORWARD"}, chain("FORWARD", Rule{Desc: "d", Ct: CtInvalid, Conditional: true, Verdict: drop})), []string{"t FORWARD", "d"}},
		{"negated does not count", graph([]string{"FORWARD"}, chain("FORWARD", Rule{Desc: "d", Ct: CtExcludes, Verdict: drop})), nil},
		{"after unconditional accept", graph([]string{"FORWARD"}, chain("FORWARD", Rule{Desc: "a", Verdict: accept}, Rule{Desc: "d", Ct: CtInvalid, Verdict: drop})), nil},
		{"after conditional accept", graph([]string{"FORWARD"}, chain("FORWARD", Rule{Desc: "a", Conditional: true, Verdict: accept}, Rule{Desc: "d", Ct: CtInvalid, Verdict: drop})), []string{"t FORWARD", "d"}},
		{"behind a jump (kube-proxy's KUBE-FORWARD)", graph([]string{"FORWARD"},
			chain("FORWARD", Rule{Desc: "j", Verdict: jump("KUBE-FORWARD")}),
			chain("KUBE-FORWARD", Rule{Desc: "d", Ct: CtInvalid, Conditional: true, Verdict: drop})), []string{"t FORWARD", "j", "d"}},
		{"jump matching invalid into a plain drop", graph([]string{"FORWARD"},
			chain("FORWARD", Rule{Desc: "j", Ct: CtInvalid, Verdict: jump("X")}),
			chain("X", Rule{Desc: "log"}, Rule{Desc: "d", Verdict: drop})), []string{"t FORWARD", "j", "d"}},
		{"plain drop not behind an invalid jump", graph([]string{"FORWARD"},
			chain("FORWARD", Rule{Desc: "j", Conditional: true, Verdict: jump("X")}),
			chain("X", Rule{Desc: "d", Verdict: drop})), nil},
		{"unconditional jump into a chain that accepts all ends the caller", graph([]string{"FORWARD"},
			chain("FORWARD", Rule{Desc: "j", Verdict: jump("X")}, Rule{Desc: "d", Ct: CtInvalid, Verdict: drop}),
			chain("X", Rule{Desc: "a", Verdict: accept})), nil},
		{"unconditional goto ends the chain", graph([]string{"FORWARD"},
			chain("FORWARD", Rule{Desc: "g", Verdict: gotoV("X")}, Rule{Desc: "d", Ct: CtInvalid, Verdict: drop}),
			chain("X", Rule{Desc: "r", Verdict: Verdict{Kind: Return}})), nil},
		{"cycle", graph([]string{"FORWARD"},
			chain("FORWARD", Rule{Desc: "j", Verdict: jump("A")}),
			chain("A", Rule{Desc: "jb", Conditional: true, Verdict: jump("B")}),
			chain("B", Rule{Desc: "ja", Conditional: true, Verdict: jump("A")})), nil},
		{"ct state vmap", graph([]string{"forward"},
			chain("forward", Rule{Desc: "v", VMap: []VMapEntry{{KeyIsCtState: true, Verdict: accept}, {KeyIsCtState: true, KeyInvalid: true, Verdict: drop}}})), []string{"t forward", "v"}},
		{"ct state vmap without invalid", graph([]string{"forward"},
			chain("forward", Rule{Desc: "v", VMap: []VMapEntry{{KeyIsCtState: true, Verdict: drop}}})), nil},
		{"other vmap into a chain with an invalid drop", graph([]string{"forward"},
			chain("forward", Rule{Desc: "v", VMap: []VMapEntry{{Verdict: jump("X")}}}),
			chain("X", Rule{Desc: "d", Ct: CtInvalid, Verdict: drop})), []string{"t forward", "v", "d"}},
		{"second entry chain", graph([]string{"a", "b"},
			chain("a", Rule{Desc: "acc", Verdict: accept}),
			chain("b", Rule{Desc: "d", Ct: CtInvalid, Verdict: drop})), []string{"t b", "d"}},
		{"missing entry", graph([]string{"FORWARD"}), nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.g.InvalidDropPath(); !slices.Equal(got, tc.want) {
				t.Errorf("InvalidDropPath() = %q, want %q", got, tc.want)
			}
		})
	}
	var nilGraph *Graph
	if nilGraph.InvalidDropPath() != nil {
		t.Error("nil graph: want no path")
	}
}
