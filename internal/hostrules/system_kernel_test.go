package hostrules

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/promslog"
	"github.com/proxyhealth/proxyhealth/internal/iptlegacy"
	"github.com/proxyhealth/proxyhealth/internal/nftnl"
	"github.com/proxyhealth/proxyhealth/internal/nftnl/nftnltest"
	"github.com/proxyhealth/proxyhealth/internal/ruleset"
	"github.com/proxyhealth/proxyhealth/internal/testsupport/prereq"
)

// Real kube-proxy v1.36.3 captures (collectors/rules/testdata), loaded into this test's own
// network namespace.
const (
	iptablesCapture = "../../collectors/rules/testdata/kube-proxy-v1.36.3/iptables-save-nat.txt"
	nftCapture      = "../../collectors/rules/testdata/kube-proxy-v1.36.3-nftables/nft-list-table-ip-kube-proxy.json"
)

func requireNetns(t *testing.T, bins ...string) {
	t.Helper()
	if !nftnltest.InNetns() {
		prereq.Skip(t, "needs root and unshare(1) to run in a network namespace of its own")
	}
	for _, b := range bins {
		if _, err := exec.LookPath(b); err != nil {
			prereq.Skipf(t, "%s not installed", b)
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
	runUntilEnd(t, s)
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

// followStats reads the system backends' Follower counters (safe while the Source runs).
func followStats(t *testing.T, s *Source) nftnl.FollowStats {
	t.Helper()
	f, ok := s.b.(*systemBackends).follower.(*nftnl.Follower)
	if !ok {
		t.Fatal("no follower")
	}
	return f.Stats()
}

func readsSince(a, b nftnl.FollowStats) nftnl.FollowStats {
	return nftnl.FollowStats{FullReads: b.FullReads - a.FullReads, RuleDumps: b.RuleDumps - a.RuleDumps, ElementDumps: b.ElementDumps - a.ElementDumps}
}

// One service's endpoint replaced as kube-proxy's partial sync does it (iptables-nft-restore
// --noflush: the old KUBE-SEP chain flushed and deleted, a new one, the service chain and
// KUBE-SERVICES written again): the published rules equal a fresh whole read, taken from the
// commit's rule messages alone.
func TestSourceIPTablesNFTFollowsOneService(t *testing.T) {
	requireNetns(t, "iptables-nft-restore", "iptables-nft", "nft")
	t.Cleanup(func() { flush(t) })
	capture := readFile(t, iptablesCapture)
	nftnltest.LoadIPTablesSave(t, capture, false)
	s, sub := startSource(t, Config{Debounce: 10 * time.Millisecond})
	waitState(t, s, sub, "iptables mode", func(st *State) bool { return st.Mode == ModeIPTables })
	before := followStats(t, s)

	var services strings.Builder
	for _, l := range strings.Split(string(capture), "\n") {
		if strings.HasPrefix(l, "-A KUBE-SERVICES ") {
			services.WriteString(l + "\n")
		}
	}
	nftnltest.LoadIPTablesSave(t, []byte(`*nat
:KUBE-SERVICES - [0:0]
:KUBE-SVC-FEK7IJ3KIWHUKSBD - [0:0]
:KUBE-SEP-RX36DMIICQEWPEUB - [0:0]
:KUBE-SEP-NEWNEWNEWNEW0001 - [0:0]
`+services.String()+`-A KUBE-SVC-FEK7IJ3KIWHUKSBD ! -s 10.244.0.0/16 -d 10.96.0.52/32 -p tcp -m comment --comment "lab/web-nodeport:http cluster IP" -m tcp --dport 80 -j KUBE-MARK-MASQ
-A KUBE-SVC-FEK7IJ3KIWHUKSBD -m comment --comment "lab/web-nodeport:http -> 10.244.1.3:8080" -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-HUGL6XOLN2FXI7EB
-A KUBE-SVC-FEK7IJ3KIWHUKSBD -m comment --comment "lab/web-nodeport:http -> 10.244.3.51:8080" -j KUBE-SEP-NEWNEWNEWNEW0001
-A KUBE-SEP-NEWNEWNEWNEW0001 -s 10.244.3.51/32 -m comment --comment "lab/web-nodeport:http" -j KUBE-MARK-MASQ
-A KUBE-SEP-NEWNEWNEWNEW0001 -p tcp -m comment --comment "lab/web-nodeport:http" -m tcp -j DNAT --to-destination 10.244.3.51:8080
-X KUBE-SEP-RX36DMIICQEWPEUB
COMMIT
`), false, "--noflush")
	newEP := netip.MustParseAddrPort("10.244.3.51:8080")
	st := waitState(t, s, sub, "the new endpoint", func(st *State) bool {
		return slices.Contains(st.ProxyRules(false).Chains["KUBE-SVC-FEK7IJ3KIWHUKSBD"], newEP)
	})
	fresh, err := nftnl.ReadIPTablesNAT(context.Background(), false, nftnl.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(st.ProxyRules(false).Content(), fresh.Content()) {
		t.Errorf("followed rules differ from a fresh read:\nfollowed %+v\nfresh    %+v", st.ProxyRules(false), fresh)
	}
	// Nothing read: the chains written (the service chain, the new KUBE-SEP chain and
	// KUBE-SERVICES) follow from the watch's rule messages, and the old one is gone.
	if d := readsSince(before, followStats(t, s)); d != (nftnl.FollowStats{}) {
		t.Errorf("reads for one service's change: %+v, want none", d)
	}
}

// nftables mode: one service chain flushed and written again with a new endpoint map, then one
// service-ips element changed.
func TestSourceNFTablesFollowsOneService(t *testing.T) {
	requireNetns(t, "nft")
	t.Cleanup(func() { flush(t) })
	nftnltest.LoadNFTJSON(t, readFile(t, nftCapture))
	s, sub := startSource(t, Config{Debounce: 10 * time.Millisecond})
	st := waitState(t, s, sub, "nftables mode", func(st *State) bool { return st.Mode == ModeNFTables })
	var svc ruleset.Service
	for _, sv := range st.ProxyRules(false).Services {
		if len(st.ProxyRules(false).Chains[sv.Chain]) > 0 {
			svc = sv
			break
		}
	}
	if svc.Chain == "" {
		t.Fatal("no service with endpoints in the capture")
	}
	// check compares the published rules with a fresh read; nothing more is read meanwhile.
	check := func(what string, ok func(*State) bool, rules, elements uint64) {
		t.Helper()
		before := followStats(t, s)
		st := waitState(t, s, sub, what, ok)
		fresh, err := nftnl.ReadKubeProxyNFT(context.Background(), false, nftnl.Limits{})
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(st.ProxyRules(false).Content(), fresh.Content()) {
			t.Errorf("%s: followed rules differ from a fresh read:\nfollowed %+v\nfresh    %+v", what, st.ProxyRules(false), fresh)
		}
		if d := readsSince(before, followStats(t, s)); d.FullReads != 0 || d.RuleDumps != rules || d.ElementDumps != elements {
			t.Errorf("%s: reads %+v, want %d chain dumps and %d element dumps", what, d, rules, elements)
		}
	}
	newEP := netip.MustParseAddrPort("10.244.9.9:8080")
	// The stats are taken before the change: the Source applies it only after the debounce.
	before := followStats(t, s)
	run(t, "nft", fmt.Sprintf("flush chain ip kube-proxy %s; add rule ip kube-proxy %s meta l4proto tcp dnat ip to numgen random mod 1 map { 0 : 10.244.9.9 . 8080 }", svc.Chain, svc.Chain))
	waitState(t, s, sub, "the rewritten service chain", func(st *State) bool {
		return slices.Equal(st.ProxyRules(false).Chains[svc.Chain], []netip.AddrPort{newEP})
	})
	// The chain is dumped; its new map's elements came with the watch's notifications.
	if d := readsSince(before, followStats(t, s)); d.FullReads != 0 || d.RuleDumps != 1 || d.ElementDumps != 0 {
		t.Errorf("service chain rewritten: reads %+v, want 1 chain dump and no element dump", d)
	}
	check("the rewritten service chain", func(*State) bool { return true }, 0, 0)

	before = followStats(t, s)
	run(t, "nft", fmt.Sprintf("delete element ip kube-proxy service-ips { %s . %d . %d }; add element ip kube-proxy service-ips { %s . %d . 9999 : goto %s }",
		svc.ClusterIP, svc.Protocol, svc.Port, svc.ClusterIP, svc.Protocol, svc.Chain))
	waitState(t, s, sub, "the moved service port", func(st *State) bool {
		return slices.ContainsFunc(st.ProxyRules(false).Services, func(x ruleset.Service) bool { return x.Chain == svc.Chain && x.Port == 9999 })
	})
	if d := readsSince(before, followStats(t, s)); d.FullReads != 0 || d.RuleDumps != 0 || d.ElementDumps != 1 {
		t.Errorf("service-ips element changed: reads %+v, want 1 element dump", d)
	}
	check("the moved service port", func(*State) bool { return true }, 0, 0)
}

// The read limits of a Config reach every reader its Source makes: the nf_tables Follower
// (kube-proxy's rules) and ForwardReader (the forward paths) fail with nftnl.ErrDumpTooLarge,
// the legacy nat read with iptlegacy.ErrTableTooLarge. They are the Source's own: another
// Source beside it, with the default limits, reads the same tables.
func TestSourceReadLimits(t *testing.T) {
	requireNetns(t, "iptables-nft-restore", "nft", "iptables-legacy-restore", "iptables-legacy")
	t.Cleanup(func() { flush(t) })
	capture := readFile(t, iptablesCapture)
	nftnltest.LoadIPTablesSave(t, capture, false)
	// The nfacct object kube-proxy's NodePort rule names is not needed here: leave the match out.
	restore := exec.Command("iptables-legacy-restore")
	restore.Stdin = strings.NewReader(regexp.MustCompile(`-m nfacct --nfacct-name +\S+ `).ReplaceAllString(string(capture), ""))
	if out, err := restore.CombinedOutput(); err != nil {
		t.Fatalf("iptables-legacy-restore: %v\n%s", err, out)
	}

	// The nat table's rule dump and the listing of its chains are each over 1 KiB, and a
	// legacy table is over 256 bytes with its built-in chains alone.
	limited, sub := startSource(t, Config{MaxDumpBytes: 1 << 10, LegacyMaxTableBytes: 256})
	tooLarge := func(st *State) bool {
		return errors.Is(st.ProxyErr, nftnl.ErrDumpTooLarge) && errors.Is(st.ProxyErr, iptlegacy.ErrTableTooLarge)
	}
	st := waitState(t, limited, sub, "both limits passed", tooLarge)
	for _, f := range st.Forward {
		if f.Backend != BackendLegacy && !errors.Is(f.Err, nftnl.ErrDumpTooLarge) {
			t.Errorf("limited source: forward %s: %v, want ErrDumpTooLarge", f.Backend, f.Err)
		}
	}

	unlimited, sub := startSource(t, Config{})
	st = waitState(t, unlimited, sub, "iptables mode", func(st *State) bool { return st.Mode == ModeIPTables })
	if st.ProxyErr != nil || len(st.ProxyRules(false).Services) == 0 {
		t.Errorf("source with the default limits: %d services, error %v; want the capture's, no error", len(st.ProxyRules(false).Services), st.ProxyErr)
	}
	for _, f := range st.Forward {
		if f.Err != nil {
			t.Errorf("source with the default limits: forward %s: %v", f.Backend, f.Err)
		}
	}
	if st := limited.State(); !tooLarge(st) {
		t.Errorf("limited source beside one with the default limits: proxy error %v, want both limits passed", st.ProxyErr)
	}
}
