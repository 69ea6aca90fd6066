package verdict

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// restoreError is what kube-proxy logs when iptables-restore meets a match whose kernel module
// the node lacks (as read from its log: one line).
const restoreError = "exit status 4: Warning: Extension ipvs revision 0 not supported, missing kernel module? | iptables-restore v1.8.9 (nf_tables): | line 31: RULE_APPEND failed (No such file or directory): rule in chain KUBE-SERVICES"

// failingSyncs makes kube-proxy's syncs fail n times in a row, from its start when
// neverApplied, with the restore error in its log.
func failingSyncs(in *Input, n uint64, neverApplied bool) {
	k := &in.KubeProxy
	k.SyncFailing, k.SyncFailures, k.SyncFailuresTotal = true, n, n+2
	k.SyncFailingSince, k.SyncNeverApplied = now.Add(-7*time.Minute), neverApplied
	k.SyncTool, k.SyncError, k.SyncErrorAt = "iptables-restore", restoreError, now.Add(-20*time.Second)
	// Each failure leaves the queued change unapplied.
	k.SyncPending = 7 * time.Minute
	if neverApplied {
		k.LastSync = time.Time{}
		k.SyncFailuresTotal = n
	}
}

// A new node: every restore since kube-proxy started failed, so none of its Service rules are
// on the node. With kube-proxy's base chains there, the drift check finds every endpoint
// missing; the stale rules say why, and the remedy is not a restart.
func TestStaleRulesExplainedByFailingSyncsOnANewNode(t *testing.T) {
	in := healthyInput()
	failingSyncs(&in, 14, true)
	d := DriftingPort{Service: dnsUDP, MissingCount: 70, Programmed: 0, Expected: 70, Since: now.Add(-6 * time.Minute)}
	in.Rules.Drifting = []DriftingPort{d}
	r := Evaluate(in)
	only(t, r, StaleRules)
	if r.Verdict != CriticalFound {
		t.Errorf("verdict %s", r.Verdict)
	}
	f := r.Findings[0]
	ev := f.Evidence.(*StaleRulesEvidence)
	if !slices.Equal(ev.ExplainedBy, []Cause{KubeProxySyncFailing}) {
		t.Errorf("explained by %v, want only kube_proxy_sync_failing (not kube_proxy_stuck)", ev.ExplainedBy)
	}
	sf := ev.KubeProxy.SyncFailures
	if sf == nil || sf.Failed != 14 || !sf.NeverApplied || sf.Tool != "iptables-restore" || sf.Error != restoreError ||
		!sf.Since.Equal(now.Add(-7*time.Minute)) {
		t.Fatalf("sync failures evidence %+v", sf)
	}
	for _, want := range []string{
		"0 endpoints programmed, 70 in the API (70 missing) for 6m",
		"because kube-proxy cannot apply its rules: every sync since it started at 2025-03-04T02:53:00Z failed (14 iptables-restore runs)",
		`last error "exit status 4: Warning: Extension ipvs revision 0 not supported, missing kernel module?`,
		`the iptables-restore extension "ipvs" is not supported by this node's kernel: load its kernel module (for a match, modprobe xt_ipvs)`,
		"restarting kube-proxy does not help",
	} {
		if !strings.Contains(f.Summary, want) {
			t.Errorf("summary %q\nwant %q", f.Summary, want)
		}
	}
	if strings.Contains(f.Summary, "queued change") || strings.Contains(f.Summary, "restart kube-proxy on this node") {
		t.Errorf("summary %q: a failing restore is not a stuck kube-proxy, and a restart does not mend it", f.Summary)
	}
}

// A new node in nftables mode: kube-proxy's table is written by the transactions that fail, so
// no kube-proxy rules are found and nothing is compared; the failing syncs are critical alone.
func TestFailingSyncsWithNoRulesAtAll(t *testing.T) {
	in := healthyInput()
	in.Rules.Mode = "none"
	failingSyncs(&in, 5, true)
	k := &in.KubeProxy
	k.SyncTool = "nft"
	k.SyncError = "/dev/stdin:40:1-63: Error: Could not process rule: No such file or directory | add rule ip kube-proxy services jump proxyhealth-lab-missing"
	r := Evaluate(in)
	only(t, r, KubeProxySyncFailing)
	f := r.Findings[0]
	if r.Verdict != CriticalFound || f.Severity != Critical {
		t.Errorf("verdict %s, severity %s", r.Verdict, f.Severity)
	}
	for _, want := range []string{
		"kube-proxy cannot apply its rules: every sync since it started at 2025-03-04T02:53:00Z failed (5 nftables transactions)",
		"so this node has none of its Service rules",
		"fix what the error names",
		"restarting kube-proxy does not help",
	} {
		if !strings.Contains(f.Summary, want) {
			t.Errorf("summary %q\nwant %q", f.Summary, want)
		}
	}
	ev := f.Evidence.(*KubeProxyEvidence)
	if ev.SyncFailures == nil || ev.SyncFailures.Tool != "nft" || ev.ProxyMode != "none" {
		t.Errorf("evidence %+v", ev)
	}
}

// Mid-life: the rules were programmed, then every restore fails. Until the API moves on the
// frozen rules still hold the right endpoints: a warning, not kube_proxy_stuck. Once endpoints
// change, the stale rules are critical and say why.
func TestFailingSyncsMidLife(t *testing.T) {
	in := healthyInput()
	failingSyncs(&in, 1, false)
	r := Evaluate(in)
	only(t, r) // one failure: the retry may mend it
	if r.Verdict != Healthy {
		t.Errorf("verdict %s", r.Verdict)
	}

	failingSyncs(&in, 6, false)
	r = Evaluate(in)
	only(t, r, KubeProxySyncFailing)
	f := r.Findings[0]
	if f.Severity != Warning || r.Verdict != WarningsOnly {
		t.Errorf("severity %s, verdict %s", f.Severity, r.Verdict)
	}
	if want := "kube-proxy cannot apply its rules: 6 iptables-restore runs failed in a row since 2025-03-04T02:53:00Z"; !strings.HasPrefix(f.Summary, want) {
		t.Errorf("summary %q\nwant prefix %q", f.Summary, want)
	}
	if !strings.Contains(f.Summary, "no Service or endpoint change reaches this node's rules") {
		t.Errorf("summary %q", f.Summary)
	}

	in.Rules.Drifting = []DriftingPort{incident3Drift()}
	r = Evaluate(in)
	only(t, r, StaleRules)
	f = r.Findings[0]
	ev := f.Evidence.(*StaleRulesEvidence)
	if r.Verdict != CriticalFound || !slices.Equal(ev.ExplainedBy, []Cause{KubeProxySyncFailing}) ||
		ev.KubeProxy.SyncFailures.Failed != 6 || ev.KubeProxy.SyncFailures.NeverApplied {
		t.Errorf("verdict %s, explained by %v, evidence %+v", r.Verdict, ev.ExplainedBy, ev.KubeProxy.SyncFailures)
	}
	if !strings.Contains(f.Summary, "because kube-proxy cannot apply its rules: 6 iptables-restore runs failed in a row") {
		t.Errorf("summary %q", f.Summary)
	}

	// Its syncs apply again: the stuck queue and the drift are what is left to tell.
	in.KubeProxy.SyncFailing, in.KubeProxy.SyncFailures = false, 0
	r = Evaluate(in)
	ev = r.Findings[0].Evidence.(*StaleRulesEvidence)
	if !slices.Equal(ev.ExplainedBy, []Cause{KubeProxyStuck}) || ev.KubeProxy.SyncFailures != nil {
		t.Errorf("explained by %v, sync failures %+v", ev.ExplainedBy, ev.KubeProxy.SyncFailures)
	}
}

// IPVS mode: the sync programs the virtual servers and ipsets before the restore that fails, so
// they follow the API and the drift check finds nothing; only the iptables rules fail. A new
// node is critical (its chains are empty: what needs kube-proxy's masquerade fails), a node
// whose restores fail later is a warning (its rules, matches on the updated ipsets, still
// hold). Neither says the node has none of its Service rules, nor that no change reaches them.
func TestFailingSyncsIPVS(t *testing.T) {
	for _, c := range []struct {
		name         string
		neverApplied bool
		severity     Severity
		verdict      Verdict
		want         []string
	}{
		{"new node", true, Critical, CriticalFound, []string{
			"kube-proxy cannot apply its iptables rules: every sync since it started at 2025-03-04T02:53:00Z failed (14 iptables-restore runs)",
			"its IPVS virtual servers are programmed, but none of its iptables rules since it started; on a new or rebooted node its chains are empty and connections that need its masquerade fail",
			"from this node's own addresses (host-network Pods) to Services whose endpoints are on other nodes",
		}},
		{"mid-life", false, Warning, WarningsOnly, []string{
			"kube-proxy cannot apply its iptables rules: 14 iptables-restore runs failed in a row since 2025-03-04T02:53:00Z",
			"its IPVS virtual servers still follow Service and endpoint changes, but its iptables rules stay as they were",
			"deleted Services keep their virtual servers",
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			in := healthyInput()
			in.Rules.Mode = "ipvs"
			failingSyncs(&in, 14, c.neverApplied)
			r := Evaluate(in)
			only(t, r, KubeProxySyncFailing)
			f := r.Findings[0]
			if f.Severity != c.severity || r.Verdict != c.verdict {
				t.Errorf("severity %s, verdict %s; want %s, %s", f.Severity, r.Verdict, c.severity, c.verdict)
			}
			want := append(c.want, `last error "exit status 4: Warning: Extension ipvs revision 0 not supported, missing kernel module?`,
				"load its kernel module (for a match, modprobe xt_ipvs)", "restarting kube-proxy does not help")
			for _, w := range want {
				if !strings.Contains(f.Summary, w) {
					t.Errorf("summary %q\nwant %q", f.Summary, w)
				}
			}
			for _, not := range []string{"none of its Service rules", "no Service or endpoint change reaches", "queued change", "restart kube-proxy on this node"} {
				if strings.Contains(f.Summary, not) {
					t.Errorf("summary %q says %q", f.Summary, not)
				}
			}
			ev := f.Evidence.(*KubeProxyEvidence)
			if ev.ProxyMode != "ipvs" || ev.SyncFailures == nil || ev.SyncFailures.Tool != "iptables-restore" || ev.SyncFailures.NeverApplied != c.neverApplied {
				t.Errorf("evidence %+v, sync failures %+v", ev, ev.SyncFailures)
			}
		})
	}
}

// A dual-stack kube-proxy whose IPv4 (or IPv6) syncs fail while the other family's apply: the
// finding names the failing family, and the tool of an IPv6 proxier is ip6tables-restore.
func TestFailingSyncsOfOneIPFamily(t *testing.T) {
	for _, c := range []struct {
		mode     string
		families []string
		want     []string
	}{
		{"iptables", []string{"IPv4"}, []string{"kube-proxy cannot apply its IPv4 rules: 14 iptables-restore runs failed in a row", `the iptables-restore extension "ipvs"`}},
		{"ipvs", []string{"IPv4"}, []string{"kube-proxy cannot apply its IPv4 iptables rules: 14 iptables-restore runs failed in a row"}},
		{"iptables", []string{"IPv6"}, []string{"kube-proxy cannot apply its IPv6 rules: 14 ip6tables-restore runs failed in a row", `the ip6tables-restore extension "ipvs"`}},
		{"iptables", nil, []string{"kube-proxy cannot apply its rules: 14 iptables-restore runs failed in a row"}},
	} {
		in := healthyInput()
		in.Rules.Mode = c.mode
		failingSyncs(&in, 14, false)
		in.KubeProxy.SyncFailingFamilies = c.families
		r := Evaluate(in)
		only(t, r, KubeProxySyncFailing)
		f := r.Findings[0]
		for _, w := range c.want {
			if !strings.Contains(f.Summary, w) {
				t.Errorf("%s %v: summary %q\nwant %q", c.mode, c.families, f.Summary, w)
			}
		}
		if ev := f.Evidence.(*KubeProxyEvidence); !slices.Equal(ev.SyncFailures.IPFamilies, c.families) {
			t.Errorf("%s %v: evidence's IP families %v", c.mode, c.families, ev.SyncFailures.IPFamilies)
		}
	}
}

// Failing syncs and a failing watch are both told; a kube-proxy that does not answer has no
// failing syncs to tell.
func TestFailingSyncsWithOtherKubeProxyCauses(t *testing.T) {
	in := healthyInput()
	failingSyncs(&in, 3, false)
	in.KubeProxy.ListErrors = []ListErrorCount{{Resource: "endpointslices", Verb: "watch", Recent: 4, Total: 4}}
	in.Rules.Drifting = []DriftingPort{incident3Drift()}
	ev := Evaluate(in).Findings[0].Evidence.(*StaleRulesEvidence)
	if !slices.Equal(ev.ExplainedBy, []Cause{KubeProxySyncFailing, KubeProxyWatchFailing}) {
		t.Errorf("explained by %v", ev.ExplainedBy)
	}

	in = healthyInput()
	failingSyncs(&in, 3, false)
	in.KubeProxy.Up = false
	only(t, Evaluate(in), KubeProxyDown)
}

// The remedy follows the error; with no error read, it says where to find it.
func TestSyncRemedy(t *testing.T) {
	for _, c := range []struct{ tool, err, want string }{
		{"iptables-restore", restoreError, "modprobe xt_ipvs"},
		{"iptables-restore", "exit status 2: iptables-restore v1.8.9 (nf_tables): Couldn't load match `nfacct':No such file or directory | Error occurred at line: 32", "modprobe xt_nfacct"},
		{"iptables-restore", "exit status 4: Another app is currently holding the xtables lock. Stopped waiting after 5s.", "holds the xtables lock"},
		{"nft", `exec: "nft": executable file not found in $PATH`, "kube-proxy cannot run nft"},
		{"nft", "", `read the error in kube-proxy's log ("nftables sync failed")`},
		{"iptables-restore", "", `("Failed to execute iptables-restore")`},
		{"nft", "/dev/stdin:3:1-20: Error: Could not process rule: Operation not supported", "fix what the error names"},
	} {
		got := syncRemedy(c.tool, c.err)
		if !strings.Contains(got, c.want) {
			t.Errorf("syncRemedy(%q, %q) = %q, want %q in it", c.tool, c.err, got, c.want)
		}
		if strings.Contains(got, "restart kube-proxy") {
			t.Errorf("syncRemedy(%q, %q) = %q: a restart does not mend failing syncs", c.tool, c.err, got)
		}
	}
	// No log read: the evidence says why there is no error.
	in := healthyInput()
	failingSyncs(&in, 3, false)
	in.KubeProxy.SyncError, in.KubeProxy.SyncErrorAt, in.KubeProxy.LogFiles = "", time.Time{}, nil
	ev := Evaluate(in).Findings[0].Evidence.(*KubeProxyEvidence).SyncFailures
	if ev.Error != "" || !strings.Contains(ev.ErrorNotRead, "no kube-proxy log file found") {
		t.Errorf("evidence %+v", ev)
	}
}
