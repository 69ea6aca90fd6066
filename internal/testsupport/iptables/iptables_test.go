package iptables

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
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

func TestParseStructure(t *testing.T) {
	rs := parseFile(t, "kube-proxy.txt")
	var names []string
	for _, tb := range rs.Tables {
		names = append(names, tb.Name)
	}
	if want := []string{"mangle", "filter", "nat"}; !reflect.DeepEqual(names, want) {
		t.Fatalf("tables = %v, want %v", names, want)
	}
	filter := rs.Table("filter")
	fwd := filter.Chain("FORWARD")
	if fwd == nil || fwd.Policy != "ACCEPT" || !fwd.Builtin() {
		t.Fatalf("FORWARD = %+v", fwd)
	}
	kf := filter.Chain("KUBE-FORWARD")
	if kf == nil || kf.Builtin() || len(kf.Rules) != 3 {
		t.Fatalf("KUBE-FORWARD = %+v", kf)
	}
	r := kf.Rules[0]
	if r.Line != 40 {
		t.Errorf("line = %d, want 40", r.Line)
	}
	if r.Raw != "-A KUBE-FORWARD -m conntrack --ctstate INVALID -m nfacct --nfacct-name ct_state_invalid_dropped_pkts -j DROP" {
		t.Errorf("raw = %q", r.Raw)
	}
	if got, want := r.Args(), strings.Fields("-m conntrack --ctstate INVALID -m nfacct --nfacct-name ct_state_invalid_dropped_pkts -j DROP"); !reflect.DeepEqual(got, want) {
		t.Errorf("args = %q, want %q", got, want)
	}
	if r.Target() != "DROP" || r.Goto() {
		t.Errorf("target = %q goto=%v", r.Target(), r.Goto())
	}
	var mods []string
	for m := range r.Modules() {
		mods = append(mods, m)
	}
	if want := []string{"conntrack", "nfacct"}; !reflect.DeepEqual(mods, want) {
		t.Errorf("modules = %v", mods)
	}
	if rs.Table("raw") != nil || filter.Chain("NOPE") != nil {
		t.Error("lookup of missing table/chain should be nil")
	}
	var nilRS *Ruleset
	if nilRS.Table("filter").Chain("FORWARD") != nil {
		t.Error("nil ruleset lookups should be nil")
	}
}

type opt struct {
	Module, Name string
	Negated      bool
	Target       bool
	Values       []string
}

func options(r *Rule) []opt {
	var out []opt
	for o := range r.Options() {
		out = append(out, opt{o.Module, o.Name, o.Negated, o.Target, o.Values()})
	}
	return out
}

func TestRuleOptions(t *testing.T) {
	tests := []struct {
		line string
		want []opt
	}{
		{
			`-A KUBE-SERVICES -d 10.96.0.10/32 -p udp -m comment --comment "kube-system/kube-dns:dns cluster IP" -m udp --dport 53 -j KUBE-SVC-TCOU7JCQXEZGVUNU`,
			[]opt{
				{"", "-d", false, false, []string{"10.96.0.10/32"}},
				{"", "-p", false, false, []string{"udp"}},
				{"comment", "--comment", false, false, []string{"kube-system/kube-dns:dns cluster IP"}},
				{"udp", "--dport", false, false, []string{"53"}},
			},
		},
		{
			`-A KUBE-SVC-X ! -s 10.244.0.0/16 -d 10.96.0.10/32 -p tcp -m tcp --dport 53 -j KUBE-MARK-MASQ`,
			[]opt{
				{"", "-s", true, false, []string{"10.244.0.0/16"}},
				{"", "-d", false, false, []string{"10.96.0.10/32"}},
				{"", "-p", false, false, []string{"tcp"}},
				{"tcp", "--dport", false, false, []string{"53"}},
			},
		},
		{
			`-A KUBE-SEP-X -p tcp -m comment --comment "a \"quoted\" \\ back" -m tcp -j DNAT --to-destination 10.244.0.2:53`,
			[]opt{
				{"", "-p", false, false, []string{"tcp"}},
				{"comment", "--comment", false, false, []string{`a "quoted" \ back`}},
				{"DNAT", "--to-destination", false, true, []string{"10.244.0.2:53"}},
			},
		},
		{
			`-A KUBE-FIREWALL -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -m addrtype --dst-type ! LOCAL -m set --match-set KUBE-LB dst,dst -j MASQUERADE --random-fully`,
			[]opt{
				{"conntrack", "--ctstate", true, false, []string{"RELATED,ESTABLISHED,DNAT"}},
				{"addrtype", "--dst-type", true, false, []string{"LOCAL"}},
				{"set", "--match-set", false, false, []string{"KUBE-LB", "dst,dst"}},
				{"MASQUERADE", "--random-fully", false, true, []string{}},
			},
		},
		{
			`-A X -m comment --comment "!" -m statistic --mode random --probability 0.33333333349 -g Y`,
			[]opt{
				{"comment", "--comment", false, false, []string{"!"}},
				{"statistic", "--mode", false, false, []string{"random"}},
				{"statistic", "--probability", false, false, []string{"0.33333333349"}},
			},
		},
	}
	for _, tt := range tests {
		rs, err := ParseString("*nat\n:X - [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-X - [0:0]\n:KUBE-SEP-X - [0:0]\n:KUBE-FIREWALL - [0:0]\n" + tt.line + "\nCOMMIT\n")
		if err != nil {
			t.Fatalf("%s: %v", tt.line, err)
		}
		var r *Rule
		for _, c := range rs.Table("nat").Chains {
			if len(c.Rules) > 0 {
				r = &c.Rules[0]
			}
		}
		if got := options(r); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%s:\n got %+v\nwant %+v", tt.line, got, tt.want)
		}
	}
}

func TestRuleHelpers(t *testing.T) {
	rs := parseFile(t, "kube-proxy.txt")
	nat := rs.Table("nat")
	sep := nat.Chain("KUBE-SEP-2BKJ7FW3LNBKXNQG").Rules[1]
	if o, ok := sep.Option("DNAT", "--to-destination"); !ok || o.Value() != "10.244.1.17:8080" || !o.Target {
		t.Errorf("--to-destination = %+v %v", o, ok)
	}
	if sep.Comment() != "shop/web:http" {
		t.Errorf("comment = %q", sep.Comment())
	}
	svc := nat.Chain("KUBE-SVC-4N57TFCL4MD7ZTDA").Rules[1]
	if o, ok := svc.Option("*", "--probability"); !ok || o.Value() != "0.33333333349" {
		t.Errorf("--probability = %+v %v", o, ok)
	}
	if _, ok := svc.Option("", "--probability"); ok {
		t.Error("--probability is not a core option")
	}
	if svc.Unconditional() {
		t.Error("statistic rule is conditional")
	}
	last := nat.Chain("KUBE-SVC-4N57TFCL4MD7ZTDA").Rules[3]
	if !last.Unconditional() || last.Target() != "KUBE-SEP-OBYO4QHXWMM4ZJ5N" {
		t.Errorf("last endpoint rule: unconditional=%v target=%q", last.Unconditional(), last.Target())
	}
	if nat.Chain("KUBE-MARK-MASQ").Rules[0].Comment() != "" {
		t.Error("no comment expected")
	}
}

func TestParseCounters(t *testing.T) {
	rs := parseFile(t, "filter-counters.txt")
	r := rs.Table("filter").Chain("KUBE-FORWARD").Rules[0]
	if r.Raw != "-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP" {
		t.Errorf("raw = %q", r.Raw)
	}
	if ok, _ := rs.InvalidDropReachable("filter", "FORWARD"); !ok {
		t.Error("drop not found")
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		in   string
		line int
		msg  string
	}{
		{"-A FORWARD -j DROP\n", 1, "rule outside a table"},
		{"*filter\n:FORWARD ACCEPT [0:0]\n-A KUBE-FORWARD -j DROP\nCOMMIT\n", 3, `undeclared chain "KUBE-FORWARD"`},
		{"*filter\n:FORWARD ACCEPT [0:0]\n", 2, "no COMMIT"},
		{":FORWARD ACCEPT [0:0]\n", 1, "outside a table"},
		{"*filter\n:FORWARD ACCEPT [0:0]\n-A FORWARD -m comment --comment \"open\n", 3, "unterminated quote"},
		{"*filter\n:FORWARD ACCEPT [0:0]\n-A FORWARD -m comment --comment \"a\"b -j DROP\nCOMMIT\n", 3, "after closing quote"},
		{"*filter\nCOMMIT\n*filter\nCOMMIT\n", 3, "declared twice"},
		{"*filter\n:A - [0:0]\n:A - [0:0]\nCOMMIT\n", 3, "declared twice"},
		{"*filter\n*nat\n", 2, "before table"},
		{"COMMIT\n", 1, "COMMIT outside"},
		{"*filter\nhello\n", 2, "unexpected line"},
		{"*filter\n-A\nCOMMIT\n", 2, "expected -A"},
		{"*filter\n-I FORWARD -j DROP\nCOMMIT\n", 2, "expected -A"},
		{"*filter\n:FORWARD\nCOMMIT\n", 2, "bad chain declaration"},
		{"*\n", 1, "bad table header"},
		{"*filter\n[1:2 -A FORWARD\n", 2, "unterminated counter"},
	}
	for _, tt := range tests {
		_, err := ParseString(tt.in)
		var pe *ParseError
		if !errors.As(err, &pe) {
			t.Errorf("%q: err = %v, want *ParseError", tt.in, err)
			continue
		}
		if pe.Line != tt.line || !strings.Contains(pe.Error(), tt.msg) {
			t.Errorf("%q: err = %v (line %d), want line %d containing %q", tt.in, err, pe.Line, tt.line, tt.msg)
		}
	}
}

func TestParseEmptyAndCRLF(t *testing.T) {
	rs, err := ParseString("")
	if err != nil || len(rs.Tables) != 0 {
		t.Fatalf("empty: %v %v", rs, err)
	}
	rs, err = ParseString("*filter\r\n:FORWARD ACCEPT [0:0]\r\n-A FORWARD -m conntrack --ctstate INVALID -j DROP\r\nCOMMIT\r\n")
	if err != nil {
		t.Fatal(err)
	}
	if ok, _ := rs.InvalidDropReachable("filter", "FORWARD"); !ok {
		t.Error("CRLF input: drop not found")
	}
}

func TestInvalidDropReachable(t *testing.T) {
	tests := []struct {
		file, chain string
		want        bool
		path        []string
	}{
		{"kube-proxy.txt", "FORWARD", true, []string{
			`-A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD`,
			`-A KUBE-FORWARD -m conntrack --ctstate INVALID -m nfacct --nfacct-name ct_state_invalid_dropped_pkts -j DROP`,
		}},
		{"kube-proxy.txt", "KUBE-FORWARD", true, []string{
			`-A KUBE-FORWARD -m conntrack --ctstate INVALID -m nfacct --nfacct-name ct_state_invalid_dropped_pkts -j DROP`,
		}},
		{"kube-proxy.txt", "INPUT", false, nil},
		{"kube-proxy.txt", "NOPE", false, nil},
		{"filter-no-drop.txt", "FORWARD", false, nil},
		{"filter-drop-behind-jump.txt", "FORWARD", true, []string{
			`-A FORWARD -m comment --comment "node guard: pod traffic" -j NODE-GUARD`,
			`-A NODE-GUARD -i cni0 -g NODE-GUARD-CT`,
			`-A NODE-GUARD-CT -m state --state INVALID -j DROP`,
		}},
		{"filter-invalid-jump.txt", "FORWARD", true, []string{
			`-A FORWARD -m conntrack --ctstate INVALID,UNTRACKED -j CT-DROP`,
			`-A CT-DROP -m comment --comment "counted \"invalid\" drops" -j DROP`,
		}},
		{"filter-cycle.txt", "FORWARD", false, nil},
		{"filter-cycle-drop.txt", "FORWARD", true, []string{
			`-A FORWARD -j LOOP-A`,
			`-A LOOP-A -j LOOP-B`,
			`-A LOOP-B -s 10.0.0.0/8 -m conntrack --ctstate INVALID -j DROP`,
		}},
		{"filter-not-reachable.txt", "FORWARD", false, nil},
		{"filter-not-reachable.txt", "INPUT", true, []string{`-A INPUT -m conntrack --ctstate INVALID -j DROP`}},
		{"filter-not-reachable.txt", "ORPHAN", true, []string{`-A ORPHAN -m conntrack --ctstate INVALID -j DROP`}},
	}
	for _, tt := range tests {
		rs := parseFile(t, tt.file)
		got, path := rs.InvalidDropReachable("filter", tt.chain)
		if got != tt.want || !reflect.DeepEqual(path, tt.path) {
			t.Errorf("%s %s: got %v %q, want %v %q", tt.file, tt.chain, got, path, tt.want, tt.path)
		}
	}
	if ok, _ := parseFile(t, "kube-proxy.txt").InvalidDropReachable("raw", "FORWARD"); ok {
		t.Error("missing table must be false")
	}
}

func TestKubeServices(t *testing.T) {
	rs := parseFile(t, "kube-proxy.txt")
	got := KubeServices(rs)
	ip := netip.MustParseAddr
	want := []ServicePort{
		{ip("10.96.0.1"), 443, "tcp", "default", "kubernetes", "https", "KUBE-SVC-NPX46M4PTMTKRN6Y", 115},
		{ip("10.96.0.10"), 53, "udp", "kube-system", "kube-dns", "dns", "KUBE-SVC-TCOU7JCQXEZGVUNU", 116},
		{ip("10.96.0.10"), 53, "tcp", "kube-system", "kube-dns", "dns-tcp", "KUBE-SVC-ERIFXISQEP7F7OF4", 117},
		{ip("10.96.0.10"), 9153, "tcp", "kube-system", "kube-dns", "metrics", "KUBE-SVC-JD5MR3NA4I4DYORP", 118},
		{ip("10.96.112.40"), 80, "tcp", "shop", "web", "http", "KUBE-SVC-4N57TFCL4MD7ZTDA", 119},
		{ip("10.96.7.21"), 8000, "tcp", "default", "plain", "", "KUBE-SVC-XGLOHA7QRQ3V22RZ", 121},
		{ip("10.96.200.3"), 9100, "tcp", "monitoring", "node-local", "metrics", "KUBE-SVL-LC5QY66VUV2HJ6WZ", 122},
		{ip("10.96.88.8"), 5432, "tcp", "", "", "", "KUBE-SVC-Z6GDYMWE5TV2NNJN", 123},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got\n%+v\nwant\n%+v", got, want)
	}
	if KubeServices(parseFile(t, "filter-no-drop.txt")) != nil {
		t.Error("no nat table: want nil")
	}
}

func TestKubeServicesIPv6AndOddRules(t *testing.T) {
	in := `*nat
:KUBE-SERVICES - [0:0]
:KUBE-SVC-A - [0:0]
-A KUBE-SERVICES -d fd00:10:96::a/128 -p sctp -m comment --comment "ns/svc:p cluster IP" -m sctp --dport 9999 -j KUBE-SVC-A
-A KUBE-SERVICES -d notanip/32 -p tcp -m tcp --dport 1 -j KUBE-SVC-A
-A KUBE-SERVICES -d 10.0.0.1/32 -p tcp -m tcp --dport 99999 -j KUBE-SVC-A
-A KUBE-SERVICES -d 10.0.0.1/32 -p tcp -m comment --comment "weird" -m tcp --dport 80 -j KUBE-SVC-A
COMMIT
`
	rs, err := ParseString(in)
	if err != nil {
		t.Fatal(err)
	}
	got := KubeServices(rs)
	want := []ServicePort{
		{netip.MustParseAddr("fd00:10:96::a"), 9999, "sctp", "ns", "svc", "p", "KUBE-SVC-A", 4},
		{netip.MustParseAddr("10.0.0.1"), 80, "tcp", "", "", "", "KUBE-SVC-A", 7},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v\nwant %+v", got, want)
	}
}

// bigNAT writes a nat table the way kube-proxy does for n services with nine endpoints each:
// 43 lines and about 4.8 KB per service, so 10,000 services are 430,000 lines and about 48 MB.
func bigNAT(n int) string {
	var b strings.Builder
	b.WriteString("# Generated by iptables-nft-save v1.8.9 (nf_tables)\n*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n:KUBE-MARK-MASQ - [0:0]\n:KUBE-NODEPORTS - [0:0]\n:KUBE-SERVICES - [0:0]\n")
	const eps = 9
	for i := range n {
		fmt.Fprintf(&b, ":KUBE-SVC-%016X - [0:0]\n:KUBE-EXT-%016X - [0:0]\n", i, i)
		for e := range eps {
			fmt.Fprintf(&b, ":KUBE-SEP-%012X%04X - [0:0]\n", i, e)
		}
	}
	b.WriteString("-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000\n")
	for i := range n {
		svc := fmt.Sprintf("namespace-%d/service-number-%d:http-port", i%97, i)
		vip := fmt.Sprintf("10.96.%d.%d", i/250, i%250+1)
		fmt.Fprintf(&b, "-A KUBE-SERVICES -d %s/32 -p tcp -m comment --comment \"%s cluster IP\" -m tcp --dport 80 -j KUBE-SVC-%016X\n", vip, svc, i)
		fmt.Fprintf(&b, "-A KUBE-NODEPORTS -p tcp -m comment --comment \"%s\" -m tcp --dport %d -j KUBE-EXT-%016X\n", svc, 30000+i%2767, i)
		fmt.Fprintf(&b, "-A KUBE-EXT-%016X -m comment --comment \"masquerade traffic for %s external destinations\" -j KUBE-MARK-MASQ\n-A KUBE-EXT-%016X -j KUBE-SVC-%016X\n", i, svc, i, i)
		fmt.Fprintf(&b, "-A KUBE-SVC-%016X ! -s 10.244.0.0/16 -d %s/32 -p tcp -m comment --comment \"%s cluster IP\" -m tcp --dport 80 -j KUBE-MARK-MASQ\n", i, vip, svc)
		for e := range eps {
			ep := fmt.Sprintf("10.%d.%d.%d:8080", 244+e, i/250, i%250+1)
			prob := ""
			if e < eps-1 {
				prob = fmt.Sprintf(" -m statistic --mode random --probability %.11f", 1/float64(eps-e))
			}
			fmt.Fprintf(&b, "-A KUBE-SVC-%016X -m comment --comment \"%s -> %s\"%s -j KUBE-SEP-%012X%04X\n", i, svc, ep, prob, i, e)
		}
		for e := range eps {
			ep := fmt.Sprintf("10.%d.%d.%d", 244+e, i/250, i%250+1)
			fmt.Fprintf(&b, "-A KUBE-SEP-%012X%04X -s %s/32 -m comment --comment \"%s\" -j KUBE-MARK-MASQ\n", i, e, ep, svc)
			fmt.Fprintf(&b, "-A KUBE-SEP-%012X%04X -p tcp -m comment --comment \"%s\" -m tcp -j DNAT --to-destination %s:8080\n", i, e, svc, ep)
		}
	}
	b.WriteString("-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS\nCOMMIT\n")
	return b.String()
}

func TestParseLarge(t *testing.T) {
	if testing.Short() {
		t.Skip("large input")
	}
	in := bigNAT(10000)
	start := time.Now()
	rs, err := ParseString(in)
	elapsed := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	svcs := KubeServices(rs)
	if len(svcs) != 10000 {
		t.Fatalf("services = %d", len(svcs))
	}
	// How fast is BenchmarkParse10kServices's to say, not a timed assertion's.
	t.Logf("%d bytes, %d lines parsed in %v", len(in), strings.Count(in, "\n"), elapsed)
}

func BenchmarkParse10kServices(b *testing.B) {
	in := bigNAT(10000)
	b.SetBytes(int64(len(in)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseString(in); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkKubeServices10k(b *testing.B) {
	rs, err := ParseString(bigNAT(10000))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		KubeServices(rs)
	}
}

func TestInvalidDropReachableTerminal(t *testing.T) {
	tests := []struct {
		name, rules string
		want        bool
	}{
		{"accept in jumped chain", "-A FORWARD -j A\n-A FORWARD -m conntrack --ctstate INVALID -j DROP\n-A A -j ACCEPT\n", false},
		{"conditional jump to accepting chain", "-A FORWARD -i eth0 -j A\n-A FORWARD -m conntrack --ctstate INVALID -j DROP\n-A A -j ACCEPT\n", true},
		{"return in jumped chain", "-A FORWARD -j A\n-A FORWARD -m conntrack --ctstate INVALID -j DROP\n-A A -j RETURN\n-A A -j ACCEPT\n", true},
		{"goto ends the chain", "-A FORWARD -g A\n-A FORWARD -m conntrack --ctstate INVALID -j DROP\n-A A -p tcp -j ACCEPT\n", false},
		{"commented accept is unconditional", "-A FORWARD -m comment --comment \"allow all\" -j ACCEPT\n-A FORWARD -m conntrack --ctstate INVALID -j DROP\n", false},
	}
	for _, tt := range tests {
		rs, err := ParseString("*filter\n:FORWARD ACCEPT [0:0]\n:A - [0:0]\n" + tt.rules + "COMMIT\n")
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if got, path := rs.InvalidDropReachable("filter", "FORWARD"); got != tt.want {
			t.Errorf("%s: got %v %q, want %v", tt.name, got, path, tt.want)
		}
	}
}
