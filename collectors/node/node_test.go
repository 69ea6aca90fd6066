package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// adapter lets testutil collect a proxyhealth collector; it records Update's error.
type adapter struct {
	c   *Collector
	err error
}

func (a *adapter) Describe(chan<- *prometheus.Desc) {}
func (a *adapter) Collect(ch chan<- prometheus.Metric) {
	a.err = a.c.Update(ch)
}

const sysctlHelp = `# HELP proxyhealth_bridge_nf_call_ip6tables net.bridge.bridge-nf-call-ip6tables, read from <procfs>/sys/net/bridge/bridge-nf-call-ip6tables: 1 when bridged IPv6 traffic passes ip6tables, 0 when it does not, -1 when the file does not exist (br_netfilter not loaded).
# TYPE proxyhealth_bridge_nf_call_ip6tables gauge
# HELP proxyhealth_bridge_nf_call_iptables net.bridge.bridge-nf-call-iptables, read from <procfs>/sys/net/bridge/bridge-nf-call-iptables: 1 when bridged IPv4 traffic passes iptables, 0 when it does not (replies between pods on the same bridge then escape un-NATed), -1 when the file does not exist (br_netfilter not loaded, same effect as 0).
# TYPE proxyhealth_bridge_nf_call_iptables gauge
# HELP proxyhealth_conntrack_events_setting net.netfilter.nf_conntrack_events, read from <procfs>/sys/net/netfilter/nf_conntrack_events: 0 off (the conntrack event listener sees nothing), 1 on, 2 on while a listener exists.
# TYPE proxyhealth_conntrack_events_setting gauge
# HELP proxyhealth_conntrack_tcp_be_liberal net.netfilter.nf_conntrack_tcp_be_liberal, read from <procfs>/sys/net/netfilter/nf_conntrack_tcp_be_liberal: 1 when conntrack does not mark out-of-window TCP packets INVALID.
# TYPE proxyhealth_conntrack_tcp_be_liberal gauge
`

const rulesHelp = `# HELP proxyhealth_invalid_drop_rule_present 1 when a rule dropping conntrack INVALID packets is reachable from the forward path in any active backend: the filter FORWARD chain of iptables-legacy-save or iptables-nft-save, or a native nftables base chain on the forward hook (nft -j list ruleset). Read by the background rules check.
# TYPE proxyhealth_invalid_drop_rule_present gauge
# HELP proxyhealth_node_rules_last_check_timestamp_seconds Unix time when the node collector's background rules check (iptables-legacy-save, iptables-nft-save, nft) last finished.
# TYPE proxyhealth_node_rules_last_check_timestamp_seconds gauge
`

func newTestCollector(t *testing.T, proc string, run CommandRunner, look func(string) (string, error)) *Collector {
	t.Helper()
	c, err := New(Config{ProcPath: proc, RulesCheckInterval: time.Hour, CommandTimeout: time.Second, Run: run, LookPath: look}, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.now = func() time.Time { return time.Unix(1700000000, 500000000) }
	return c
}

func TestSysctls(t *testing.T) {
	tests := []struct {
		proc    string
		want    string
		wantErr string
	}{
		{"proc-full", `
proxyhealth_bridge_nf_call_ip6tables 1
proxyhealth_bridge_nf_call_iptables 1
proxyhealth_conntrack_events_setting 2
proxyhealth_conntrack_tcp_be_liberal 0
`, ""},
		{"proc-no-br-netfilter", `
proxyhealth_bridge_nf_call_ip6tables -1
proxyhealth_bridge_nf_call_iptables -1
proxyhealth_conntrack_events_setting 0
proxyhealth_conntrack_tcp_be_liberal 1
`, ""},
		{"proc-no-conntrack", `
proxyhealth_bridge_nf_call_ip6tables 0
proxyhealth_bridge_nf_call_iptables 0
`, "conntrack sysctls not found under testdata/proc-no-conntrack/sys/net/netfilter (nf_conntrack_tcp_be_liberal, nf_conntrack_events): is nf_conntrack loaded?"},
		{"proc-garbage", `
proxyhealth_bridge_nf_call_ip6tables 1
proxyhealth_conntrack_events_setting 1
proxyhealth_conntrack_tcp_be_liberal 0
`, `testdata/proc-garbage/sys/net/bridge/bridge-nf-call-iptables: not an integer: "yes"`},
	}
	for _, tt := range tests {
		t.Run(tt.proc, func(t *testing.T) {
			a := &adapter{c: newTestCollector(t, filepath.Join("testdata", tt.proc), nil, nil)}
			if err := testutil.CollectAndCompare(a, strings.NewReader(sysctlHelp+tt.want)); err != nil {
				t.Error(err)
			}
			if tt.wantErr == "" && a.err != nil {
				t.Errorf("unexpected error %v", a.err)
			}
			if tt.wantErr != "" && (a.err == nil || a.err.Error() != tt.wantErr) {
				t.Errorf("error = %v, want %q", a.err, tt.wantErr)
			}
		})
	}
}

func TestNewValidates(t *testing.T) {
	if _, err := New(Config{RulesCheckInterval: 0, CommandTimeout: time.Second}, nil); err == nil {
		t.Error("zero interval must be refused")
	}
	if _, err := New(Config{RulesCheckInterval: time.Second}, nil); err == nil {
		t.Error("zero timeout must be refused")
	}
	c, err := New(Config{RulesCheckInterval: time.Second, CommandTimeout: time.Second}, nil)
	if err != nil || c.cfg.ProcPath != "/proc" || c.cfg.Run == nil || c.cfg.LookPath == nil {
		t.Errorf("defaults not applied: %+v %v", c, err)
	}
}

// fakeNode answers lookPath and runs from fixtures: bins maps a binary name to a fixture file,
// or to an error prefixed "!" that the command fails with.
type fakeNode struct {
	t    *testing.T
	bins map[string]string
	ran  []string
}

func (f *fakeNode) lookPath(name string) (string, error) {
	if _, ok := f.bins[name]; ok {
		return "/usr/sbin/" + name, nil
	}
	return "", &exec.Error{Name: name, Err: exec.ErrNotFound}
}

func (f *fakeNode) run(ctx context.Context, name string, args ...string) ([]byte, error) {
	if _, ok := ctx.Deadline(); !ok {
		f.t.Errorf("%s run without a timeout", name)
	}
	cmd := strings.TrimSpace(filepath.Base(name) + " " + strings.Join(args, " "))
	f.ran = append(f.ran, cmd)
	src, ok := f.bins[cmd]
	if !ok {
		src = f.bins[filepath.Base(name)]
	}
	if msg, ok := strings.CutPrefix(src, "!"); ok {
		return nil, errors.New(msg)
	}
	return os.ReadFile(filepath.Join("testdata", src))
}

// Values of a TestRulesCheck case's tables field, besides the literal contents of
// net/ip_tables_names.
const (
	fixtureTables    = ""  // testdata/proc-full as is: its ip_tables_names lists nat and filter
	noTablesFile     = "-" // no ip_tables_names: x_tables not loaded
	unreadableTables = "!" // ip_tables_names cannot be read
	emptyTables      = "0" // an empty ip_tables_names: x_tables loaded, no legacy table
)

// procWithTables returns testdata/proc-full, or a copy of it whose net/ip_tables_names is as
// tables says. An unreadable list is a directory at that path: reading it fails with EISDIR even
// as root, which a mode 000 file would not.
func procWithTables(t *testing.T, tables string) string {
	t.Helper()
	proc := filepath.Join("testdata", "proc-full")
	if tables == fixtureTables {
		return proc
	}
	dir := t.TempDir()
	if err := os.CopyFS(dir, os.DirFS(proc)); err != nil {
		t.Fatal(err)
	}
	names := filepath.Join(dir, "net", "ip_tables_names")
	if err := os.Remove(names); err != nil {
		t.Fatal(err)
	}
	var err error
	switch tables {
	case noTablesFile:
	case unreadableTables:
		err = os.Mkdir(names, 0o755)
	case emptyTables:
		err = os.WriteFile(names, nil, 0o644)
	default:
		err = os.WriteFile(names, []byte(tables), 0o644)
	}
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestRulesCheck(t *testing.T) {
	const permLegacy = "!exit status 1: iptables-save v1.8.9 (legacy): Cannot initialize: Permission denied (you must be root)"
	const permNFT = "!exit status 4: iptables-nft-save v1.8.9 (nf_tables): Could not fetch rule set generation id: Permission denied (you must be root)"
	const permNft = "!exit status 1: Operation not permitted (you must be root); netlink: Error: cache initialization failed: Operation not permitted"
	tests := []struct {
		name    string
		bins    map[string]string
		tables  string // net/ip_tables_names: one of the constants above, or its contents
		ran     []string
		value   string // "" when the metric must be absent
		wantErr string // substring; "" for no error
	}{
		{
			name:  "both iptables backends and nft, drop in iptables-nft",
			bins:  map[string]string{"iptables-legacy-save": "iptables-legacy-save-empty.txt", "iptables-nft-save": "iptables-nft-save-kube-proxy.txt", "iptables-save": "x", "nft": "nft-iptables-nft-only.json"},
			ran:   []string{"iptables-legacy-save -t filter", "iptables-nft-save -t filter", "nft -j list ruleset"},
			value: "1",
		},
		{
			name:  "drop in iptables-legacy only",
			bins:  map[string]string{"iptables-legacy-save": "iptables-legacy-save-drop.txt", "iptables-nft-save": "iptables-save-no-drop.txt", "nft": "nft-empty.json"},
			ran:   []string{"iptables-legacy-save -t filter", "iptables-nft-save -t filter", "nft -j list ruleset"},
			value: "1",
		},
		{
			name:  "drop in native nft only",
			bins:  map[string]string{"iptables-legacy-save": "iptables-legacy-save-empty.txt", "iptables-nft-save": "iptables-save-no-drop.txt", "nft": "nft-invalid-drop.json"},
			ran:   []string{"iptables-legacy-save -t filter", "iptables-nft-save -t filter", "nft -j list ruleset"},
			value: "1",
		},
		{
			name:  "no drop anywhere",
			bins:  map[string]string{"iptables-legacy-save": "iptables-legacy-save-empty.txt", "iptables-nft-save": "iptables-save-no-drop.txt", "nft": "nft-iptables-nft-only.json"},
			ran:   []string{"iptables-legacy-save -t filter", "iptables-nft-save -t filter", "nft -j list ruleset"},
			value: "0",
		},
		{
			name:  "only iptables-save and no nft binary",
			bins:  map[string]string{"iptables-save": "iptables-nft-save-kube-proxy.txt"},
			ran:   []string{"iptables-save"},
			value: "1",
		},
		{
			name:  "missing binaries are not failures when something was read",
			bins:  map[string]string{"nft": "nft-empty.json"},
			ran:   []string{"nft -j list ruleset"},
			value: "0",
		},
		{
			name:    "no binary at all",
			bins:    map[string]string{},
			wantErr: "no backend could be read (binaries not found: iptables, nftables)",
		},
		{
			name:    "permission denied everywhere",
			bins:    map[string]string{"iptables-legacy-save": permLegacy, "iptables-nft-save": permNFT, "nft": permNft},
			ran:     []string{"iptables-legacy-save -t filter", "iptables-nft-save -t filter", "nft -j list ruleset"},
			wantErr: "no backend could be read: iptables-legacy: iptables-legacy-save -t filter: exit status 1: iptables-save v1.8.9 (legacy): Cannot initialize: Permission denied (you must be root)\niptables-nft: iptables-nft-save -t filter: exit status 4",
		},
		{
			name:    "legacy needs CAP_NET_RAW: no drop elsewhere is not certain",
			bins:    map[string]string{"iptables-legacy-save": permLegacy, "iptables-nft-save": "iptables-save-no-drop.txt", "nft": "nft-empty.json"},
			ran:     []string{"iptables-legacy-save -t filter", "iptables-nft-save -t filter", "nft -j list ruleset"},
			value:   "0",
			wantErr: "invalid drop rule check incomplete, no drop found in what could be read: iptables-legacy: iptables-legacy-save -t filter: exit status 1: iptables-save v1.8.9 (legacy): Cannot initialize: Permission denied (you must be root)",
		},
		{
			name:  "a drop found is certain whatever else failed",
			bins:  map[string]string{"iptables-legacy-save": permLegacy, "iptables-nft-save": "iptables-nft-save-kube-proxy.txt", "nft": permNft},
			ran:   []string{"iptables-legacy-save -t filter", "iptables-nft-save -t filter", "nft -j list ruleset"},
			value: "1",
		},
		{
			// The legacy fixture has a drop: finding none shows iptables-legacy-save did not run.
			name:   "no ip_tables_names: x_tables not loaded, iptables-legacy-save never run",
			bins:   map[string]string{"iptables-legacy-save": "iptables-legacy-save-drop.txt", "iptables-nft-save": "iptables-save-no-drop.txt", "nft": "nft-empty.json"},
			tables: noTablesFile,
			ran:    []string{"iptables-nft-save -t filter", "nft -j list ruleset"},
			value:  "0",
		},
		{
			name:   "ip_tables_names without filter: iptables-legacy-save never run",
			bins:   map[string]string{"iptables-legacy-save": "iptables-legacy-save-drop.txt", "iptables-nft-save": "iptables-save-no-drop.txt", "nft": "nft-empty.json"},
			tables: "nat\nmangle\n",
			ran:    []string{"iptables-nft-save -t filter", "nft -j list ruleset"},
			value:  "0",
		},
		{
			name:   "empty ip_tables_names: no legacy table, iptables-legacy-save never run",
			bins:   map[string]string{"iptables-legacy-save": "iptables-legacy-save-drop.txt", "iptables-nft-save": "iptables-save-no-drop.txt", "nft": "nft-empty.json"},
			tables: emptyTables,
			ran:    []string{"iptables-nft-save -t filter", "nft -j list ruleset"},
			value:  "0",
		},
		{
			// Without root the list cannot be read; asking -t filter anyway could create the
			// table, so the legacy backend is an error and no drop elsewhere is not certain.
			name:    "ip_tables_names unreadable: error, no legacy command run",
			bins:    map[string]string{"iptables-legacy-save": "iptables-legacy-save-drop.txt", "iptables-nft-save": "iptables-save-no-drop.txt", "nft": "nft-empty.json"},
			tables:  unreadableTables,
			ran:     []string{"iptables-nft-save -t filter", "nft -j list ruleset"},
			value:   "0",
			wantErr: "invalid drop rule check incomplete, no drop found in what could be read: iptables-legacy: cannot tell whether a legacy filter table exists without creating one: read ",
		},
		{
			name:    "ip_tables_names unreadable and no other backend: no answer",
			bins:    map[string]string{"iptables-legacy-save": "iptables-legacy-save-drop.txt"},
			tables:  unreadableTables,
			wantErr: "no backend could be read (binaries not found: iptables-nft, nftables): iptables-legacy: cannot tell whether a legacy filter table exists without creating one: read ",
		},
		{
			name:   "ip_tables_names unreadable: a drop elsewhere is still certain",
			bins:   map[string]string{"iptables-legacy-save": "iptables-legacy-save-empty.txt", "iptables-nft-save": "iptables-nft-save-kube-proxy.txt", "nft": "nft-empty.json"},
			tables: unreadableTables,
			ran:    []string{"iptables-nft-save -t filter", "nft -j list ruleset"},
			value:  "1",
		},
		{
			// iptables-save without -t prints only the tables that exist, so it needs no list.
			name:   "only iptables-save: run without -t whatever ip_tables_names says",
			bins:   map[string]string{"iptables-save": "iptables-legacy-save-drop.txt", "nft": "nft-empty.json"},
			tables: unreadableTables,
			ran:    []string{"iptables-save", "nft -j list ruleset"},
			value:  "1",
		},
		{
			name:    "unparsable output",
			bins:    map[string]string{"iptables-nft-save": "nft-empty.json", "nft": "iptables-save-no-drop.txt"},
			ran:     []string{"iptables-nft-save -t filter", "nft -j list ruleset"},
			wantErr: "iptables-nft: iptables-nft-save -t filter: iptables-save line 1: unexpected line",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &fakeNode{t: t, bins: tt.bins}
			c := newTestCollector(t, procWithTables(t, tt.tables), f.run, f.lookPath)
			a := &adapter{c: c}

			// Before the first check: sysctls only, no error.
			if err := testutil.CollectAndCompare(a, strings.NewReader(""), "proxyhealth_invalid_drop_rule_present", "proxyhealth_node_rules_last_check_timestamp_seconds"); err != nil || a.err != nil {
				t.Fatalf("before the first check: %v, %v", err, a.err)
			}

			c.CheckRules(context.Background())
			if strings.Join(f.ran, "|") != strings.Join(tt.ran, "|") {
				t.Errorf("ran %q, want %q", f.ran, tt.ran)
			}
			want := rulesHelp + "proxyhealth_node_rules_last_check_timestamp_seconds 1.7000000005e+09\n"
			if tt.value != "" {
				want += "proxyhealth_invalid_drop_rule_present " + tt.value + "\n"
			}
			if err := testutil.CollectAndCompare(a, strings.NewReader(want), "proxyhealth_invalid_drop_rule_present", "proxyhealth_node_rules_last_check_timestamp_seconds"); err != nil {
				t.Error(err)
			}
			switch {
			case tt.wantErr == "" && a.err != nil:
				t.Errorf("unexpected error: %v", a.err)
			case tt.wantErr != "" && (a.err == nil || !strings.Contains(a.err.Error(), tt.wantErr)):
				t.Errorf("error = %v, want it to contain %q", a.err, tt.wantErr)
			}
		})
	}
}

func TestRulesCheckTimeout(t *testing.T) {
	slow := func(ctx context.Context, name string, args ...string) ([]byte, error) {
		<-ctx.Done()
		return nil, fmt.Errorf("%w (signal: killed)", ctx.Err())
	}
	look := func(name string) (string, error) { return "/usr/sbin/" + name, nil }
	c, err := New(Config{ProcPath: "testdata/proc-full", RulesCheckInterval: time.Hour, CommandTimeout: 10 * time.Millisecond, Run: slow, LookPath: look}, nil)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	c.CheckRules(context.Background())
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("check took %v despite a 10ms timeout per command", d)
	}
	err = c.Update(make(chan prometheus.Metric, 100))
	if err == nil || !strings.Contains(err.Error(), "context deadline exceeded") {
		t.Errorf("error = %v, want a deadline", err)
	}
}

func TestRunStopsWithContext(t *testing.T) {
	f := &fakeNode{t: t, bins: map[string]string{"nft": "nft-invalid-drop.json"}}
	c, err := New(Config{ProcPath: "testdata/proc-full", RulesCheckInterval: 5 * time.Millisecond, CommandTimeout: time.Second, Run: f.run, LookPath: f.lookPath}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	deadline := time.After(5 * time.Second)
	for {
		c.mu.Lock()
		res := c.rules
		c.mu.Unlock()
		if res != nil {
			if _, _, found := res.found(); !found {
				t.Error("drop not found")
			}
			break
		}
		select {
		case <-deadline:
			t.Fatal("no check result after 5s")
		case <-time.After(time.Millisecond):
		}
	}
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}

func TestParseSysctl(t *testing.T) {
	for in, want := range map[string]int64{"1\n": 1, "0": 0, " 2 \n": 2, "-1\n": -1} {
		if got, err := parseSysctl([]byte(in)); err != nil || got != want {
			t.Errorf("%q: %d %v", in, got, err)
		}
	}
	for _, in := range []string{"", "x", "1 2", "1.5"} {
		if _, err := parseSysctl([]byte(in)); err == nil {
			t.Errorf("%q: want error", in)
		}
	}
}
