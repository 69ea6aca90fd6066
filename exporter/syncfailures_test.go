package exporter

import (
	"slices"
	"testing"
	"time"

	"github.com/proxyhealth/proxyhealth/collectors/kubeproxy"
	"github.com/proxyhealth/proxyhealth/internal/verdict"
)

// kube-proxy's failing syncs reach the verdict from the poller's run of failures, with the last
// error its log reported; a one-shot look shorter than kube-proxy's retry falls back on the
// log: a failure logged after its last applied sync.
func TestSyncFailuresInput(t *testing.T) {
	t0 := time.Date(2026, 11, 28, 9, 0, 0, 0, time.UTC)
	logged := kubeproxy.SyncError{At: t0.Add(-10 * time.Second), Tool: "iptables-restore", Text: "exit status 4: line 3: RULE_APPEND failed"}
	for _, c := range []struct {
		name string
		st   kubeproxy.Status
		scan *kubeproxy.LogScan
		want verdict.KubeProxyFacts
	}{
		{"healthy", kubeproxy.Status{LastSync: t0.Add(-time.Minute)}, nil, verdict.KubeProxyFacts{Up: true}},
		{"the poller's run, with the follower's last error",
			kubeproxy.Status{SyncFailures: 5, SyncTool: "iptables-restore", SyncFailing: true, FailingSyncs: 3, FailingSince: t0.Add(-time.Minute), LastSync: t0.Add(-2 * time.Minute), LastSyncError: logged},
			nil,
			verdict.KubeProxyFacts{Up: true, SyncFailing: true, SyncFailures: 3, SyncFailuresTotal: 5, SyncFailingSince: t0.Add(-time.Minute),
				SyncTool: "iptables-restore", SyncError: logged.Text, SyncErrorAt: logged.At}},
		{"the poller's run of one IP family, on a new node",
			kubeproxy.Status{SyncFailures: 2, SyncTool: "iptables-restore", SyncFailing: true, FailingSyncs: 2, FailingSince: t0.Add(-time.Minute),
				SyncNeverApplied: true, FailingFamilies: []string{"IPv4"}, LastSync: t0.Add(-2 * time.Minute), LastSyncError: logged},
			nil,
			verdict.KubeProxyFacts{Up: true, SyncFailing: true, SyncFailures: 2, SyncFailuresTotal: 2, SyncFailingSince: t0.Add(-time.Minute),
				SyncNeverApplied: true, SyncFailingFamilies: []string{"IPv4"}, SyncTool: "iptables-restore", SyncError: logged.Text, SyncErrorAt: logged.At}},
		{"a one-shot look: a failure logged after the last applied sync",
			kubeproxy.Status{SyncFailures: 5, SyncTool: "iptables-restore", LastSync: t0.Add(-time.Minute)},
			&kubeproxy.LogScan{LastSyncError: logged},
			verdict.KubeProxyFacts{Up: true, SyncFailing: true, SyncFailures: 1, SyncFailuresTotal: 5, SyncFailingSince: logged.At,
				SyncTool: "iptables-restore", SyncError: logged.Text, SyncErrorAt: logged.At}},
		{"a one-shot look: the failure logged was mended by a later sync",
			kubeproxy.Status{SyncFailures: 5, SyncTool: "iptables-restore", LastSync: t0},
			&kubeproxy.LogScan{LastSyncError: logged},
			verdict.KubeProxyFacts{Up: true, SyncFailuresTotal: 5, SyncTool: "iptables-restore"}},
	} {
		k := verdict.KubeProxyFacts{Up: true}
		syncFailuresInput(&k, c.st, inputOptions{logScan: c.scan})
		if k.SyncFailing != c.want.SyncFailing || k.SyncFailures != c.want.SyncFailures || k.SyncFailuresTotal != c.want.SyncFailuresTotal ||
			!k.SyncFailingSince.Equal(c.want.SyncFailingSince) || k.SyncTool != c.want.SyncTool || k.SyncError != c.want.SyncError ||
			!k.SyncErrorAt.Equal(c.want.SyncErrorAt) || k.SyncNeverApplied != c.want.SyncNeverApplied ||
			!slices.Equal(k.SyncFailingFamilies, c.want.SyncFailingFamilies) {
			t.Errorf("%s: got %+v\nwant %+v", c.name, k, c.want)
		}
	}
	// kube-proxy not answering: nothing is known of its syncs.
	k := verdict.KubeProxyFacts{}
	syncFailuresInput(&k, kubeproxy.Status{SyncFailures: 5, SyncFailing: true, FailingSyncs: 3}, inputOptions{})
	if k.SyncFailing || k.SyncFailuresTotal != 0 {
		t.Errorf("kube-proxy down: %+v", k)
	}
}
