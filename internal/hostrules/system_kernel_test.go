package hostrules

import (
	"context"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/promslog"
	"github.com/proxyhealth/proxyhealth/internal/nftnl/nftnltest"
)

// Real kube-proxy v1.36.3 captures (collectors/rules/testdata), loaded into this test's own
// network namespace.
const (
	iptablesCapture = "../../collectors/rules/testdata/kube-proxy-v1.36.3/iptables-save-nat.txt"
	nftCapture      = "../../collectors/rules/testdata/kube-proxy-v1.36.3-nftables/nft-list-table-ip-kube-proxy.json"
)

func requireNetns(t *testing.T, bins ...string) {
	t.Helper()
	if os.Getenv(inNetnsEnv) != "1" {
		t.Skip("needs root and unshare(1) to run in a network namespace of its own")
	}
	for _, b := range bins {
		if _, err := exec.LookPath(b); err != nil {
			t.Skipf("%s not installed", b)
		}
	}
}

func readFile(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func run(t *testing.T, name string, args ...string) {
	t.Helper()
	cmd := exec.Command(name, args...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
}

// startSource runs a Source on this namespace until the test ends.
func startSource(t *testing.T, cfg Config) (*Source, <-chan struct{}) {
	t.Helper()
	cfg.ProcPath = "/proc"
	if cfg.LegacyPollInterval == 0 {
		cfg.LegacyPollInterval = 50 * time.Millisecond
	}
	if cfg.ResyncInterval == 0 {
		cfg.ResyncInterval = time.Hour
	}
	s, err := New(cfg, promslog.NewNopLogger())
	if err != nil {
		t.Fatal(err)
	}
	sub := s.Subscribe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return s, sub
}

func waitState(t *testing.T, s *Source, sub <-chan struct{}, what string, ok func(*State) bool) *State {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		if st := s.State(); st != nil && ok(st) {
			return st
		}
		select {
		case <-sub:
		case <-time.After(20 * time.Millisecond):
		case <-deadline:
			t.Fatalf("timed out waiting for %s; last state %+v", what, s.State())
		}
	}
}

func flush(t *testing.T) {
	t.Helper()
	run(t, "nft", "flush", "ruleset")
	if _, err := exec.LookPath("iptables-legacy"); err == nil {
		if names, _ := os.ReadFile("/proc/net/ip_tables_names"); strings.Contains(string(names), "nat") {
			run(t, "iptables-legacy", "-t", "nat", "-F")
			run(t, "iptables-legacy", "-t", "nat", "-X")
		}
	}
}

// The iptables-nft backend: read over netlink, followed as kube-proxy changes it.
func TestSourceIPTablesNFT(t *testing.T) {
	requireNetns(t, "iptables-nft-restore", "iptables-nft", "nft")
	t.Cleanup(func() { flush(t) })
	nftnltest.LoadIPTablesSave(t, readFile(t, iptablesCapture), false)
	s, sub := startSource(t, Config{Debounce: 10 * time.Millisecond})
	st := waitState(t, s, sub, "iptables mode", func(st *State) bool { return st.Mode == ModeIPTables })
	if st.Backend != BackendIPTablesNFT || len(st.ProxyRules(false).Chains) == 0 || len(st.ProxyRules(false).Services) == 0 {
		t.Fatalf("state: backend %q, %d chains, %d services", st.Backend, len(st.ProxyRules(false).Chains), len(st.ProxyRules(false).Services))
	}
	before := len(st.ProxyRules(false).Chains)
	// kube-proxy deletes a service's chains: the change arrives without any poll of nf_tables.
	var svc string
	for name := range st.ProxyRules(false).Chains {
		if strings.HasPrefix(name, "KUBE-SVC-") {
			svc = name
			break
		}
	}
	run(t, "sh", "-c", "iptables-nft-save -t nat | grep -v -- '-j "+svc+"' | grep -v -- '^:"+svc+" ' | grep -v -- '^-A "+svc+" ' | iptables-nft-restore")
	waitState(t, s, sub, "the deleted chain", func(st *State) bool {
		_, still := st.ProxyRules(false).Chains[svc]
		return !still && len(st.ProxyRules(false).Chains) == before-1
	})
	// kube-proxy's INVALID drop is not in this capture's filter table: the forward path of
	// iptables-nft is read, and has none.
	for _, f := range s.State().Forward {
		if f.Err != nil {
			t.Errorf("forward %s: %v", f.Backend, f.Err)
		}
	}
}

// nftables mode, with an INVALID drop in a native table that appears later.
func TestSourceNFTables(t *testing.T) {
	requireNetns(t, "nft")
	t.Cleanup(func() { flush(t) })
	nftnltest.LoadNFTJSON(t, readFile(t, nftCapture))
	s, sub := startSource(t, Config{Debounce: 10 * time.Millisecond})
	st := waitState(t, s, sub, "nftables mode", func(st *State) bool { return st.Mode == ModeNFTables })
	if st.Backend != BackendNFTables || len(st.ProxyRules(false).Chains) == 0 {
		t.Fatalf("state: %+v", st)
	}
	run(t, "nft", "add table inet fw; add chain inet fw forward { type filter hook forward priority 0; }; add rule inet fw forward ct state invalid drop")
	st = waitState(t, s, sub, "the native drop", func(st *State) bool {
		for _, f := range st.Forward {
			for _, g := range f.Graphs {
				if f.Backend == BackendNFTables && g.InvalidDropPath() != nil {
					return true
				}
			}
		}
		return false
	})
}

// The legacy backend: no notification, so a size change (or kube-proxy's sync, Hint) makes the
// Source read it; nothing is created that did not exist.
func TestSourceLegacy(t *testing.T) {
	requireNetns(t, "iptables-legacy-restore", "iptables-legacy")
	t.Cleanup(func() { flush(t) })
	s, sub := startSource(t, Config{})
	st := waitState(t, s, sub, "the first read", func(*State) bool { return true })
	if st.Mode != ModeNone {
		t.Errorf("empty namespace: mode %q", st.Mode)
	}
	if names, err := os.ReadFile("/proc/net/ip_tables_names"); err == nil && len(strings.TrimSpace(string(names))) > 0 {
		t.Fatalf("reading created legacy tables: %q", names)
	}
	// The nfacct object kube-proxy's NodePort rule names is not needed here: leave the match out.
	text := regexp.MustCompile(`-m nfacct --nfacct-name +\S+ `).ReplaceAllString(string(readFile(t, iptablesCapture)), "")
	restore := exec.Command("iptables-legacy-restore")
	restore.Stdin = strings.NewReader(text)
	if out, err := restore.CombinedOutput(); err != nil {
		t.Fatalf("iptables-legacy-restore: %v\n%s", err, out)
	}
	st = waitState(t, s, sub, "the legacy rules", func(st *State) bool { return st.Mode == ModeIPTables })
	if st.Backend != BackendLegacy || len(st.ProxyRules(false).Services) == 0 {
		t.Errorf("state: backend %q, %d services", st.Backend, len(st.ProxyRules(false).Services))
	}
}
