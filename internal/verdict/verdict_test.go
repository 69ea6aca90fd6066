package verdict

import (
	"bufio"
	"cmp"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"
)

var now = time.Date(2025, 3, 4, 3, 0, 0, 0, time.UTC)

var (
	dnsTCP = Service{Namespace: "kube-system", Name: "kube-dns", Port: 53, Protocol: "tcp", PortName: "dns-tcp"}
	dnsUDP = Service{Namespace: "kube-system", Name: "kube-dns", Port: 53, Protocol: "udp", PortName: "dns"}
	web    = Service{Namespace: "default", Name: "web", Port: 80, Protocol: "tcp"}
	api    = Service{Namespace: "default", Name: "api", Port: 8080, Protocol: "tcp"}
)

// healthyInput is a node where everything was read and nothing is wrong.
func healthyInput() Input {
	return Input{
		Node:   "worker-3",
		Now:    now,
		Window: 10 * time.Minute,
		API:    APIFacts{Configured: true, Fresh: true, LastHeard: now.Add(-5 * time.Second)},
		Rules:  RulesFacts{Checked: true, Mode: "iptables", ServicesChecked: 40, GracePeriod: time.Minute},
		KubeProxy: KubeProxyFacts{Checked: true, Up: true, Healthy: Bool(true), LastSync: now.Add(-30 * time.Second),
			LogFiles: []string{"/var/log/pods/kube-system_kube-proxy-abcde_1/kube-proxy/0.log"}, ListErrorsSpan: 10 * time.Minute},
		Kernel:    KernelFacts{BridgeNFCallIptables: Int(1), TCPBeLiberal: Int(0), ConntrackEvents: Int(2), InvalidDropRule: Bool(true)},
		Conntrack: ConntrackFacts{Entries: 1000, Limit: 262144},
	}
}

// incident3 is the seed incident: kube-dns's TCP port with 65 of 77 endpoints programmed.
func incident3Drift() DriftingPort {
	d := DriftingPort{Service: dnsTCP, StaleCount: 5, MissingCount: 12, Programmed: 65, Expected: 77, Since: now.Add(-14 * time.Minute)}
	for i := range 5 {
		d.Stale = append(d.Stale, fmt.Sprintf("10.244.1.%d:53", i+1))
	}
	for i := range 12 {
		d.Missing = append(d.Missing, fmt.Sprintf("10.244.2.%d:53", i+1))
	}
	return d
}

func causes(r Report) []Cause {
	out := make([]Cause, 0, len(r.Findings))
	for _, f := range r.Findings {
		out = append(out, f.Cause)
	}
	return out
}

func notChecked(r Report) map[Cause]string {
	out := map[Cause]string{}
	for _, n := range r.NotChecked {
		for _, c := range n.Causes {
			out[c] = n.Reason
		}
	}
	return out
}

func only(t *testing.T, r Report, want ...Cause) {
	t.Helper()
	if got := causes(r); !slices.Equal(got, want) {
		for _, f := range r.Findings {
			t.Logf("finding: %s %s", f.Cause, f.Summary)
		}
		t.Fatalf("findings %v, want %v", got, want)
	}
}

func TestHealthy(t *testing.T) {
	r := Evaluate(healthyInput())
	only(t, r)
	if r.Verdict != Healthy || len(r.NotChecked) != 0 || r.Node != "worker-3" || r.WindowSeconds != 600 || !r.Time.Equal(now) {
		t.Errorf("report %+v", r)
	}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"findings":[]`) || !strings.Contains(string(b), `"not_checked":[]`) {
		t.Errorf("empty lists must be [] in JSON: %s", b)
	}
}

// Incident 3 as the issue tells it: one finding, stale_rules, with the addresses and kube-proxy's
// watch failure as its explanation. One failure is enough to explain (a black-holed connection
// logs one per informer, then nothing) though not enough for a finding of its own.
func TestStaleRulesIncident3(t *testing.T) {
	in := healthyInput()
	in.Rules.Drifting = []DriftingPort{incident3Drift()}
	in.KubeProxy.ListErrors = []ListErrorCount{{Resource: "endpointslices", Verb: "watch", Recent: 1, Total: 1}}
	in.KubeProxy.LastListError = time.Date(2025, 3, 4, 2, 41, 7, 0, time.UTC)
	r := Evaluate(in)
	only(t, r, StaleRules)
	if r.Verdict != CriticalFound {
		t.Errorf("verdict %s, want critical", r.Verdict)
	}
	f := r.Findings[0]
	if f.Severity != Critical || f.Service == nil || *f.Service != dnsTCP {
		t.Errorf("finding %+v", f)
	}
	for _, want := range []string{
		"kube-system/kube-dns:dns-tcp (53/tcp)",
		"65 endpoints programmed, 77 in the API (12 missing, 5 stale) for 14m",
		"because kube-proxy's list/watch of the API failed (endpointslices watch 1; last at 2025-03-04T02:41:07Z)",
		"restart kube-proxy on this node",
	} {
		if !strings.Contains(f.Summary, want) {
			t.Errorf("summary %q lacks %q", f.Summary, want)
		}
	}
	ev := f.Evidence.(*StaleRulesEvidence)
	if ev.Programmed != 65 || ev.Expected != 77 || ev.MissingCount != 12 || ev.StaleCount != 5 ||
		len(ev.Missing) != 12 || ev.Missing[0] != "10.244.2.1:53" || len(ev.Stale) != 5 || ev.Stale[4] != "10.244.1.5:53" {
		t.Errorf("evidence counts and addresses: %+v", ev)
	}
	if !slices.Equal(ev.ExplainedBy, []Cause{KubeProxyWatchFailing}) || ev.KubeProxy == nil ||
		!ev.KubeProxy.LastListError.Equal(in.KubeProxy.LastListError) || len(ev.KubeProxy.ListErrors) != 1 ||
		!ev.KubeProxy.LastSync.Equal(now.Add(-30*time.Second)) || ev.ProxyMode != "iptables" || ev.GracePeriodSeconds != 60 {
		t.Errorf("evidence explanation: %+v, kube-proxy %+v", ev, ev.KubeProxy)
	}
	if f.Runbook != RunbookBase+"#proxyhealthkubeproxyrulesstale" {
		t.Errorf("runbook %s", f.Runbook)
	}
}

// kube_proxy_watch_failing on its own is a warning; with stale rules it is told in each
// stale_rules finding, never as a finding of its own.
func TestStaleRulesTellWatchFailuresOnce(t *testing.T) {
	in := healthyInput()
	in.KubeProxy.ListErrors = []ListErrorCount{
		{Resource: "endpointslices", Verb: "watch", Recent: 4, Total: 9},
		{Resource: "services", Verb: "list", Recent: 3, Total: 3},
	}
	in.KubeProxy.LastListError = now.Add(-time.Minute)
	r := Evaluate(in)
	only(t, r, KubeProxyWatchFailing)
	if r.Verdict != WarningsOnly || r.Findings[0].Severity != Warning || r.Findings[0].Service != nil {
		t.Errorf("verdict %s, finding %+v", r.Verdict, r.Findings[0])
	}
	if s := r.Findings[0].Summary; !strings.Contains(s, "7 times in the last 10m (endpointslices watch 4, services list 3)") {
		t.Errorf("summary %q", s)
	}

	other := DriftingPort{Service: web, MissingCount: 1, Missing: []string{"10.244.3.9:8080"}, Programmed: 2, Expected: 3, Since: now.Add(-5 * time.Minute)}
	in.Rules.Drifting = []DriftingPort{incident3Drift(), other}
	r = Evaluate(in)
	only(t, r, StaleRules, StaleRules)
	for i, f := range r.Findings {
		ev := f.Evidence.(*StaleRulesEvidence)
		if !slices.Equal(ev.ExplainedBy, []Cause{KubeProxyWatchFailing}) || len(ev.KubeProxy.ListErrors) != 2 {
			t.Errorf("finding %d: explained by %v, list errors %v", i, ev.ExplainedBy, ev.KubeProxy.ListErrors)
		}
	}
	if *r.Findings[0].Service != dnsTCP || *r.Findings[1].Service != web {
		t.Errorf("order %v, %v: want the drift engine's order (most differing first)", r.Findings[0].Service, r.Findings[1].Service)
	}
	if s := r.Findings[1].Summary; !strings.Contains(s, "(1 missing)") {
		t.Errorf("summary %q", s)
	}
}

func TestStaleRulesExplainedByStuckOrDownKubeProxy(t *testing.T) {
	in := healthyInput()
	in.Rules.Drifting = []DriftingPort{incident3Drift()}
	in.KubeProxy.SyncPending = 5 * time.Minute
	r := Evaluate(in)
	only(t, r, StaleRules)
	ev := r.Findings[0].Evidence.(*StaleRulesEvidence)
	if !slices.Equal(ev.ExplainedBy, []Cause{KubeProxyStuck}) || ev.KubeProxy.SyncPendingSeconds != 300 ||
		!strings.Contains(r.Findings[0].Summary, "because kube-proxy has left a queued change unapplied for 5m") {
		t.Errorf("stuck: %v %q", ev.ExplainedBy, r.Findings[0].Summary)
	}

	in = healthyInput()
	in.Rules.Drifting = []DriftingPort{incident3Drift()}
	in.KubeProxy.Up, in.KubeProxy.DownReason = false, "connection refused"
	r = Evaluate(in)
	only(t, r, StaleRules)
	ev = r.Findings[0].Evidence.(*StaleRulesEvidence)
	if !slices.Equal(ev.ExplainedBy, []Cause{KubeProxyDown}) || ev.KubeProxy.Up || ev.KubeProxy.DownReason != "connection refused" ||
		!strings.Contains(r.Findings[0].Summary, "because kube-proxy does not answer") {
		t.Errorf("down: %v %+v %q", ev.ExplainedBy, ev.KubeProxy, r.Findings[0].Summary)
	}
}

func TestStaleRulesWithNoKnownExplanation(t *testing.T) {
	in := healthyInput()
	in.Rules.Drifting = []DriftingPort{incident3Drift()}
	r := Evaluate(in)
	only(t, r, StaleRules)
	ev := r.Findings[0].Evidence.(*StaleRulesEvidence)
	if len(ev.ExplainedBy) != 0 || ev.ExplainedBy == nil || !strings.Contains(r.Findings[0].Summary, "with no failure seen in kube-proxy's log or metrics") {
		t.Errorf("explained by %#v, summary %q", ev.ExplainedBy, r.Findings[0].Summary)
	}
}

// An endpoint missing from the local chain alone (the cluster chain still holds it) is told as
// such: the summary says which chain, and the evidence names the chain of each address.
func TestStaleRulesNameTheChain(t *testing.T) {
	in := healthyInput()
	web := Service{Namespace: "shop", Name: "web", Port: 80, Protocol: "tcp", PortName: "http"}
	in.Rules.Drifting = []DriftingPort{{Service: web, MissingCount: 1, Missing: []string{"10.244.1.4:8080"}, MissingFrom: []string{"local"},
		Programmed: 2, Expected: 2, Since: now.Add(-5 * time.Minute)}}
	r := Evaluate(in)
	only(t, r, StaleRules)
	ev := r.Findings[0].Evidence.(*StaleRulesEvidence)
	if !strings.Contains(r.Findings[0].Summary, "(1 missing from the local chain)") || strings.Join(ev.MissingFrom, ",") != "local" {
		t.Errorf("summary %q, missing from %v", r.Findings[0].Summary, ev.MissingFrom)
	}
	// Missing from both chains: the counts alone.
	in.Rules.Drifting[0].MissingFrom = []string{"cluster+local"}
	if r := Evaluate(in); !strings.Contains(r.Findings[0].Summary, "(1 missing) for") {
		t.Errorf("summary %q", r.Findings[0].Summary)
	}
}

// A stale port's unreplied flows are its effect: told in its evidence, not as unreplied_flows.
// Another service's unexplained flows are unreplied_flows.
func TestStaleRulesExplainTheirUnrepliedFlows(t *testing.T) {
	in := healthyInput()
	in.Rules.Drifting = []DriftingPort{incident3Drift()}
	in.Conntrack.Unreplied = []UnrepliedCount{
		{Service: Service{Namespace: "kube-system", Name: "kube-dns", Port: 53, Protocol: "tcp"}, Reason: ReasonRemoteEndpoint, Ended: 9, Open: 1},
		{Service: Service{Namespace: "kube-system", Name: "kube-dns", Port: 53, Protocol: "tcp"}, Reason: ReasonLocalEndpoint, Ended: 2},
		{Service: web, Reason: ReasonRemoteEndpoint, Ended: 4},
	}
	r := Evaluate(in)
	only(t, r, StaleRules, UnrepliedFlows)
	ev := r.Findings[0].Evidence.(*StaleRulesEvidence)
	if ev.UnrepliedFlows == nil || ev.UnrepliedFlows.Ended != 11 || ev.UnrepliedFlows.Open != 1 || len(ev.UnrepliedFlows.ByReason) != 2 ||
		!slices.Equal(ev.Explains, []Cause{UnrepliedFlows}) {
		t.Errorf("stale rules' flows: %+v explains %v", ev.UnrepliedFlows, ev.Explains)
	}
	if f := r.Findings[1]; *f.Service != web || f.Evidence.(*FlowsEvidence).Ended != 4 {
		t.Errorf("unreplied finding %+v", f)
	}
}

// Drift is judged only with a fresh API view: a stale view is its own warning, and stale rules
// are then not checked rather than absent.
func TestStaleRulesNeedAFreshView(t *testing.T) {
	in := healthyInput()
	in.Rules.Drifting = []DriftingPort{incident3Drift()}
	in.API.Fresh, in.API.Err = false, "GET /version: context deadline exceeded"
	in.API.LastHeard = now.Add(-3 * time.Minute)
	r := Evaluate(in)
	only(t, r, APIViewStale)
	f := r.Findings[0]
	if f.Severity != Warning || !strings.Contains(f.Summary, "last heard from the API server at 2025-03-04T02:57:00Z: GET /version: context deadline exceeded") {
		t.Errorf("finding %+v", f)
	}
	if ev := f.Evidence.(*APIEvidence); ev.Fresh || ev.Error == "" || !ev.LastHeard.Equal(in.API.LastHeard) {
		t.Errorf("evidence %+v", ev)
	}
	if _, ok := notChecked(r)[StaleRules]; !ok {
		t.Errorf("not checked %v, want stale_rules", r.NotChecked)
	}
	// The warning is not the whole story: the stale rules it hides may be there.
	if r.Verdict != Unknown {
		t.Errorf("verdict %s, want unknown", r.Verdict)
	}

	// A plain host: nothing found, but the rules not compared with anything.
	in.API = APIFacts{Configured: false}
	r = Evaluate(in)
	only(t, r)
	if reason := notChecked(r)[StaleRules]; !strings.Contains(reason, "no Kubernetes API is configured") {
		t.Errorf("not checked %v", r.NotChecked)
	}
	if r.Verdict != Unknown {
		t.Errorf("verdict %s with stale_rules not checked, want unknown", r.Verdict)
	}
}

func TestStaleRulesNotCheckable(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(*RulesFacts)
		reason string
	}{
		{"ipvs unreadable", func(r *RulesFacts) {
			r.Checked, r.Mode, r.Err = false, "ipvs", "read kube-proxy's rules: the kernel has no IPVS (ip_vs is not loaded)"
		}, "ip_vs is not loaded"},
		{"unreadable", func(r *RulesFacts) {
			r.Checked, r.Mode, r.Err = false, "", "read kube-proxy's rules: operation not permitted"
		}, "operation not permitted"},
		{"not yet", func(r *RulesFacts) { r.Checked = false }, "not been compared"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := healthyInput()
			tc.change(&in.Rules)
			r := Evaluate(in)
			if reason := notChecked(r)[StaleRules]; !strings.Contains(reason, tc.reason) {
				t.Errorf("not checked %v, want stale_rules: %s", r.NotChecked, tc.reason)
			}
		})
	}
}

func TestKubeProxyWatchFailingThreshold(t *testing.T) {
	in := healthyInput()
	in.KubeProxy.ListErrors = []ListErrorCount{{Resource: "services", Verb: "watch", Recent: 2, Total: 20}}
	only(t, Evaluate(in))
	in.KubeProxy.ListErrors[0].Recent = 3
	only(t, Evaluate(in), KubeProxyWatchFailing)
}

// kube-proxy and the exporter both fail to hear from the API: one story (the node's path to
// the API server), told once in kube_proxy_watch_failing.
func TestWatchFailingAndStaleViewAreOneStory(t *testing.T) {
	in := healthyInput()
	in.KubeProxy.ListErrors = []ListErrorCount{{Resource: "endpointslices", Verb: "list", Recent: 5, Total: 5}}
	in.API.Fresh, in.API.Err = false, "dial tcp 10.0.0.1:443: i/o timeout"
	r := Evaluate(in)
	only(t, r, KubeProxyWatchFailing)
	ev := r.Findings[0].Evidence.(*KubeProxyEvidence)
	if ev.APIView == nil || ev.APIView.Error != in.API.Err || !slices.Equal(ev.Explains, []Cause{APIViewStale}) ||
		!strings.Contains(r.Findings[0].Summary, "the node's path to the API server is the likely cause") {
		t.Errorf("evidence %+v, summary %q", ev, r.Findings[0].Summary)
	}
	if _, ok := notChecked(r)[StaleRules]; !ok {
		t.Errorf("stale rules cannot be checked with a stale view: %v", r.NotChecked)
	}
}

func TestKubeProxyStuck(t *testing.T) {
	in := healthyInput()
	in.KubeProxy.SyncPending = time.Minute
	only(t, Evaluate(in))
	in.KubeProxy.SyncPending = 3 * time.Minute
	r := Evaluate(in)
	only(t, r, KubeProxyStuck)
	if s := r.Findings[0].Summary; !strings.Contains(s, "queued for 3m") || !strings.Contains(s, "last sync was at 2025-03-04T02:59:30Z") {
		t.Errorf("summary %q", s)
	}
	// Not answering: nothing is known of its syncs.
	in.KubeProxy.Up = false
	in.Rules.Mode = "none"
	only(t, Evaluate(in))
}

func TestKubeProxyDown(t *testing.T) {
	in := healthyInput()
	in.KubeProxy.Up, in.KubeProxy.DownReason = false, "dial tcp 127.0.0.1:10249: connect: connection refused"
	r := Evaluate(in)
	only(t, r, KubeProxyDown)
	ev := r.Findings[0].Evidence.(*KubeProxyEvidence)
	if ev.ProxyMode != "iptables" || ev.DownReason == "" || !strings.Contains(r.Findings[0].Summary, "has not answered for 10m") {
		t.Errorf("evidence %+v, summary %q", ev, r.Findings[0].Summary)
	}
	in.KubeProxy.DownFor = 25 * time.Minute
	if s := Evaluate(in).Findings[0].Summary; !strings.Contains(s, "has not answered for 25m") {
		t.Errorf("summary %q", s)
	}
	// No kube-proxy rules: no kube-proxy on this node, nothing to say.
	in.Rules.Mode = "none"
	only(t, Evaluate(in))
	// Rules unknown: cannot tell.
	in.Rules.Mode, in.Rules.Checked, in.Rules.Err = "", false, "operation not permitted"
	r = Evaluate(in)
	only(t, r)
	if _, ok := notChecked(r)[KubeProxyDown]; !ok {
		t.Errorf("not checked %v, want kube_proxy_down", r.NotChecked)
	}
}

func TestKubeProxyNotLookedAt(t *testing.T) {
	in := healthyInput()
	in.KubeProxy = KubeProxyFacts{Err: "the kubeproxy collector is off"}
	r := Evaluate(in)
	only(t, r)
	if len(r.NotChecked) != 1 || r.NotChecked[0].Reason != "the kubeproxy collector is off" ||
		!slices.Equal(r.NotChecked[0].Causes, []Cause{KubeProxySyncFailing, KubeProxyDown, KubeProxyStuck, KubeProxyWatchFailing}) {
		t.Errorf("not checked %+v", r.NotChecked)
	}
	in = healthyInput()
	in.KubeProxy.LogFiles = nil
	if reason := notChecked(Evaluate(in))[KubeProxyWatchFailing]; !strings.Contains(reason, "no kube-proxy log file found") {
		t.Errorf("no log file: not checked %q", reason)
	}
	in.Rules.Mode = "none" // no kube-proxy here: its log is not expected
	if r := Evaluate(in); len(r.NotChecked) != 0 {
		t.Errorf("no kube-proxy: not checked %v", r.NotChecked)
	}
	in = healthyInput()
	in.KubeProxy.LogErr = "open /var/log/pods/x/0.log: permission denied"
	if reason := notChecked(Evaluate(in))[KubeProxyWatchFailing]; reason != in.KubeProxy.LogErr {
		t.Errorf("unreadable log: not checked %q", reason)
	}
}

func sameBridgeFlows() []UnrepliedCount {
	return []UnrepliedCount{
		{Service: web, Reason: ReasonSameBridge, Ended: 4, Open: 1},
		{Service: web, Reason: ReasonRemoteEndpoint, Ended: 5},
		{Service: api, Reason: ReasonSameBridge, Ended: 2},
		{Service: Service{Protocol: "tcp"}, Reason: ReasonNoService, Ended: 50},
	}
}

// Incident 1: one node-wide finding naming the services hit; it explains the same-bridge flows,
// not the others.
func TestBridgeNetfilterOff(t *testing.T) {
	in := healthyInput()
	in.Kernel.BridgeNFCallIptables = Int(0)
	in.Conntrack.Unreplied = sameBridgeFlows()
	r := Evaluate(in)
	only(t, r, BridgeNetfilterOff, UnrepliedFlows)
	f := r.Findings[0]
	if f.Severity != Critical || f.Service != nil || r.Verdict != CriticalFound {
		t.Errorf("finding %+v verdict %s", f, r.Verdict)
	}
	ev := f.Evidence.(*BridgeNetfilterEvidence)
	if ev.BridgeNFCallIptables != 0 || ev.Ended != 6 || ev.Open != 1 || len(ev.Services) != 2 ||
		ev.Services[0].Service != web || ev.Services[0].Ended != 4 || ev.Services[1].Service != api ||
		!slices.Equal(ev.Explains, []Cause{UnrepliedFlows}) {
		t.Errorf("evidence %+v", ev)
	}
	want := "net.bridge.bridge-nf-call-iptables is 0, so replies from endpoints on the client's own bridge escape un-NATed: connections to default/web:80/tcp, default/api:8080/tcp fail (6 ended unreplied in the last 10m, 1 still waiting for a reply)."
	if f.Summary != want {
		t.Errorf("summary\n %q\nwant\n %q", f.Summary, want)
	}
	// The remote flows of web are not explained by bridge netfilter.
	u := r.Findings[1]
	if *u.Service != web || u.Evidence.(*FlowsEvidence).Ended != 5 || len(u.Evidence.(*FlowsEvidence).ByReason) != 1 {
		t.Errorf("unreplied %+v", u)
	}

	in.Kernel.BridgeNFCallIptables = Int(-1)
	if s := Evaluate(in).Findings[0].Summary; !strings.HasPrefix(s, "br_netfilter is not loaded") {
		t.Errorf("summary %q", s)
	}

	// Bridge netfilter on: same-bridge flows have no known cause.
	in.Kernel.BridgeNFCallIptables = Int(1)
	r = Evaluate(in)
	only(t, r, UnrepliedFlows)
	if ev := r.Findings[0].Evidence.(*FlowsEvidence); *r.Findings[0].Service != web || ev.Ended != 9 || ev.Open != 1 {
		t.Errorf("unreplied %+v", r.Findings[0])
	}
	// api's 2 flows are under the threshold.

	// Off, but no same-bridge flow fails: nothing seen to break.
	in.Kernel.BridgeNFCallIptables = Int(0)
	in.Conntrack.Unreplied = nil
	only(t, Evaluate(in))

	// Off, and flows cannot be followed: not checked.
	in.Conntrack.FlowsErr = "conntrack event listener: operation not permitted"
	r = Evaluate(in)
	nc := notChecked(r)
	if !strings.Contains(nc[BridgeNetfilterOff], "cannot be followed") || nc[UnrepliedFlows] != in.Conntrack.FlowsErr {
		t.Errorf("not checked %v", r.NotChecked)
	}
	in.Kernel.BridgeNFCallIptables, in.Kernel.Err = nil, "permission denied"
	if !strings.Contains(notChecked(Evaluate(in))[BridgeNetfilterOff], "could not be read: permission denied") {
		t.Errorf("unknown sysctl must be not checked")
	}
}

func TestUnrepliedFlowsThresholdAndProtocols(t *testing.T) {
	in := healthyInput()
	in.Conntrack.Unreplied = []UnrepliedCount{{Service: web, Reason: ReasonRemoteEndpoint, Ended: 1, Open: 1}}
	only(t, Evaluate(in))
	in.Conntrack.Unreplied[0].Open = 2
	r := Evaluate(in)
	only(t, r, UnrepliedFlows)
	want := "Connections to default/web:80/tcp get no reply (1 ended unreplied in the last 10m, 2 still waiting for a reply; endpoints: remote_endpoint), and no cause was found on this node."
	if r.Findings[0].Summary != want || r.Findings[0].Runbook != RunbookBase+"#unreplied-service-flows" {
		t.Errorf("summary %q runbook %s", r.Findings[0].Summary, r.Findings[0].Runbook)
	}
	// UDP is fire-and-forget as often as not; flows to no service name nothing.
	in.Conntrack.Unreplied = []UnrepliedCount{
		{Service: dnsUDP, Reason: ReasonRemoteEndpoint, Ended: 100},
		{Reason: ReasonNoService, Ended: 100},
	}
	only(t, Evaluate(in))
	sctp := Service{Namespace: "telco", Name: "sig", Port: 3868, Protocol: "sctp"}
	in.Conntrack.Unreplied = []UnrepliedCount{{Service: sctp, Reason: ReasonLocalEndpoint, Ended: 3}}
	only(t, Evaluate(in), UnrepliedFlows)
}

func TestInvalidNotDropped(t *testing.T) {
	base := healthyInput()
	base.Conntrack.Invalid = 1200 // 2/s over 10m
	base.Kernel.InvalidDropRule = Bool(false)
	r := Evaluate(base)
	only(t, r, InvalidNotDropped)
	ev := r.Findings[0].Evidence.(*InvalidEvidence)
	if ev.InvalidPackets != 1200 || ev.PerSecond != 2 || ev.TCPBeLiberal != 0 || ev.InvalidDropRule || r.Findings[0].Severity != Warning {
		t.Errorf("evidence %+v", ev)
	}
	for _, tc := range []struct {
		name       string
		change     func(*Input)
		notChecked bool
	}{
		{"be_liberal", func(in *Input) { in.Kernel.TCPBeLiberal = Int(1) }, false},
		{"drop rule", func(in *Input) { in.Kernel.InvalidDropRule = Bool(true) }, false},
		{"below 1/s", func(in *Input) { in.Conntrack.Invalid = 600 }, false},
		{"drop rule unknown", func(in *Input) { in.Kernel.InvalidDropRule, in.Kernel.RulesErr = nil, "no backend could be read" }, true},
		{"be_liberal unknown", func(in *Input) { in.Kernel.TCPBeLiberal = nil }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := base
			in.Kernel = base.Kernel
			tc.change(&in)
			r := Evaluate(in)
			only(t, r)
			if _, ok := notChecked(r)[InvalidNotDropped]; ok != tc.notChecked {
				t.Errorf("not checked %v, want invalid_not_dropped there: %v", r.NotChecked, tc.notChecked)
			}
		})
	}
}

func TestInvalidNotDroppedNamesServicesAndReasons(t *testing.T) {
	base := healthyInput()
	base.Conntrack.Invalid = 1200
	base.Kernel.InvalidDropRule = Bool(false)
	finding := func(in Input) (Finding, *InvalidEvidence) {
		t.Helper()
		r := Evaluate(in)
		only(t, r, InvalidNotDropped)
		return r.Findings[0], r.Findings[0].Evidence.(*InvalidEvidence)
	}

	// Without the log: the Services and reasons are not named, and the evidence says how
	// to name them.
	f, ev := finding(base)
	if strings.Contains(f.Summary, "most") || ev.ByServiceReason != nil || !strings.Contains(ev.ReasonsNotNamed, "--conntrack.invalid-reasons") {
		t.Errorf("without the log: %q, %+v", f.Summary, ev)
	}

	// With it: the top 5 by packets, the rest counted with the unlisted Services'.
	in := base
	in.Conntrack.InvalidReasons = &InvalidReasonFacts{
		Counts: []InvalidReasonCount{
			{Namespace: "lab", Name: "api", Reason: "checksum", Packets: 7},
			{Namespace: "lab", Name: "web", Reason: "seq_over_window", Packets: 120},
			{Reason: "tcp_flags", Packets: 9},
			{Namespace: "lab", Name: "web", Reason: "ack_over_window", Packets: 5},
			{Namespace: "lab", Name: "db", Reason: "seq_over_window", Packets: 3},
			{Namespace: "lab", Name: "db", Reason: "tcp_flags", Packets: 2},
			{Namespace: "lab", Name: "cache", Reason: "checksum", Packets: 0},
		},
		Unlisted: 4, Lost: 6,
	}
	f, ev = finding(in)
	want := []InvalidReasonCount{
		{Namespace: "lab", Name: "web", Reason: "seq_over_window", Packets: 120},
		{Reason: "tcp_flags", Packets: 9},
		{Namespace: "lab", Name: "api", Reason: "checksum", Packets: 7},
		{Namespace: "lab", Name: "web", Reason: "ack_over_window", Packets: 5},
		{Namespace: "lab", Name: "db", Reason: "seq_over_window", Packets: 3},
	}
	if !slices.Equal(ev.ByServiceReason, want) || ev.OtherLoggedPackets != 2+4 || ev.LostLoggedPackets != 6 || ev.ReasonsNotNamed != "" {
		t.Errorf("evidence %+v, want by service and reason %+v, 6 other, 6 lost", ev, want)
	}
	if !strings.Contains(f.Summary, "(2/s), mostly for lab/web: 120 seq_over_window and 5 ack_over_window packets, with nf_conntrack_tcp_be_liberal off") {
		t.Errorf("summary %q does not name the top Service and its reasons", f.Summary)
	}
	// The evidence as people read it (diagnose, the landing page).
	var line string
	for _, fl := range EvidenceFields(ev) {
		if fl.Key == "by_service_reason" {
			line = fl.Value
		}
	}
	if !strings.HasPrefix(line, "service_namespace=lab service_name=web reason=seq_over_window packets=120; reason=tcp_flags packets=9; ") {
		t.Errorf("by_service_reason as text: %q", line)
	}

	// The Service of the most packets in all, though another has the largest single count.
	in.Conntrack.InvalidReasons = &InvalidReasonFacts{Counts: []InvalidReasonCount{
		{Namespace: "lab", Name: "api", Reason: "checksum", Packets: 50},
		{Namespace: "lab", Name: "web", Reason: "seq_over_window", Packets: 40},
		{Namespace: "lab", Name: "web", Reason: "invalid_new", Packets: 40},
		{Namespace: "lab", Name: "web", Reason: "tcp_flags", Packets: 1}}}
	if f, _ := finding(in); !strings.Contains(f.Summary, ", mostly for lab/web: 40 invalid_new and 40 seq_over_window packets, with") {
		t.Errorf("summary %q", f.Summary)
	}
	// Read in windows under a flood: the counts are a sample, and the summary says so.
	in.Conntrack.InvalidReasons = &InvalidReasonFacts{SampledShare: 0.0834, Counts: []InvalidReasonCount{
		{Namespace: "lab", Name: "web", Reason: "tcp_flags", Packets: 10000}}}
	if f, ev := finding(in); !strings.Contains(f.Summary, ", mostly for lab/web: 10000 tcp_flags packets (logged in 8.3% of the window: a sample), with") || ev.SampledShare != 0.083 {
		t.Errorf("sampled: summary %q, share %v", f.Summary, ev.SampledShare)
	}
	// A top one of no Service, and not half of what was logged.
	in.Conntrack.InvalidReasons = &InvalidReasonFacts{Counts: []InvalidReasonCount{
		{Reason: "checksum", Packets: 1}, {Namespace: "lab", Name: "web", Reason: "tcp_flags", Packets: 1}}}
	if f, _ := finding(in); !strings.Contains(f.Summary, ", most often for no Service: 1 checksum packet, with") {
		t.Errorf("summary %q", f.Summary)
	}

	// Nothing logged in the window: nothing named, nothing said missing.
	in.Conntrack.InvalidReasons = &InvalidReasonFacts{}
	if f, ev := finding(in); strings.Contains(f.Summary, "most") || ev.ByServiceReason != nil || ev.ReasonsNotNamed != "" {
		t.Errorf("nothing logged: %q, %+v", f.Summary, ev)
	}

	// The log not read throughout the window: why.
	in.Conntrack.InvalidReasons = &InvalidReasonFacts{Err: "reading NFLOG group 0: no buffer space", Counts: want}
	if f, ev := finding(in); strings.Contains(f.Summary, "most") || ev.ByServiceReason != nil || ev.ReasonsNotNamed != "reading NFLOG group 0: no buffer space" {
		t.Errorf("log failed: %q, %+v", f.Summary, ev)
	}
}

func TestConntrackTable(t *testing.T) {
	in := healthyInput()
	in.Conntrack.Entries, in.Conntrack.Limit = 240000, 262144
	r := Evaluate(in)
	only(t, r, ConntrackTableFull)
	if f := r.Findings[0]; f.Severity != Warning || f.Runbook != RunbookBase+"#proxyhealthconntracktablenearlyfull" ||
		!strings.Contains(f.Summary, "92% full (240000 of 262144 entries)") {
		t.Errorf("nearly full: %+v", f)
	}
	in.Conntrack.Entries, in.Conntrack.Drop, in.Conntrack.EarlyDrop = 262144, 120, 30
	r = Evaluate(in)
	only(t, r, ConntrackTableFull)
	if f := r.Findings[0]; f.Severity != Critical || f.Runbook != RunbookBase+"#proxyhealthconntrackdroppingflows" || r.Verdict != CriticalFound {
		t.Errorf("dropping: %+v", f)
	}
	if ev := r.Findings[0].Evidence.(*TableEvidence); ev.Drop != 120 || ev.EarlyDrop != 30 || ev.Fill != 1 {
		t.Errorf("evidence %+v", ev)
	}
	if s := r.Findings[0].Summary; s != "The conntrack table dropped 120 packets of new flows and evicted 30 entries to make room in the last 10m (now 100% full: 262144 of 262144 entries): new connections fail." {
		t.Errorf("summary %q", s)
	}
	in.Conntrack = ConntrackFacts{StatsErr: "open conntrack netlink socket: operation not permitted (needs CAP_NET_ADMIN)"}
	r = Evaluate(in)
	only(t, r)
	nc := notChecked(r)
	for _, c := range []Cause{ConntrackTableFull, ConntrackInsertFailing, InvalidNotDropped} {
		if nc[c] != in.Conntrack.StatsErr {
			t.Errorf("%s: not checked %q", c, nc[c])
		}
	}
}

func TestConntrackInsertFailing(t *testing.T) {
	in := healthyInput()
	in.Conntrack.InsertFailed = 60 // 0.1/s: not above
	only(t, Evaluate(in))
	in.Conntrack.InsertFailed = 120
	r := Evaluate(in)
	only(t, r, ConntrackInsertFailing)
	if ev := r.Findings[0].Evidence.(*InsertEvidence); ev.InsertFailed != 120 || ev.PerSecond != 0.2 || ev.WindowSeconds != 600 {
		t.Errorf("evidence %+v", ev)
	}
}

// Right after the exporter starts the counters have one reading: rates are not judged, fill is.
func TestNoWindowYet(t *testing.T) {
	in := healthyInput()
	in.Window = 0
	in.Conntrack.Invalid, in.Conntrack.InsertFailed, in.Conntrack.Drop = 5000, 5000, 5000
	in.Kernel.InvalidDropRule = Bool(false)
	r := Evaluate(in)
	only(t, r)
	nc := notChecked(r)
	if nc[InvalidNotDropped] == "" || nc[ConntrackInsertFailing] == "" {
		t.Errorf("not checked %v", r.NotChecked)
	}
	if r.Verdict != Unknown {
		t.Errorf("verdict %s before the rates can be judged, want unknown", r.Verdict)
	}
}

// One model: a critical finding is certain whatever could not be checked; otherwise anything
// not checked leaves the node unknown, warnings included; only a node checked throughout is
// healthy or has only warnings.
func TestJudge(t *testing.T) {
	crit := Finding{Cause: StaleRules, Severity: Critical}
	warn := Finding{Cause: KubeProxyStuck, Severity: Warning}
	unchecked := []NotChecked{{Causes: []Cause{StaleRules}, Reason: "no Kubernetes API is configured"}}
	for _, tc := range []struct {
		name       string
		findings   []Finding
		notChecked []NotChecked
		want       Verdict
		exit       int
	}{
		{"nothing", nil, nil, Healthy, 0},
		{"an empty not-checked entry", nil, []NotChecked{{Reason: "nothing"}}, Healthy, 0},
		{"warnings", []Finding{warn}, []NotChecked{}, WarningsOnly, 1},
		{"critical", []Finding{crit, warn}, nil, CriticalFound, 2},
		{"not checked", nil, unchecked, Unknown, 3},
		{"warnings, not checked", []Finding{warn}, unchecked, Unknown, 3},
		{"critical, not checked", []Finding{warn, crit}, unchecked, CriticalFound, 2},
	} {
		v := Judge(tc.findings, tc.notChecked)
		if v != tc.want || v.ExitCode() != tc.exit {
			t.Errorf("%s: %s (exit %d), want %s (exit %d)", tc.name, v, v.ExitCode(), tc.want, tc.exit)
		}
	}
	if got := Verdict("degraded").ExitCode(); got != ExitUnknown {
		t.Errorf("a verdict outside the vocabulary exits %d, want %d", got, ExitUnknown)
	}
	order := []Verdict{Healthy, WarningsOnly, Unknown, CriticalFound}
	for i := range order {
		for j := range order {
			if got, want := Compare(order[i], order[j]), cmp.Compare(i, j); got != want {
				t.Errorf("Compare(%s, %s) = %d, want %d", order[i], order[j], got, want)
			}
		}
	}
	if Compare(Verdict("broken"), Unknown) != 0 {
		t.Error("a verdict outside the vocabulary ranks as unknown")
	}
}

// Findings come worst first: critical ones, then by cause, then without a service.
func TestVerdictAndOrder(t *testing.T) {
	in := healthyInput()
	in.Conntrack.InsertFailed = 600
	in.KubeProxy.SyncPending = 10 * time.Minute
	in.Conntrack.Unreplied = []UnrepliedCount{{Service: web, Reason: ReasonRemoteEndpoint, Ended: 30}}
	r := Evaluate(in)
	only(t, r, KubeProxyStuck, ConntrackInsertFailing, UnrepliedFlows)
	if r.Verdict != WarningsOnly {
		t.Errorf("verdict %s, want warning", r.Verdict)
	}
	in.Kernel.BridgeNFCallIptables = Int(0)
	in.Conntrack.Unreplied = append(in.Conntrack.Unreplied, UnrepliedCount{Service: api, Reason: ReasonSameBridge, Ended: 1})
	in.Rules.Drifting = []DriftingPort{incident3Drift()}
	r = Evaluate(in)
	only(t, r, StaleRules, BridgeNetfilterOff, ConntrackInsertFailing, UnrepliedFlows)
	if r.Verdict != CriticalFound {
		t.Errorf("verdict %s", r.Verdict)
	}
}

// Drifting ports beyond the bound are counted in one more finding.
func TestServiceFindingsAreBounded(t *testing.T) {
	in := healthyInput()
	for i := range 60 {
		in.Rules.Drifting = append(in.Rules.Drifting, DriftingPort{
			Service:    Service{Namespace: "ns", Name: fmt.Sprintf("svc%02d", i), Port: 80, Protocol: "tcp"},
			StaleCount: 2, MissingCount: 1, Programmed: 3, Expected: 2, Since: now.Add(-time.Hour)})
	}
	r := Evaluate(in)
	if len(r.Findings) != 51 {
		t.Fatalf("%d findings, want 50 and one for the rest", len(r.Findings))
	}
	last := r.Findings[50]
	ev, ok := last.Evidence.(*StaleRulesRestEvidence)
	if last.Cause != StaleRules || last.Service != nil || !ok || ev.ServicePorts != 10 || ev.StaleCount != 20 || ev.MissingCount != 10 {
		t.Errorf("rest finding %+v %+v", last, last.Evidence)
	}
	if !strings.Contains(last.Summary, "10 more service ports") {
		t.Errorf("summary %q", last.Summary)
	}
}

// The facts are not modified: the exporter evaluates the same Input more than once.
func TestEvaluateDoesNotModifyInput(t *testing.T) {
	in := healthyInput()
	in.Rules.Drifting = []DriftingPort{incident3Drift()}
	in.KubeProxy.ListErrors = []ListErrorCount{{Resource: "services", Verb: "watch", Recent: 5, Total: 5}}
	in.Kernel.BridgeNFCallIptables = Int(0)
	in.Conntrack.Unreplied = sameBridgeFlows()
	before, _ := json.Marshal(in)
	a, _ := json.Marshal(Evaluate(in))
	after, _ := json.Marshal(in)
	b, _ := json.Marshal(Evaluate(in))
	if string(before) != string(after) || string(a) != string(b) {
		t.Error("Evaluate changed its input, or judged the same input differently")
	}
}

// Every cause of the vocabulary comes out of some input, with its runbook.
func TestEveryCauseIsReachable(t *testing.T) {
	seen := map[Cause]Finding{}
	inputs := []func(*Input){
		func(in *Input) { in.Rules.Drifting = []DriftingPort{incident3Drift()} },
		func(in *Input) {
			in.KubeProxy.ListErrors = []ListErrorCount{{Resource: "services", Verb: "list", Recent: 3, Total: 3}}
		},
		func(in *Input) { in.KubeProxy.SyncPending = time.Hour },
		func(in *Input) { failingSyncs(in, 3, false) },
		func(in *Input) { in.KubeProxy.Up = false },
		func(in *Input) {
			in.Kernel.BridgeNFCallIptables = Int(0)
			in.Conntrack.Unreplied = sameBridgeFlows()
		},
		func(in *Input) { in.Kernel.InvalidDropRule, in.Conntrack.Invalid = Bool(false), 10000 },
		func(in *Input) { in.Conntrack.Drop = 1 },
		func(in *Input) { in.Conntrack.InsertFailed = 10000 },
		func(in *Input) { in.API.Fresh = false },
	}
	for _, change := range inputs {
		in := healthyInput()
		change(&in)
		for _, f := range Evaluate(in).Findings {
			seen[f.Cause] = f
		}
	}
	for _, c := range Causes {
		f, ok := seen[c]
		if !ok {
			t.Errorf("no input gives %s", c)
			continue
		}
		if !strings.HasPrefix(f.Runbook, RunbookBase+"#") || f.Summary == "" || f.Evidence == nil {
			t.Errorf("%s: finding %+v", c, f)
		}
	}
}

// The /status schema: these keys, and no others.
func TestReportSchema(t *testing.T) {
	in := healthyInput()
	in.Rules.Drifting = []DriftingPort{incident3Drift()}
	in.KubeProxy.LogFiles = nil
	b, err := json.Marshal(Evaluate(in))
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	if got := sortedKeys(doc); !slices.Equal(got, []string{"findings", "node", "not_checked", "time", "verdict", "window_seconds"}) {
		t.Errorf("report keys %v", got)
	}
	var findings []map[string]json.RawMessage
	if err := json.Unmarshal(doc["findings"], &findings); err != nil || len(findings) != 1 {
		t.Fatalf("findings %s: %v", doc["findings"], err)
	}
	if got := sortedKeys(findings[0]); !slices.Equal(got, []string{"cause", "evidence", "runbook", "service", "severity", "summary"}) {
		t.Errorf("finding keys %v", got)
	}
	var svc map[string]json.RawMessage
	if err := json.Unmarshal(findings[0]["service"], &svc); err != nil {
		t.Fatal(err)
	}
	if got := sortedKeys(svc); !slices.Equal(got, []string{"name", "namespace", "port", "port_name", "protocol"}) {
		t.Errorf("service keys %v", got)
	}
	var ev map[string]any
	if err := json.Unmarshal(findings[0]["evidence"], &ev); err != nil {
		t.Fatalf("evidence is not an object: %v", err)
	}
	if ev["missing"].([]any)[0] != "10.244.2.1:53" || ev["programmed"].(float64) != 65 {
		t.Errorf("evidence %v", ev)
	}
	var nc []NotChecked
	if err := json.Unmarshal(doc["not_checked"], &nc); err != nil || len(nc) != 1 || nc[0].Causes[0] != KubeProxyWatchFailing {
		t.Errorf("not_checked %s", doc["not_checked"])
	}
	if string(doc["time"]) != `"2025-03-04T03:00:00Z"` || string(doc["verdict"]) != `"critical"` {
		t.Errorf("time %s verdict %s", doc["time"], doc["verdict"])
	}
	// A node-wide finding has "service": null.
	in = healthyInput()
	in.Conntrack.Drop = 5
	b, _ = json.Marshal(Evaluate(in))
	if !strings.Contains(string(b), `"service":null`) {
		t.Errorf("node-wide finding: %s", b)
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// githubAnchor is the anchor GitHub gives a heading.
func githubAnchor(heading string) string {
	s := strings.ToLower(strings.TrimSpace(heading))
	s = regexp.MustCompile(`[^a-z0-9 _-]`).ReplaceAllString(s, "")
	return strings.ReplaceAll(s, " ", "-")
}

// Every runbook link points at a section of docs/runbooks.md, and those of causes with an alert
// at the same section as the alert's runbook_url.
func TestRunbookAnchors(t *testing.T) {
	f, err := os.Open("../../docs/runbooks.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sections := map[string]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if h, ok := strings.CutPrefix(sc.Text(), "## "); ok {
			sections[githubAnchor(h)] = true
		}
	}
	alerts, err := os.ReadFile("../../alerts/proxyhealth.rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{anchorRulesStale, anchorListWatchFailing, anchorKubeProxyStuck, anchorKubeProxyDown, anchorSyncFailing,
		anchorBridgeNetfilterOff, anchorInvalidNotDropped, anchorTableNearlyFull, anchorDroppingFlows, anchorInsertFailing,
		anchorAPIViewStale, anchorUnrepliedFlows} {
		if !sections[a] {
			t.Errorf("#%s: no such section in docs/runbooks.md", a)
		}
		if a != anchorUnrepliedFlows && !strings.Contains(string(alerts), "runbook_url: "+runbook(a)+"\n") {
			t.Errorf("#%s: no alert links %s", a, runbook(a))
		}
	}
}

func TestFormatDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		15 * time.Second:                   "15s",
		14*time.Minute + 20*time.Second:    "14m",
		3*time.Hour + 20*time.Minute:       "3h20m",
		2 * time.Hour:                      "2h",
		52 * time.Hour:                     "2d4h",
		72*time.Hour + 10*time.Minute:      "3d",
		59*time.Minute + 50*time.Second:    "60m",
		100 * time.Millisecond:             "0s",
		47*time.Hour + 59*time.Minute:      "47h59m",
		24*time.Hour + 30*time.Second:      "24h1m",
		10*time.Minute + 29*time.Second:    "10m",
		time.Minute + 500*time.Millisecond: "1m",
	} {
		if got := formatDuration(d); got != want {
			t.Errorf("formatDuration(%v) = %s, want %s", d, got, want)
		}
	}
}

func TestEvidenceFields(t *testing.T) {
	ev := &KubeProxyEvidence{
		Up:                    true,
		Healthy:               Bool(true),
		ListErrors:            []ListErrorCount{{Resource: "endpointslices", Verb: "watch", Recent: 1, Total: 2}},
		ListErrorsSpanSeconds: 600,
		LastListError:         time.Date(2025, 3, 4, 2, 41, 7, 0, time.UTC),
		LogFiles:              []string{"/a.log", "/b.log"},
		APIView:               &APIEvidence{Error: "timeout"},
	}
	got := EvidenceFields(ev)
	want := []Field{
		{"up", "true"}, {"healthy", "true"}, {"sync_pending_seconds", "0"},
		{"list_errors", "resource=endpointslices verb=watch recent=1 total=2"},
		{"list_errors_span_seconds", "600"}, {"last_list_error", "2025-03-04T02:41:07Z"},
		{"log_files", "/a.log, /b.log"}, {"exporter_api_view.fresh", "false"}, {"exporter_api_view.error", "timeout"},
	}
	if !slices.Equal(got, want) {
		t.Errorf("fields\n%v\nwant\n%v", got, want)
	}
	// The same from the JSON a client of /status has: order follows the document's.
	b, _ := json.Marshal(ev)
	if got := EvidenceFields(json.RawMessage(b)); !slices.Equal(got, want) {
		t.Errorf("from raw JSON: %v", got)
	}
}

func TestWriteText(t *testing.T) {
	in := healthyInput()
	in.Rules.Drifting = []DriftingPort{incident3Drift()}
	in.KubeProxy.ListErrors = []ListErrorCount{{Resource: "endpointslices", Verb: "watch", Recent: 1, Total: 1}}
	in.Conntrack.InsertFailed = 600
	in.Kernel.BridgeNFCallIptables = nil
	var b strings.Builder
	if err := WriteText(&b, Evaluate(in)); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"node worker-3: critical (1 critical, 1 warning, 1 not checked), judged over 10m\n",
		"\nCRITICAL stale_rules kube-system/kube-dns:dns-tcp (53/tcp)\n  kube-proxy's rules for",
		"    missing: 10.244.2.1:53, 10.244.2.2:53,",
		"    explained_by: kube_proxy_watch_failing\n",
		"    kube_proxy.list_errors: resource=endpointslices verb=watch recent=1 total=1\n",
		"  runbook: " + RunbookBase + "#proxyhealthkubeproxyrulesstale\n",
		"\nWARNING conntrack_insert_failing\n",
		"\nnot checked:\n  bridge_netfilter_off: net.bridge.bridge-nf-call-iptables could not be read\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("text lacks %q:\n%s", want, out)
		}
	}
	b.Reset()
	_ = WriteText(&b, Evaluate(healthyInput()))
	if b.String() != "node worker-3: healthy, judged over 10m\n" {
		t.Errorf("healthy text %q", b.String())
	}
	in = healthyInput()
	in.API = APIFacts{Configured: false}
	b.Reset()
	_ = WriteText(&b, Evaluate(in))
	if out := b.String(); !strings.HasPrefix(out, "node worker-3: unknown (1 not checked), judged over 10m\n") ||
		!strings.Contains(out, "\nnot checked:\n  stale_rules: no Kubernetes API is configured") {
		t.Errorf("unknown text %q", out)
	}
}

// kube-proxy's version outside the tested ones, or one that cannot be placed, is a note on how
// the node was judged: not a finding, nor a cause left unchecked.
func TestNotesKubeProxyVersion(t *testing.T) {
	for _, tc := range []struct {
		version string
		want    string // the note; "" for none
	}{
		{"v1.37.2", ""},
		{"v1.34.4+k3s1", ""},
		{"", ""},
		{"v1.38.0", "kube-proxy v1.38.0 is outside the versions proxyhealth is tested with (v1.34 to v1.37): stale rules may be misjudged where it picks endpoints differently."},
		{"v1.33.9", "kube-proxy v1.33.9 is outside the versions proxyhealth is tested with (v1.34 to v1.37): stale rules may be misjudged where it picks endpoints differently."},
		{"v0.0.0-master+$Format:%H$", `kube-proxy reports version "v0.0.0-master+$Format:%H$", which proxyhealth cannot place: what it should program is computed as kube-proxy v1.37 computes it (proxyhealth is tested with v1.34 to v1.37).`},
	} {
		in := healthyInput()
		in.KubeProxy.Version = tc.version
		r := Evaluate(in)
		only(t, r)
		if len(r.NotChecked) != 0 || r.Verdict != Healthy {
			t.Errorf("%q: verdict %s, not checked %v", tc.version, r.Verdict, r.NotChecked)
		}
		var want []string
		if tc.want != "" {
			want = []string{tc.want}
		}
		if !slices.Equal(r.Notes, want) {
			t.Errorf("%q: notes %q, want %q", tc.version, r.Notes, want)
		}
	}
	in := healthyInput()
	in.KubeProxy.Version = "v1.38.0"
	var b strings.Builder
	if err := WriteText(&b, Evaluate(in)); err != nil {
		t.Fatal(err)
	}
	if want := "node worker-3: healthy, judged over 10m\n\nnotes:\n  kube-proxy v1.38.0 is outside"; !strings.HasPrefix(b.String(), want) {
		t.Errorf("text %q, want it to start %q", b.String(), want)
	}
	doc, err := json.Marshal(Evaluate(in))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), `"notes":["kube-proxy v1.38.0 is outside`) {
		t.Errorf("/status document without the note: %s", doc)
	}
}

// A dual-stack Service port's finding says which family's endpoints differ; a port whose input
// has no split still has the field, empty.
func TestStaleRulesByFamily(t *testing.T) {
	in := healthyInput()
	dual := DriftingPort{Service: dnsTCP, StaleCount: 2, MissingCount: 4, Programmed: 6, Expected: 8, Since: now.Add(-time.Minute),
		Stale:    []string{"[fd00:10:244:5::1]:53", "[fd00:10:244:5::2]:53"},
		Missing:  []string{"10.244.6.3:53", "[fd00:10:244:5::4]:53", "[fd00:10:244:5::5]:53", "[fd00:10:244:5::6]:53"},
		ByFamily: []FamilyDrift{{Family: "IPv4", MissingCount: 1}, {Family: "IPv6", StaleCount: 2, MissingCount: 3}}}
	in.Rules.Drifting = []DriftingPort{dual}
	r := Evaluate(in)
	only(t, r, StaleRules)
	ev := r.Findings[0].Evidence.(*StaleRulesEvidence)
	if !slices.Equal(ev.ByFamily, dual.ByFamily) {
		t.Errorf("by family %+v, want %+v", ev.ByFamily, dual.ByFamily)
	}
	b, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	if want := `"by_family":[{"family":"IPv4","missing_count":1,"stale_count":0},{"family":"IPv6","missing_count":3,"stale_count":2}]`; !strings.Contains(string(b), want) {
		t.Errorf("evidence JSON %s lacks %s", b, want)
	}

	in.Rules.Drifting = []DriftingPort{incident3Drift()}
	ev = Evaluate(in).Findings[0].Evidence.(*StaleRulesEvidence)
	if b, _ := json.Marshal(ev); !strings.Contains(string(b), `"by_family":[]`) {
		t.Errorf("evidence JSON without a split %s, want an empty by_family", b)
	}
}

// In IPVS mode a stale_rules finding names the virtual servers beside each address, and says
// "the virtual servers of the Local traffic policy" where the other modes say "the local chain".
func TestStaleRulesIPVSNamesVirtualServers(t *testing.T) {
	in := healthyInput()
	in.Rules.Mode = "ipvs"
	in.Rules.Drifting = []DriftingPort{{
		Service:        Service{Namespace: "shop", Name: "web", Port: 80, Protocol: "tcp", PortName: "http"},
		Stale:          []string{"10.244.0.4:8080"},
		StaleCount:     1,
		StaleIn:        []string{"local"},
		StaleInServers: [][]string{{"192.168.1.5:30080/TCP"}},
		Programmed:     2, Expected: 1,
		Since: in.Now.Add(-5 * time.Minute),
	}}
	r := Evaluate(in)
	var found *Finding
	for i := range r.Findings {
		if r.Findings[i].Cause == StaleRules {
			found = &r.Findings[i]
		}
	}
	if found == nil {
		t.Fatalf("no stale_rules finding: %+v", r.Findings)
	}
	if !strings.Contains(found.Summary, "1 stale in the virtual servers of the Local traffic policy") {
		t.Errorf("summary %q", found.Summary)
	}
	ev, ok := found.Evidence.(*StaleRulesEvidence)
	if !ok || len(ev.StaleInVirtualServers) != 1 || ev.StaleInVirtualServers[0][0] != "192.168.1.5:30080/TCP" || ev.ProxyMode != "ipvs" {
		t.Errorf("evidence %+v", found.Evidence)
	}
}
