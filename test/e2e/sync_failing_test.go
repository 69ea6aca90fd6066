//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/proxyhealth/proxyhealth/internal/testsupport/prereq"
	"github.com/proxyhealth/proxyhealth/internal/verdict"
)

const syncFailingExporterPort = 19879

// TestSyncFailing is kubernetes#142068 with the real kube-proxy: a rule it writes needs a
// kernel feature the node lacks, so every iptables-restore (or nftables transaction) fails;
// kube-proxy keeps running, retries every sync period and calls itself healthy. The lab puts a
// wrapper of the tool first on kube-proxy's PATH which, while the test says so, adds such a
// rule to what kube-proxy restores and hands it to the real tool, whose own error kube-proxy
// logs:
//
//   - iptables mode: `-A KUBE-SERVICES -m ipvs --vdir ORIGINAL -j RETURN` in the nat table; this
//     kernel has no IPVS, so xt_ipvs is the kernel match module the node lacks;
//   - nftables mode: `ct helper set "proxyhealth-lab"`, a ct helper the kernel does not have:
//     the transaction fails whole.
//
// Both cases of the issue, in one lab per mode: a new node whose every restore fails from
// kube-proxy's start (no Service rules at all), then, once healed and programmed, a node whose
// restores start failing mid-life while the API moves on. In each the verdict is critical,
// names kube_proxy_sync_failing with the count and the error from kube-proxy's log, gives a
// remedy that is not a restart, and clears once the tool stops failing, with no restart.
func TestSyncFailing(t *testing.T) {
	requireKube(t)
	requireExporter(t)
	for _, mode := range []string{"iptables", "nftables"} {
		t.Run(mode, func(t *testing.T) { testSyncFailing(t, mode) })
	}
}

// syncFault is the wrapper of kube-proxy's restore tool: it fails kube-proxy's rule syncs while
// its flag file exists.
type syncFault struct {
	dir, flag string
}

func newSyncFault(t *testing.T, dir, mode string) *syncFault {
	t.Helper()
	f := &syncFault{dir: filepath.Join(dir, "tools-first"), flag: filepath.Join(dir, "fail-syncs")}
	if err := os.MkdirAll(f.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	var name, script string
	switch mode {
	case "iptables":
		name = "iptables-restore"
		real, err := exec.LookPath(name)
		if err != nil {
			prereq.Skipf(t, "iptables-restore not found (apt-get install -y iptables): %v", err)
		}
		// A restore of kube-proxy's rules writes KUBE-SERVICES in its nat table; add the rule
		// the kernel cannot take before that table's COMMIT.
		script = fmt.Sprintf(`#!/bin/sh
if [ -e %[1]q ]; then
	awk '/^\*nat$/ { nat = 1 } nat && /^COMMIT$/ { print "-A KUBE-SERVICES -m ipvs --vdir ORIGINAL -j RETURN"; nat = 0 } { print }' | %[2]q "$@"
	exit $?
fi
exec %[2]q "$@"
`, f.flag, real)
	case "nftables":
		name = "nft"
		real, err := exec.LookPath(name)
		if err != nil {
			prereq.Skipf(t, "nft not found (apt-get install -y nftables): %v", err)
		}
		// knftables runs each transaction as "nft -f -" (and "nft --check -f -" to probe).
		script = fmt.Sprintf(`#!/bin/sh
if [ -e %[1]q ] && [ "$1" = "-f" ] && [ "$2" = "-" ]; then
	awk '{ print } / ip kube-proxy / { kp = 1 } END { if (kp) print "add rule ip kube-proxy services ct helper set \"proxyhealth-lab\"" }' | %[2]q "$@"
	exit $?
fi
exec %[2]q "$@"
`, f.flag, real)
	}
	if err := os.WriteFile(filepath.Join(f.dir, name), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return f
}

// fail makes kube-proxy's syncs fail from now on, or apply again.
func (f *syncFault) fail(t *testing.T, on bool) {
	t.Helper()
	if !on {
		if err := os.Remove(f.flag); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		return
	}
	if err := os.WriteFile(f.flag, nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

// syncFailingReport is /status as far as this test reads it.
type syncFailingReport struct {
	Verdict  string `json:"verdict"`
	Findings []struct {
		Cause    string           `json:"cause"`
		Severity string           `json:"severity"`
		Service  *verdict.Service `json:"service"`
		Summary  string           `json:"summary"`
		Evidence struct {
			MissingCount int      `json:"missing_count"`
			StaleCount   int      `json:"stale_count"`
			ExplainedBy  []string `json:"explained_by"`
			// KubeProxy is stale_rules' kube-proxy side; SyncFailures is also
			// kube_proxy_sync_failing's own evidence, at the top.
			KubeProxy *struct {
				SyncFailures *verdict.SyncFailuresEvidence `json:"sync_failures"`
			} `json:"kube_proxy"`
			SyncFailures *verdict.SyncFailuresEvidence `json:"sync_failures"`
		} `json:"evidence"`
		Runbook string `json:"runbook"`
	} `json:"findings"`
	raw string
}

func (e *Exporter) syncFailingStatus(t *testing.T) syncFailingReport {
	t.Helper()
	r, err := e.trySyncFailingStatus()
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// waitForSyncFailingStatus polls /status until done holds for it and returns that report. On
// a loaded machine (a TCG guest beside other work) one request can time out, which is a reason
// to poll again, not to fail.
func (e *Exporter) waitForSyncFailingStatus(t *testing.T, timeout time.Duration, what string, done func(syncFailingReport) bool) syncFailingReport {
	t.Helper()
	var r syncFailingReport
	waitFor(t, timeout, what, func() (bool, string) {
		got, err := e.trySyncFailingStatus()
		if err != nil {
			return false, err.Error()
		}
		r = got
		return done(r), r.raw
	})
	return r
}

// trySyncFailingStatus is syncFailingStatus for a polling loop: on a loaded machine (a TCG
// guest beside other work) one request can time out, which is a reason to poll again, not to
// fail.
func (e *Exporter) trySyncFailingStatus() (syncFailingReport, error) {
	body, err := e.l.Get(e.l.Node, strings.TrimSuffix(e.URL, "/metrics")+"/status")
	if err != nil {
		return syncFailingReport{}, fmt.Errorf("GET /status: %w", err)
	}
	var r syncFailingReport
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		return syncFailingReport{}, fmt.Errorf("/status: %w\n%s", err, body)
	}
	r.raw = body
	return r, nil
}

// syncFailures is the failing syncs the finding tells: its own evidence, or stale_rules'
// kube-proxy side.
func (r syncFailingReport) syncFailures(i int) *verdict.SyncFailuresEvidence {
	ev := r.Findings[i].Evidence
	if ev.SyncFailures != nil {
		return ev.SyncFailures
	}
	if ev.KubeProxy != nil {
		return ev.KubeProxy.SyncFailures
	}
	return nil
}

func testSyncFailing(t *testing.T, mode string) {
	l := newLabRules(t, labRawRules)
	cp := StartControlPlane(t, l, ControlPlaneOptions{NoKubeProxy: true})
	fault := newSyncFault(t, cp.Dir, mode)
	kubeconfig := cp.readOnlyKubeconfig("proxyhealth.kubeconfig", apiserverAddr)
	cp.grantNodeConditions()

	// The node: kube-dns with 70 endpoints, on a node whose every restore fails.
	const ns, name = "lab", "dns"
	cp.CreateService(httpService(ns, name, "10.96.0.80", nil))
	eps, _ := remoteEndpoints(5, 1, 70)
	cp.ApplySlice(EndpointSlice(ns, name, name+"-1", httpSlicePorts, eps))
	fault.fail(t, true)
	const syncPeriod = 5 * time.Second
	started := time.Now()
	cp.StartKubeProxy(KubeProxyOptions{Mode: mode, ToolsFirst: fault.dir, NoWaitFirstSync: true,
		ExtraArgs: []string{"--iptables-sync-period=" + syncPeriod.String()}})
	e := l.StartExporter("proxyhealth", syncFailingExporterPort, nil,
		append(driftExporterArgs(kubeconfig), append(kubeProxyExporterArgs(cp), "--status.window=1m", "--node-conditions")...)...)

	wantTool, wantError := "iptables-restore", "Extension ipvs revision 0 not supported, missing kernel module?"
	wantRemedy := `the iptables-restore extension "ipvs" is not supported by this node's kernel: load its kernel module (for a match, modprobe xt_ipvs)`
	if mode == "nftables" {
		wantTool, wantError = "nft", "Error: Could not process rule: No such file or directory"
		wantRemedy = "fix what the error names"
	}
	checkFailing := func(what string, r syncFailingReport, i int, neverApplied bool) *verdict.SyncFailuresEvidence {
		t.Helper()
		f := r.Findings[i]
		sf := r.syncFailures(i)
		if r.Verdict != "critical" || f.Severity != "critical" || sf == nil {
			t.Errorf("%s: verdict %s, finding %s %s, sync failures %+v:\n%s", what, r.Verdict, f.Severity, f.Cause, sf, r.raw)
			return nil
		}
		if sf.Tool != wantTool || !strings.Contains(sf.Error, wantError) || sf.NeverApplied != neverApplied ||
			sf.Failed < 1 || sf.Total < sf.Failed || sf.Since.IsZero() || !strings.Contains(sf.Remedy, wantRemedy) {
			t.Errorf("%s: sync failures %+v", what, sf)
		}
		// The lab is single-stack (IPv6 off in the node's namespace), so no family is named.
		if len(sf.IPFamilies) > 0 {
			t.Errorf("%s: failing IP families %v named on a single-stack node", what, sf.IPFamilies)
		}
		for _, want := range []string{"kube-proxy cannot apply its rules: ", wantError, wantRemedy, "restarting kube-proxy does not help"} {
			if !strings.Contains(f.Summary, want) {
				t.Errorf("%s: summary %q\nwant %q in it", what, f.Summary, want)
			}
		}
		for _, not := range []string{"queued change", "restart kube-proxy on this node"} {
			if strings.Contains(f.Summary, not) {
				t.Errorf("%s: summary %q says %q", what, f.Summary, not)
			}
		}
		return sf
	}

	// The new node: no Service rules at all. In iptables mode kube-proxy's base chains are
	// there (it creates them with iptables, not the restore) and the drift check finds all 70
	// endpoints missing; in nftables mode its table is never written and nothing is compared.
	r := e.waitForSyncFailingStatus(t, 90*time.Second, "/status critical with failing syncs named", func(r syncFailingReport) bool {
		if r.Verdict != "critical" || len(r.Findings) == 0 {
			return false
		}
		switch mode {
		case "iptables":
			f := r.Findings[0]
			return f.Cause == "stale_rules" && f.Evidence.MissingCount == 70 && slices.Equal(f.Evidence.ExplainedBy, []string{"kube_proxy_sync_failing"}) &&
				r.syncFailures(0) != nil && r.syncFailures(0).Error != ""
		default:
			return r.Findings[0].Cause == "kube_proxy_sync_failing" && r.syncFailures(0).Error != ""
		}
	})
	sf := checkFailing("new node", r, 0, true)
	if mode == "nftables" && !strings.Contains(r.Findings[0].Summary, "so this node has none of its Service rules") {
		t.Errorf("new node: summary %q", r.Findings[0].Summary)
	}
	t.Logf("new node: critical %s after kube-proxy started; %s: %s", time.Since(started).Round(time.Second), r.Findings[0].Cause, r.Findings[0].Summary)
	if sf != nil {
		t.Logf("new node: %d failed in a row (kube-proxy's total %d) since %s; error %q", sf.Failed, sf.Total, sf.Since.Format(time.RFC3339), sf.Error)
	}
	// kube-proxy's own verdict meanwhile: healthy.
	for _, path := range []string{"/livez", "/healthz"} {
		code, body, err := cp.KubeProxyGet(kubeProxyHealthz, path)
		t.Logf("kube-proxy %s while every sync fails: %d %v %s", path, code, err, strings.TrimSpace(body))
	}
	s := e.Scrape(t)
	t.Logf("new node: proxyhealth_kubeproxy_sync_failures_total %g, proxyhealth_kubeproxy_sync_failing_seconds %g",
		s.Sum("proxyhealth_kubeproxy_sync_failures_total", nil), s.Sum("proxyhealth_kubeproxy_sync_failing_seconds", nil))
	if s.Sum("proxyhealth_kubeproxy_sync_failing_seconds", nil) <= 0 {
		t.Errorf("proxyhealth_kubeproxy_sync_failing_seconds is 0 while every sync fails")
	}
	// The Node condition says the same, and in nftables mode (one finding) the landing page.
	wantReason := map[string]string{"iptables": "StaleRules", "nftables": "KubeProxySyncFailing"}[mode]
	waitFor(t, 30*time.Second, "node condition ProxyHealthy=False, reason "+wantReason, func() (bool, string) {
		c := cp.nodeCondition()
		return c != nil && c.Status == corev1.ConditionFalse && c.Reason == wantReason &&
			strings.Contains(c.Message, "kube-proxy cannot apply its rules"), describeCondition(c)
	})
	t.Logf("new node: node condition %s", describeCondition(cp.nodeCondition()))
	if mode == "nftables" {
		checkLandingPage(t, e, "sync_failing_new_node_nftables", "critical", findingWant{
			Severity: "critical", Cause: "kube_proxy_sync_failing",
			Summary:  []string{"kube-proxy cannot apply its rules: every sync since it started", "so this node has none of its Service rules"},
			Evidence: map[string]string{"sync_failures.tool": "nft", "sync_failures.never_applied": "true"},
			Runbook:  "docs/runbooks.md#proxyhealthkubeproxysyncfailing",
		})
	}
	dr, code, stderr := diagnose(t, cp, kubeconfig)
	if code != 2 || dr.Verdict != "critical" {
		t.Errorf("diagnose on the new node: exit %d, verdict %s\n%s\n%s", code, dr.Verdict, dr.raw, stderr)
	} else {
		t.Logf("diagnose on the new node: exit %d, causes %v", code, dr.causes())
	}

	// The cause mended (the module loaded). kube-proxy retries a failed sync every sync period,
	// except its first (a direct call whose error is dropped): that one is tried again only at
	// the next Service or endpoint change, or the hourly full sync. A change comes: a Service
	// is added. Its rules apply with no restart, and the verdict clears.
	fault.fail(t, false)
	mended := time.Now()
	cp.CreateService(httpService(ns, "added", "10.96.0.81", nil))
	waitFor(t, 60*time.Second, "/status healthy once the restore applies", func() (bool, string) {
		r := e.syncFailingStatus(t)
		return r.Verdict == "healthy", r.raw
	})
	t.Logf("new node mended: healthy %s after the tool stopped failing", time.Since(mended).Round(time.Millisecond))
	if s := e.Scrape(t); s.Sum("proxyhealth_kubeproxy_sync_failing_seconds", nil) != 0 {
		t.Errorf("proxyhealth_kubeproxy_sync_failing_seconds %g once syncs apply", s.Sum("proxyhealth_kubeproxy_sync_failing_seconds", nil))
	}

	// Mid-life: the rules are programmed, then every restore fails while the API moves on.
	fault.fail(t, true)
	failing := time.Now()
	newEps, _ := remoteEndpoints(5, 6, 73) // 1..5 deleted, 71..73 added
	cp.ApplySlice(EndpointSlice(ns, name, name+"-1", httpSlicePorts, newEps))
	r = e.waitForSyncFailingStatus(t, 90*time.Second, "/status: stale_rules explained by kube_proxy_sync_failing", func(r syncFailingReport) bool {
		return r.Verdict == "critical" && len(r.Findings) == 1 && r.Findings[0].Cause == "stale_rules" &&
			slices.Equal(r.Findings[0].Evidence.ExplainedBy, []string{"kube_proxy_sync_failing"}) &&
			// kube-proxy retries every sync period: the count grows.
			r.syncFailures(0) != nil && r.syncFailures(0).Error != "" && r.syncFailures(0).Failed >= 3
	})
	f := r.Findings[0]
	if f.Evidence.MissingCount != 3 || f.Evidence.StaleCount != 5 || !strings.Contains(f.Summary, "70 endpoints programmed, 68 in the API (3 missing, 5 stale)") {
		t.Errorf("mid-life: finding %+v", f)
	}
	sf = checkFailing("mid-life", r, 0, false)
	t.Logf("mid-life: critical %s after the restores started failing: %s", time.Since(failing).Round(time.Second), f.Summary)
	if sf != nil {
		t.Logf("mid-life: %d failed in a row (kube-proxy's total %d) since %s", sf.Failed, sf.Total, sf.Since.Format(time.RFC3339))
	}

	fault.fail(t, false)
	mended = time.Now()
	waitFor(t, 60*time.Second, "/status healthy once the restore applies", func() (bool, string) {
		r := e.syncFailingStatus(t)
		return r.Verdict == "healthy", r.raw
	})
	t.Logf("mid-life mended: healthy %s after the tool stopped failing", time.Since(mended).Round(time.Millisecond))
	if !t.Failed() {
		return
	}
	t.Logf("kube-proxy's failed syncs as logged:\n%s", lastLines(grepLines(cp.KubeProxyLog(), "Failed to execute iptables-restore", "nftables sync failed", "\t", " > "), 20))
}
