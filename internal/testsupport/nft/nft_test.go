package nft

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func parseFile(t testing.TB, name string) *Ruleset {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rs, err := Parse(f)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return rs
}

func TestParse(t *testing.T) {
	rs := parseFile(t, "jump.json")
	if rs.Version != "1.0.6" || len(rs.Tables) != 1 {
		t.Fatalf("version %q, %d tables", rs.Version, len(rs.Tables))
	}
	tb := rs.Table("inet", "filter")
	fwd := tb.Chain("forward")
	if fwd == nil || !fwd.Base() || fwd.Hook != "forward" || fwd.Type != "filter" || fwd.Policy != "accept" || fwd.Prio != 0 {
		t.Fatalf("forward = %+v", fwd)
	}
	if c := tb.Chain("ct_checks"); c == nil || c.Base() || len(c.Rules) != 1 {
		t.Fatalf("ct_checks = %+v", c)
	}
	if got := fwd.Rules[1].String(); got != "inet filter forward handle 5" {
		t.Errorf("rule = %q", got)
	}
	if rs.Table("ip", "filter") != nil || tb.Chain("nope") != nil {
		t.Error("missing lookups should be nil")
	}
	var nilRS *Ruleset
	if nilRS.Table("inet", "filter").Chain("forward") != nil {
		t.Error("nil ruleset lookups should be nil")
	}
	if parseFile(t, "mixed.json").Table("ip6", "bitwise").Chain("forward").Prio != 5 {
		t.Error("prio 5 expected")
	}
}

func TestParseErrors(t *testing.T) {
	for _, in := range []string{
		``,
		`{}`,
		`{"nftables": [{"rule": {"family": "inet", "table": "x", "chain": "y", "handle": 1, "expr": []}}]}`,
		`{"nftables": [{"chain": {"family": "inet", "table": "x", "name": "y"}}]}`,
		`{"nftables": [{"table": {"family": "inet", "name": "x"}}, {"table": {"family": "inet", "name": "x"}}]}`,
		`{"nftables": [{"table": {"family": "inet", "name": "x"}}, {"chain": {"family": "inet", "table": "x", "name": "y"}}, {"chain": {"family": "inet", "table": "x", "name": "y"}}]}`,
		`{"nftables": [{"table": {"family": 1}}]}`,
		`{"nftables": [`,
	} {
		if _, err := Parse(strings.NewReader(in)); err == nil {
			t.Errorf("%q: want an error", in)
		}
	}
}

func TestIptablesNFT(t *testing.T) {
	rs := parseFile(t, "iptables-nft.json")
	if !rs.Table("ip", "filter").IptablesNFT() {
		t.Error("ip filter written by iptables-nft must be recognised")
	}
	if parseFile(t, "direct.json").Table("inet", "filter").IptablesNFT() {
		t.Error("inet filter is native")
	}
	// An iptables-nft table whose rules all have native translations (no xt expression).
	rs, err := Parse(strings.NewReader(`{"nftables": [{"table": {"family": "ip", "name": "filter", "handle": 1}}, {"chain": {"family": "ip", "table": "filter", "name": "FORWARD", "handle": 1, "type": "filter", "hook": "forward", "prio": 0, "policy": "accept"}}, {"chain": {"family": "ip", "table": "filter", "name": "KUBE-FORWARD", "handle": 2}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if !rs.Table("ip", "filter").IptablesNFT() {
		t.Error("ip filter with FORWARD base chain must be recognised")
	}
}

func TestInvalidDropReachable(t *testing.T) {
	tests := []struct {
		file string
		want bool
		path []string
	}{
		{"empty.json", false, nil},
		{"direct.json", true, []string{"inet filter forward (hook forward)", "inet filter forward handle 2"}},
		{"jump.json", true, []string{"inet filter forward (hook forward)", "inet filter forward handle 5", "inet filter node_guard handle 6", "inet filter ct_checks handle 8"}},
		{"vmap.json", true, []string{"ip vmaps forward_ct (hook forward)", "ip vmaps forward_ct handle 3"}},
		// Only an iptables-nft table: covered by iptables-nft-save, not here.
		{"iptables-nft.json", false, nil},
		{"mixed.json", true, []string{"ip6 bitwise forward (hook forward)", "ip6 bitwise forward handle 4", "ip6 bitwise loop_a handle 5", "ip6 bitwise loop_b handle 6"}},
	}
	for _, tt := range tests {
		got, path := InvalidDropReachable(parseFile(t, tt.file))
		if got != tt.want || !reflect.DeepEqual(path, tt.path) {
			t.Errorf("%s: got %v %q, want %v %q", tt.file, got, path, tt.want, tt.path)
		}
	}
	// Without its ip6 table, mixed.json only has rules that do not count: an input-hook drop,
	// != invalid, reject, a chain nothing jumps to, a drop behind an unconditional accept.
	rs := parseFile(t, "mixed.json")
	rs.Tables = rs.Tables[:1]
	if ok, path := InvalidDropReachable(rs); ok {
		t.Errorf("mixed.json without ip6 bitwise: got %q", path)
	}
	if ok, _ := InvalidDropReachable(nil); ok {
		t.Error("nil ruleset")
	}
}

// TestInvalidDropReachableCases builds rulesets from the JSON forms nft 1.0.6 prints.
func TestInvalidDropReachableCases(t *testing.T) {
	const ctInvalid = `{"match": {"op": "in", "left": {"ct": {"key": "state"}}, "right": "invalid"}}`
	tests := []struct {
		name   string
		family string
		hook   string
		chains map[string][]string // chain -> rules (expr arrays)
		want   bool
	}{
		{"direct", "inet", "forward", map[string][]string{"base": {`[` + ctInvalid + `, {"drop": null}]`}}, true},
		{"input hook", "inet", "input", map[string][]string{"base": {`[` + ctInvalid + `, {"drop": null}]`}}, false},
		{"ip6 family", "ip6", "forward", map[string][]string{"base": {`[` + ctInvalid + `, {"drop": null}]`}}, true},
		{"set", "ip", "forward", map[string][]string{"base": {`[{"match": {"op": "==", "left": {"ct": {"key": "state"}}, "right": {"set": ["invalid", "untracked"]}}}, {"drop": null}]`}}, true},
		{"list", "ip", "forward", map[string][]string{"base": {`[{"match": {"op": "in", "left": {"ct": {"key": "state"}}, "right": ["untracked", "invalid"]}}, {"counter": {"packets": 0, "bytes": 0}}, {"drop": null}]`}}, true},
		{"negated", "ip", "forward", map[string][]string{"base": {`[{"match": {"op": "!=", "left": {"ct": {"key": "state"}}, "right": "invalid"}}, {"drop": null}]`}}, false},
		{"other states", "ip", "forward", map[string][]string{"base": {`[{"match": {"op": "in", "left": {"ct": {"key": "state"}}, "right": ["established", "related"]}}, {"drop": null}]`}}, false},
		{"reject is not drop", "ip", "forward", map[string][]string{"base": {`[` + ctInvalid + `, {"reject": null}]`}}, false},
		{"count only", "ip", "forward", map[string][]string{"base": {`[` + ctInvalid + `, {"counter": {"packets": 0, "bytes": 0}}]`}}, false},
		{"restricted still counts", "ip", "forward", map[string][]string{"base": {`[{"match": {"op": "==", "left": {"meta": {"key": "iifname"}}, "right": "cni0"}}, ` + ctInvalid + `, {"log": {"prefix": "x"}}, {"drop": null}]`}}, true},
		{"after unconditional accept", "ip", "forward", map[string][]string{"base": {`[{"accept": null}]`, `[` + ctInvalid + `, {"drop": null}]`}}, false},
		{"after conditional accept", "ip", "forward", map[string][]string{"base": {`[{"match": {"op": "==", "left": {"meta": {"key": "iifname"}}, "right": "lo"}}, {"accept": null}]`, `[` + ctInvalid + `, {"drop": null}]`}}, true},
		{"accept inside jumped chain ends traversal", "ip", "forward", map[string][]string{
			"base": {`[{"jump": {"target": "a"}}]`, `[` + ctInvalid + `, {"drop": null}]`},
			"a":    {`[{"accept": null}]`},
		}, false},
		{"return inside jumped chain", "ip", "forward", map[string][]string{
			"base": {`[{"jump": {"target": "a"}}]`, `[` + ctInvalid + `, {"drop": null}]`},
			"a":    {`[{"return": null}]`, `[{"accept": null}]`},
		}, true},
		{"invalid jump to plain drop", "ip", "forward", map[string][]string{
			"base": {`[` + ctInvalid + `, {"jump": {"target": "a"}}]`},
			"a":    {`[{"counter": null}, {"drop": null}]`},
		}, true},
		{"non-invalid jump to plain drop", "ip", "forward", map[string][]string{
			"base": {`[{"match": {"op": "!=", "left": {"ct": {"key": "state"}}, "right": "invalid"}}, {"jump": {"target": "a"}}]`},
			"a":    {`[{"drop": null}]`},
		}, false},
		{"missing jump target", "ip", "forward", map[string][]string{"base": {`[{"jump": {"target": "nope"}}]`}}, false},
		{"cycle", "ip", "forward", map[string][]string{
			"base": {`[{"jump": {"target": "a"}}]`},
			"a":    {`[{"jump": {"target": "b"}}]`},
			"b":    {`[{"jump": {"target": "a"}}]`, `[{"goto": {"target": "base"}}]`},
		}, false},
		{"vmap with jump", "ip", "forward", map[string][]string{
			"base": {`[{"vmap": {"key": {"ct": {"key": "state"}}, "data": {"set": [["established", {"accept": null}], ["invalid", {"jump": {"target": "a"}}]]}}}]`},
			"a":    {`[{"drop": null}]`},
		}, true},
		{"vmap invalid accept", "ip", "forward", map[string][]string{
			"base": {`[{"vmap": {"key": {"ct": {"key": "state"}}, "data": {"set": [["invalid", {"accept": null}], ["new", {"drop": null}]]}}}]`},
		}, false},
		{"vmap on other key", "ip", "forward", map[string][]string{
			"base": {`[{"vmap": {"key": {"meta": {"key": "iifname"}}, "data": {"set": [["cni0", {"goto": {"target": "a"}}]]}}}]`},
			"a":    {`[` + ctInvalid + `, {"drop": null}]`},
		}, true},
		{"named vmap", "ip", "forward", map[string][]string{
			"base": {`[{"vmap": {"key": {"ct": {"key": "state"}}, "data": "@states"}}]`},
		}, false},
		{"bitwise != 0", "ip", "forward", map[string][]string{
			"base": {`[{"match": {"op": "!=", "left": {"&": [{"ct": {"key": "state"}}, "invalid"]}, "right": 0}}, {"drop": null}]`},
		}, true},
		{"bitwise == 0", "ip", "forward", map[string][]string{
			"base": {`[{"match": {"op": "==", "left": {"&": [{"ct": {"key": "state"}}, "invalid"]}, "right": 0}}, {"drop": null}]`},
		}, false},
	}
	for _, tt := range tests {
		var b strings.Builder
		b.WriteString(`{"nftables": [{"table": {"family": "` + tt.family + `", "name": "t", "handle": 1}}`)
		b.WriteString(`, {"chain": {"family": "` + tt.family + `", "table": "t", "name": "base", "handle": 1, "type": "filter", "hook": "` + tt.hook + `", "prio": 0, "policy": "accept"}}`)
		for name := range tt.chains {
			if name != "base" {
				b.WriteString(`, {"chain": {"family": "` + tt.family + `", "table": "t", "name": "` + name + `", "handle": 2}}`)
			}
		}
		h := 10
		for name, rules := range tt.chains {
			for _, r := range rules {
				h++
				b.WriteString(`, {"rule": {"family": "` + tt.family + `", "table": "t", "chain": "` + name + `", "handle": ` + itoa(h) + `, "expr": ` + r + `}}`)
			}
		}
		b.WriteString(`]}`)
		rs, err := Parse(strings.NewReader(b.String()))
		if err != nil {
			t.Fatalf("%s: %v\n%s", tt.name, err, b.String())
		}
		if got, path := InvalidDropReachable(rs); got != tt.want {
			t.Errorf("%s: got %v (path %q), want %v", tt.name, got, path, tt.want)
		}
	}
}

func itoa(i int) string {
	const digits = "0123456789"
	if i < 10 {
		return digits[i : i+1]
	}
	return itoa(i/10) + digits[i%10:i%10+1]
}
