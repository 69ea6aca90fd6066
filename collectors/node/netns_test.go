package node

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
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
	run := func(ctx context.Context, name string, args ...string) ([]byte, error) {
		return ExecRunner(ctx, "ip", append([]string{"netns", "exec", ns, name}, args...)...)
	}
	c, err := New(Config{ProcPath: "testdata/proc-full", RulesCheckInterval: time.Hour, CommandTimeout: 10 * time.Second, Run: run, LookPath: look}, nil)
	if err != nil {
		t.Fatal(err)
	}
	expect := func(step, value string) {
		t.Helper()
		c.CheckRules(context.Background())
		a := &adapter{c: c}
		want := rulesHelp[:strings.Index(rulesHelp, "# HELP proxyhealth_node")] + "proxyhealth_invalid_drop_rule_present " + value + "\n"
		if err := testutil.CollectAndCompare(a, strings.NewReader(want), "proxyhealth_invalid_drop_rule_present"); err != nil {
			t.Errorf("%s: %v", step, err)
		}
		if a.err != nil {
			t.Errorf("%s: Update: %v", step, a.err)
		}
	}

	expect("empty namespace", "0")
	// Reading must not change the node: iptables-legacy-save -t filter would have created an
	// empty legacy filter table.
	if out, err := exec.Command("ip", "netns", "exec", ns, "cat", "/proc/net/ip_tables_names").CombinedOutput(); err != nil || len(out) != 0 {
		t.Errorf("legacy tables after the check: %q %v", out, err)
	}

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

// TestRulesCheckWithoutCapabilities runs the real binaries as nobody without capabilities: no
// backend can be read, so the metric is absent and the error says why.
func TestRulesCheckWithoutCapabilities(t *testing.T) {
	ns := scratchNetns(t)
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Skip("setpriv not installed")
	}
	run := func(ctx context.Context, name string, args ...string) ([]byte, error) {
		return ExecRunner(ctx, "ip", append([]string{"netns", "exec", ns, "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all", name}, args...)...)
	}
	c, err := New(Config{ProcPath: "testdata/proc-full", RulesCheckInterval: time.Hour, CommandTimeout: 10 * time.Second, Run: run}, nil)
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

// TestRulesCheckLeastPrivilege runs the real binaries as nobody with only CAP_NET_ADMIN and
// CAP_NET_RAW, as the DaemonSet does: every backend must be readable, iptables-legacy-save
// through its -t filter fallback.
func TestRulesCheckLeastPrivilege(t *testing.T) {
	ns := scratchNetns(t)
	for _, bin := range []string{"setpriv", "iptables-legacy"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s not installed", bin)
		}
	}
	inNetns(t, ns, "iptables-legacy", "-A", "FORWARD", "-m", "state", "--state", "INVALID", "-j", "DROP")
	run := func(ctx context.Context, name string, args ...string) ([]byte, error) {
		return ExecRunner(ctx, "ip", append([]string{"netns", "exec", ns, "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
			"--inh-caps=+net_admin,+net_raw", "--ambient-caps=+net_admin,+net_raw", name}, args...)...)
	}
	c, err := New(Config{ProcPath: "testdata/proc-full", RulesCheckInterval: time.Hour, CommandTimeout: 10 * time.Second, Run: run}, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.CheckRules(context.Background())
	a := &adapter{c: c}
	want := rulesHelp[:strings.Index(rulesHelp, "# HELP proxyhealth_node")] + "proxyhealth_invalid_drop_rule_present 1\n"
	if err := testutil.CollectAndCompare(a, strings.NewReader(want), "proxyhealth_invalid_drop_rule_present"); err != nil {
		t.Error(err)
	}
	if a.err != nil {
		t.Errorf("Update: %v", a.err)
	}
	for _, b := range c.rules.backends {
		if !b.missing && b.err != nil {
			t.Errorf("%s: %v", b.name, b.err)
		}
	}
}
