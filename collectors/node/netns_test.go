package node

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// scratchNetns creates a network namespace for the test and deletes it when the test ends. It
// skips the test when not root or when ip is missing. Nothing is changed in the test's own
// namespace.
func scratchNetns(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to create a network namespace")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("ip (iproute2) not installed")
	}
	name := fmt.Sprintf("phnode-%d-%d", os.Getpid(), time.Now().UnixNano()%1e9)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "delete", name).CombinedOutput(); err != nil {
			t.Errorf("ip netns delete %s: %v: %s", name, err, out)
		}
	})
	return name
}

func inNetns(t *testing.T, ns string, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", append([]string{"netns", "exec", ns}, args...)...).CombinedOutput(); err != nil {
		t.Fatalf("in %s: %s: %v: %s", ns, strings.Join(args, " "), err, out)
	}
}

// netnsProc is a procfs tree for a collector whose commands run in a scratch namespace: the
// sysctls of testdata/proc-full, and net/ip_tables_names as a command run in the namespace sees
// it. The collector reads <ProcPath>/net/ip_tables_names itself, from the test's own process,
// whose /proc/net shows the test's namespace, not the one its commands run in through
// `ip netns exec`. So the list is fetched from inside the namespace, through the same prefix
// (and so with the same privileges) as the commands, and refreshed before each check since
// the rules added change it: absent stays absent, and unreadable stays unreadable (a directory
// at that path, since the test process is root and would read a mode 000 file).
type netnsProc struct {
	t      *testing.T
	dir    string
	prefix []string // ip netns exec <ns> [privilege dropping ...]
}

func newNetnsProc(t *testing.T, prefix ...string) *netnsProc {
	t.Helper()
	dir := t.TempDir()
	if err := os.CopyFS(dir, os.DirFS("testdata/proc-full")); err != nil {
		t.Fatal(err)
	}
	p := &netnsProc{t: t, dir: dir, prefix: prefix}
	p.refresh()
	return p
}

// fetch reads /proc/net/ip_tables_names through the prefix: its contents, or whether it is
// missing or unreadable.
func (p *netnsProc) fetch() (names []byte, missing, unreadable bool) {
	p.t.Helper()
	args := append(append([]string{}, p.prefix[1:]...), "cat", "/proc/net/ip_tables_names")
	cmd := exec.Command(p.prefix[0], args...)
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	switch {
	case err == nil:
		return out, false, false
	case strings.Contains(stderr.String(), "No such file or directory"):
		return nil, true, false
	case strings.Contains(stderr.String(), "Permission denied"):
		return nil, false, true
	}
	p.t.Fatalf("%s: %v: %s", strings.Join(append(p.prefix[:1:1], args...), " "), err, stderr.String())
	return nil, false, false
}

func (p *netnsProc) refresh() {
	p.t.Helper()
	path := filepath.Join(p.dir, "net", "ip_tables_names")
	if err := os.RemoveAll(path); err != nil {
		p.t.Fatal(err)
	}
	names, missing, unreadable := p.fetch()
	var err error
	switch {
	case missing:
	case unreadable:
		err = os.Mkdir(path, 0o755)
	default:
		err = os.WriteFile(path, names, 0o644)
	}
	if err != nil {
		p.t.Fatal(err)
	}
}

// legacyTables returns the legacy tables that exist in ns: none when ip_tables_names is empty or
// missing (x_tables not loaded).
func legacyTables(t *testing.T, ns string) []string {
	t.Helper()
	names, _, unreadable := (&netnsProc{t: t, prefix: []string{"ip", "netns", "exec", ns}}).fetch()
	if unreadable {
		t.Fatalf("root cannot read /proc/net/ip_tables_names in %s", ns)
	}
	return strings.Fields(string(names))
}

// recordingRunner runs commands through ip netns exec <ns> [priv...] and records the base name
// of each binary run.
func recordingRunner(ns string, priv []string, ran *[]string) CommandRunner {
	var mu sync.Mutex
	return func(ctx context.Context, name string, args ...string) ([]byte, error) {
		mu.Lock()
		*ran = append(*ran, filepath.Base(name))
		mu.Unlock()
		return ExecRunner(ctx, "ip", append(append(append([]string{"netns", "exec", ns}, priv...), name), args...)...)
	}
}

// TestRulesCheckInNetns runs the real iptables-save and nft binaries against rules added in a
// scratch network namespace.
func TestRulesCheckInNetns(t *testing.T) {
	ns := scratchNetns(t)
	look := func(name string) (string, error) {
		if name == "iptables-legacy-save" || name == "iptables-nft-save" || name == "iptables-save" || name == "nft" {
			return exec.LookPath(name)
		}
		return "", exec.ErrNotFound
	}
	for _, bin := range []string{"iptables", "nft", "iptables-nft-save"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s not installed", bin)
		}
	}
	var ran []string
	run := recordingRunner(ns, nil, &ran)
	proc := newNetnsProc(t, "ip", "netns", "exec", ns)
	c, err := New(Config{ProcPath: proc.dir, RulesCheckInterval: time.Hour, CommandTimeout: 10 * time.Second, Run: run, LookPath: look}, nil)
	if err != nil {
		t.Fatal(err)
	}
	expect := func(step, value string) {
		t.Helper()
		before := legacyTables(t, ns)
		proc.refresh()
		ran = nil
		c.CheckRules(context.Background())
		a := &adapter{c: c}
		want := rulesHelp[:strings.Index(rulesHelp, "# HELP proxyhealth_node")] + "proxyhealth_invalid_drop_rule_present " + value + "\n"
		if err := testutil.CollectAndCompare(a, strings.NewReader(want), "proxyhealth_invalid_drop_rule_present"); err != nil {
			t.Errorf("%s: %v", step, err)
		}
		if a.err != nil {
			t.Errorf("%s: Update: %v", step, a.err)
		}
		// Reading must not change the node: iptables-legacy-save is only run when the legacy
		// filter table exists, since naming a missing one makes the kernel create it.
		if after := legacyTables(t, ns); !slices.Equal(before, after) {
			t.Errorf("%s: legacy tables %q before the check, %q after", step, before, after)
		}
		if ranLegacy := slices.Contains(ran, "iptables-legacy-save"); ranLegacy != slices.Contains(before, "filter") {
			t.Errorf("%s: legacy tables %q, ran %q", step, before, ran)
		}
	}

	expect("empty namespace", "0")

	rule := []string{"FORWARD", "-m", "conntrack", "--ctstate", "INVALID", "-j", "DROP"}
	inNetns(t, ns, append([]string{"iptables", "-A"}, rule...)...)
	expect("iptables -A FORWARD ... INVALID -j DROP", "1")

	inNetns(t, ns, append([]string{"iptables", "-D"}, rule...)...)
	expect("rule deleted", "0")

	inNetns(t, ns, "nft", "add", "table", "inet", "filter")
	inNetns(t, ns, "nft", "add", "chain", "inet", "filter", "forward", "{ type filter hook forward priority 0; policy accept; }")
	inNetns(t, ns, "nft", "add", "rule", "inet", "filter", "forward", "ct", "state", "invalid", "drop")
	expect("nft ct state invalid drop", "1")

	inNetns(t, ns, "nft", "delete", "table", "inet", "filter")
	expect("nft table deleted", "0")

	if _, err := exec.LookPath("iptables-legacy"); err == nil {
		inNetns(t, ns, append([]string{"iptables-legacy", "-A"}, rule...)...)
		expect("iptables-legacy -A FORWARD ... INVALID -j DROP", "1")
	}
}

// nobody runs a command as nobody with only the given capabilities (setpriv's --inh-caps
// syntax, e.g. "-all" or "+net_admin,+net_raw").
func nobody(caps string) []string {
	priv := []string{"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=" + caps}
	if caps != "-all" {
		priv = append(priv, "--ambient-caps="+caps)
	}
	return priv
}

// TestRulesCheckWithoutCapabilities runs the real binaries as nobody without capabilities: no
// backend can be read, so the metric is absent and the error says why.
func TestRulesCheckWithoutCapabilities(t *testing.T) {
	ns := scratchNetns(t)
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Skip("setpriv not installed")
	}
	var ran []string
	priv := nobody("-all")
	proc := newNetnsProc(t, append([]string{"ip", "netns", "exec", ns}, priv...)...)
	c, err := New(Config{ProcPath: proc.dir, RulesCheckInterval: time.Hour, CommandTimeout: 10 * time.Second, Run: recordingRunner(ns, priv, &ran)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.CheckRules(context.Background())
	a := &adapter{c: c}
	if err := testutil.CollectAndCompare(a, strings.NewReader(""), "proxyhealth_invalid_drop_rule_present"); err != nil {
		t.Error(err)
	}
	if a.err == nil || !strings.Contains(a.err.Error(), "no backend could be read") ||
		!(strings.Contains(a.err.Error(), "Permission denied") || strings.Contains(a.err.Error(), "Operation not permitted")) {
		t.Errorf("error = %v, want the permission failure of each backend", a.err)
	}
	t.Logf("error without capabilities: %v", a.err)
}

// TestRulesCheckLeastPrivilege runs the real binaries as nobody with the capabilities of the
// DaemonSet, against a drop rule in the legacy filter table of a scratch namespace.
func TestRulesCheckLeastPrivilege(t *testing.T) {
	ns := scratchNetns(t)
	for _, bin := range []string{"setpriv", "iptables-legacy"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s not installed", bin)
		}
	}
	inNetns(t, ns, "iptables-legacy", "-A", "FORWARD", "-m", "state", "--state", "INVALID", "-j", "DROP")
	check := func(t *testing.T, caps string) (*Collector, *adapter, []string) {
		t.Helper()
		var ran []string
		priv := nobody(caps)
		proc := newNetnsProc(t, append([]string{"ip", "netns", "exec", ns}, priv...)...)
		c, err := New(Config{ProcPath: proc.dir, RulesCheckInterval: time.Hour, CommandTimeout: 10 * time.Second, Run: recordingRunner(ns, priv, &ran)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		c.CheckRules(context.Background())
		return c, &adapter{c: c}, ran
	}
	metric := func(value string) string {
		return rulesHelp[:strings.Index(rulesHelp, "# HELP proxyhealth_node")] + "proxyhealth_invalid_drop_rule_present " + value + "\n"
	}

	// CAP_NET_ADMIN and CAP_NET_RAW read iptables-nft-save and nft, and would read
	// iptables-legacy-save, but not ip_tables_names (root's only): whether the legacy filter
	// table exists is unknown, and asking for it could create it. The legacy drop is not seen,
	// and the error says why.
	t.Run("net_admin,net_raw", func(t *testing.T) {
		c, a, ran := check(t, "+net_admin,+net_raw")
		if err := testutil.CollectAndCompare(a, strings.NewReader(metric("0")), "proxyhealth_invalid_drop_rule_present"); err != nil {
			t.Error(err)
		}
		const want = "invalid drop rule check incomplete, no drop found in what could be read: iptables-legacy: cannot tell whether a legacy filter table exists without creating one"
		if a.err == nil || !strings.Contains(a.err.Error(), want) {
			t.Errorf("Update: %v, want %q", a.err, want)
		}
		if slices.Contains(ran, "iptables-legacy-save") {
			t.Errorf("ran %q: iptables-legacy-save must not run when ip_tables_names cannot be read", ran)
		}
		for _, b := range c.rules.backends {
			if !b.missing && b.err != nil && b.name != "iptables-legacy" {
				t.Errorf("%s: %v", b.name, b.err)
			}
		}
	})

	// CAP_DAC_READ_SEARCH as well lets the exporter read ip_tables_names: every backend is
	// read, and the legacy drop is found.
	t.Run("net_admin,net_raw,dac_read_search", func(t *testing.T) {
		c, a, ran := check(t, "+net_admin,+net_raw,+dac_read_search")
		if err := testutil.CollectAndCompare(a, strings.NewReader(metric("1")), "proxyhealth_invalid_drop_rule_present"); err != nil {
			t.Error(err)
		}
		if a.err != nil {
			t.Errorf("Update: %v", a.err)
		}
		if !slices.Contains(ran, "iptables-legacy-save") {
			t.Errorf("ran %q, want iptables-legacy-save", ran)
		}
		for _, b := range c.rules.backends {
			if !b.missing && b.err != nil {
				t.Errorf("%s: %v", b.name, b.err)
			}
		}
	})
}
