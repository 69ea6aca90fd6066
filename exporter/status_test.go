package exporter

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/promslog"

	"github.com/proxyhealth/proxyhealth/collectors/conntrack"
	"github.com/proxyhealth/proxyhealth/collectors/kubeproxy"
	"github.com/proxyhealth/proxyhealth/collectors/node"
	"github.com/proxyhealth/proxyhealth/collectors/rules"
	"github.com/proxyhealth/proxyhealth/internal/cluster"
	"github.com/proxyhealth/proxyhealth/internal/hostrules"
	"github.com/proxyhealth/proxyhealth/internal/verdict"
)

type fakeConntrack struct {
	stats   conntrack.Stats
	err     error
	flows   conntrack.Flows
	invalid conntrack.InvalidReasons
}

func (f *fakeConntrack) Stats() (conntrack.Stats, error)          { return f.stats, f.err }
func (f *fakeConntrack) Flows() conntrack.Flows                   { return f.flows }
func (f *fakeConntrack) InvalidReasons() conntrack.InvalidReasons { return f.invalid }

type fakeSettings struct{ s node.Settings }

func (f *fakeSettings) Settings() node.Settings { return f.s }

type fakeRulesCheck struct{ lc rules.CheckSummary }

func (f *fakeRulesCheck) LastCheck() rules.CheckSummary { return f.lc }

type fakeKubeProxy struct{ st kubeproxy.Status }

func (f *fakeKubeProxy) Status() kubeproxy.Status { return f.st }

type fakeAPI struct {
	snap       cluster.Snapshot
	err        error
	configured bool
}

func (f *fakeAPI) Snapshot() *cluster.Snapshot { s := f.snap; return &s }
func (f *fakeAPI) LastError() error            { return f.err }
func (f *fakeAPI) Configured() bool            { return f.configured }

type fakeHost struct{ st *hostrules.State }

func (f *fakeHost) State() *hostrules.State { return f.st }

var t0 = time.Date(2025, 3, 4, 3, 0, 0, 0, time.UTC)

func intp(v int) *int    { return &v }
func boolp(v bool) *bool { return &v }

// healthyNode is a node where every collector works and nothing is wrong.
type healthyNode struct {
	ct   *fakeConntrack
	set  *fakeSettings
	rl   *fakeRulesCheck
	kp   *fakeKubeProxy
	api  *fakeAPI
	host *fakeHost
	now  time.Time
}

func newHealthyNode() *healthyNode {
	return &healthyNode{
		ct:  &fakeConntrack{stats: conntrack.Stats{Entries: 100, Limit: 262144, Invalid: 1000}},
		set: &fakeSettings{node.Settings{BridgeNFCallIptables: intp(1), TCPBeLiberal: intp(0), ConntrackEvents: intp(2), InvalidDrop: boolp(true)}},
		rl:  &fakeRulesCheck{rules.CheckSummary{At: t0, Mode: hostrules.ModeIPTables, Fresh: true, Checked: 12, GracePeriod: time.Minute}},
		kp: &fakeKubeProxy{kubeproxy.Status{Polled: true, At: t0, Up: true, HealthChecked: true, Healthy: true, LastSync: t0.Add(-time.Minute),
			LogsRead: true, LogFiles: []string{"/var/log/pods/kube-system_kube-proxy-x_1/kube-proxy/0.log"}}},
		api:  &fakeAPI{snap: cluster.Snapshot{Synced: true, Fresh: true, LastHeard: t0}, configured: true},
		host: &fakeHost{&hostrules.State{Mode: hostrules.ModeIPTables}},
		now:  t0,
	}
}

func (h *healthyNode) sources() *factSources {
	return &factSources{node: "worker-3", conntrack: h.ct, settings: h.set, rules: h.rl, kubeproxy: h.kp, api: h.api, host: h.host,
		now: func() time.Time { return h.now }}
}

// incident3 makes the node kube-dns's stale rules, behind a failed watch.
func (h *healthyNode) incident3() {
	dnsTCP := cluster.ServicePortName{Namespace: "kube-system", Name: "kube-dns", Port: "dns-tcp", Protocol: "TCP"}
	h.rl.lc.Drifting = []rules.DriftingPort{{
		Name: dnsTCP, Port: 53,
		Stale:      []netip.AddrPort{netip.MustParseAddrPort("10.244.1.5:53")},
		Missing:    []netip.AddrPort{netip.MustParseAddrPort("10.244.2.7:53"), netip.MustParseAddrPort("10.244.2.8:53")},
		StaleCount: 1, MissingCount: 2, Programmed: 3, Expected: 4, Since: t0.Add(-10 * time.Minute),
	}}
	h.kp.st.ListErrors = []kubeproxy.ListErrors{{Resource: "endpointslices", Verb: "watch", Count: 1}}
	h.kp.st.LastListError = t0.Add(-20 * time.Minute)
}

// The facts: deltas between the first and last samples, the rest from the last.
func TestFactsInput(t *testing.T) {
	h := newHealthyNode()
	src := h.sources()
	first := src.sample()
	h.now = t0.Add(10 * time.Minute)
	h.ct.stats = conntrack.Stats{Entries: 200, Limit: 262144, Invalid: 1600, InsertFailed: 7, Drop: 2, EarlyDrop: 1}
	h.ct.flows.Unreplied = []conntrack.UnrepliedSeries{
		{Namespace: "default", Name: "web", Port: 80, Protocol: "tcp", Reason: "remote_endpoint", Ended: 9, Open: 1},
		{Namespace: "default", Name: "api", Port: 8080, Protocol: "tcp", Reason: "same_bridge", Ended: 4},
	}
	h.kp.st.ListErrors = []kubeproxy.ListErrors{{Resource: "services", Verb: "list", Count: 5}}
	h.kp.st.PendingSince = h.now.Add(-3 * time.Minute)
	first.flows.Unreplied = []conntrack.UnrepliedSeries{{Namespace: "default", Name: "web", Port: 80, Protocol: "tcp", Reason: "remote_endpoint", Ended: 6}}
	first.kp.ListErrors = []kubeproxy.ListErrors{{Resource: "services", Verb: "list", Count: 1}}
	in := src.input([]factSample{first, src.sample()}, inputOptions{minDown: time.Minute})

	if in.Node != "worker-3" || in.Window != 10*time.Minute || !in.Now.Equal(h.now) {
		t.Errorf("input %s %v %v", in.Node, in.Window, in.Now)
	}
	c := in.Conntrack
	if c.Entries != 200 || c.Invalid != 600 || c.InsertFailed != 7 || c.Drop != 2 || c.EarlyDrop != 1 || c.StatsErr != "" || c.FlowsErr != "" {
		t.Errorf("conntrack %+v", c)
	}
	if len(c.Unreplied) != 2 || c.Unreplied[0].Ended != 3 || c.Unreplied[0].Open != 1 || c.Unreplied[1].Ended != 4 ||
		c.Unreplied[1].Service != (verdict.Service{Namespace: "default", Name: "api", Port: 8080, Protocol: "tcp"}) {
		t.Errorf("unreplied %+v", c.Unreplied)
	}
	k := in.KubeProxy
	if !k.Checked || !k.Up || *k.Healthy != true || k.SyncPending != 3*time.Minute || len(k.ListErrors) != 1 ||
		k.ListErrors[0] != (verdict.ListErrorCount{Resource: "services", Verb: "list", Recent: 4, Total: 5}) || k.ListErrorsSpan != 10*time.Minute {
		t.Errorf("kube-proxy %+v", k)
	}
	if !in.API.Configured || !in.API.Fresh || in.Rules.Mode != "iptables" || !in.Rules.Checked || in.Rules.ServicesChecked != 12 ||
		*in.Kernel.BridgeNFCallIptables != 1 || !*in.Kernel.InvalidDropRule {
		t.Errorf("api %+v rules %+v kernel %+v", in.API, in.Rules, in.Kernel)
	}
}

// kube-proxy counts as down only when every poll for at least minDown did not answer.
func TestFactsKubeProxyDownThroughout(t *testing.T) {
	h := newHealthyNode()
	src := h.sources()
	at := func(d time.Duration, up bool) factSample {
		return factSample{at: t0.Add(d), kp: kubeproxy.Status{Polled: true, At: t0.Add(d), Up: up, UpReason: "connection refused"}}
	}
	for _, tc := range []struct {
		name    string
		samples []factSample
		up      bool
		downFor time.Duration
	}{
		{"up at the end", []factSample{at(0, false), at(2*time.Minute, true)}, true, 0},
		{"down for less than a minute", []factSample{at(0, true), at(time.Minute, false), at(90*time.Second, false)}, true, 0},
		{"down for two minutes", []factSample{at(0, true), at(time.Minute, false), at(3*time.Minute, false)}, false, 2 * time.Minute},
		{"never answered, not polled at first", []factSample{{at: t0}, at(time.Minute, false), at(5*time.Minute, false)}, false, 4 * time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := src.input(tc.samples, inputOptions{minDown: time.Minute}).KubeProxy
			if k.Up != tc.up || k.DownFor != tc.downFor || (!tc.up && k.DownReason != "connection refused") {
				t.Errorf("up %v down for %v (%q), want %v %v", k.Up, k.DownFor, k.DownReason, tc.up, tc.downFor)
			}
		})
	}
}

// What a collector that is off, or failing, cannot say becomes "not checked".
func TestFactsUnavailable(t *testing.T) {
	src := &factSources{node: "n", now: func() time.Time { return t0 }}
	rep := verdict.Evaluate(src.input([]factSample{src.sample()}, inputOptions{}))
	if rep.Verdict != verdict.Unknown || len(rep.Findings) != 0 {
		t.Errorf("nothing enabled: %+v", rep)
	}
	got := map[verdict.Cause]string{}
	for _, n := range rep.NotChecked {
		for _, c := range n.Causes {
			got[c] = n.Reason
		}
	}
	for _, c := range verdict.Causes {
		if got[c] == "" && c != verdict.APIViewStale {
			t.Errorf("%s: not listed as not checked (%v)", c, rep.NotChecked)
		}
	}

	h := newHealthyNode()
	h.ct.err = errors.New("open conntrack netlink socket for stats: operation not permitted (needs CAP_NET_ADMIN)")
	h.ct.flows.Err = errors.New("subscribe: operation not permitted (needs CAP_NET_ADMIN)")
	src = h.sources()
	in := src.input([]factSample{src.sample()}, inputOptions{})
	if in.Conntrack.StatsErr != h.ct.err.Error() || in.Conntrack.FlowsErr != h.ct.flows.Err.Error() {
		t.Errorf("conntrack %+v", in.Conntrack)
	}
	// A listener not started at the first sample had counted nothing: flows are judged from
	// then; one not started at the last is not following them.
	h = newHealthyNode()
	src = h.sources()
	early := src.sample()
	early.flows.Err = conntrack.ErrNotListening
	if in := src.input([]factSample{early, src.sample()}, inputOptions{}); in.Conntrack.FlowsErr != "" {
		t.Errorf("listener started after the first sample: %q", in.Conntrack.FlowsErr)
	}
	if in := src.input([]factSample{src.sample(), early}, inputOptions{}); in.Conntrack.FlowsErr == "" {
		t.Error("listener not started at the last sample: flows judged")
	}
	failed := src.sample()
	failed.flows.Err = errors.New("receive conntrack events: no buffer space")
	if in := src.input([]factSample{failed, src.sample()}, inputOptions{}); in.Conntrack.FlowsErr == "" {
		t.Error("listener failed in the window: flows judged")
	}

	h = newHealthyNode()
	h.set.s.ConntrackEvents = intp(0)
	src = h.sources()
	if in := src.input([]factSample{src.sample()}, inputOptions{}); !strings.Contains(in.Conntrack.FlowsErr, "nf_conntrack_events is 0") {
		t.Errorf("events off: %q", in.Conntrack.FlowsErr)
	}
}

func TestStatusKeepsTheWindow(t *testing.T) {
	s := newStatus(&factSources{}, 10*time.Minute)
	if s.interval != 15*time.Second {
		t.Errorf("interval %v", s.interval)
	}
	for i := range 60 {
		s.record(factSample{at: t0.Add(time.Duration(i) * 15 * time.Second)})
	}
	last := s.samples[len(s.samples)-1].at
	if base := s.samples[0].at; last.Sub(base) != 10*time.Minute || len(s.samples) != 41 {
		t.Errorf("kept %d samples from %v to %v, want 41 spanning the 10m window", len(s.samples), s.samples[0].at, last)
	}
	if newStatus(&factSources{}, 10*time.Second).interval != time.Second {
		t.Error("a short window is sampled every second")
	}
}

func getStatus(t *testing.T, h http.Handler) (verdict.Report, map[string]json.RawMessage) {
	t.Helper()
	srv := httptest.NewServer(h)
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/status")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("GET /status: %s %s", resp.Status, resp.Header.Get("Content-Type"))
	}
	var rep verdict.Report
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(body, &rep); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(body, &raw); err != nil {
		t.Fatal(err)
	}
	return rep, raw
}

func TestStatusEndpoint(t *testing.T) {
	h := newHealthyNode()
	st := newStatus(h.sources(), 10*time.Minute)
	h.now = t0.Add(-10 * time.Minute)
	st.record(st.src.sample())
	h.now = t0
	mux := http.NewServeMux()
	mux.Handle("/status", st)

	rep, raw := getStatus(t, mux)
	if rep.Node != "worker-3" || rep.Verdict != verdict.Healthy || len(rep.Findings) != 0 || len(rep.NotChecked) != 0 {
		t.Errorf("healthy node: %+v", rep)
	}
	for _, k := range []string{"node", "verdict", "findings"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("no %q in /status", k)
		}
	}

	h.incident3()
	rep, raw = getStatus(t, mux)
	if rep.Verdict != verdict.CriticalFound || len(rep.Findings) != 1 {
		t.Fatalf("incident 3: %+v", rep)
	}
	f := rep.Findings[0]
	if f.Cause != verdict.StaleRules || f.Severity != verdict.Critical || f.Service == nil ||
		*f.Service != (verdict.Service{Namespace: "kube-system", Name: "kube-dns", Port: 53, Protocol: "tcp", PortName: "dns-tcp"}) ||
		!strings.HasSuffix(f.Runbook, "docs/runbooks.md#proxyhealthkubeproxyrulesstale") {
		t.Errorf("finding %+v", f)
	}
	var findings []struct {
		Evidence struct {
			Missing     []string `json:"missing"`
			Stale       []string `json:"stale"`
			ExplainedBy []string `json:"explained_by"`
			KubeProxy   struct {
				LastListError time.Time `json:"last_list_error"`
			} `json:"kube_proxy"`
		} `json:"evidence"`
	}
	if err := json.Unmarshal(raw["findings"], &findings); err != nil {
		t.Fatal(err)
	}
	ev := findings[0].Evidence
	if strings.Join(ev.Missing, ",") != "10.244.2.7:53,10.244.2.8:53" || strings.Join(ev.Stale, ",") != "10.244.1.5:53" ||
		strings.Join(ev.ExplainedBy, ",") != "kube_proxy_watch_failing" || !ev.KubeProxy.LastListError.Equal(t0.Add(-20*time.Minute)) {
		t.Errorf("evidence %+v", ev)
	}

	// Only GET and HEAD.
	srv := httptest.NewServer(mux)
	defer srv.Close()
	resp, err := http.Post(srv.URL+"/status", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /status: %s", resp.Status)
	}
}

// A node whose stale-rules check did not run is not reported healthy: /status says unknown,
// and why under not_checked.
func TestStatusNotChecked(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(h *healthyNode)
		reason string
	}{
		{"never compared", func(h *healthyNode) { h.rl.lc = rules.CheckSummary{GracePeriod: time.Minute} }, "not been compared with the API yet"},
		{"rules unreadable", func(h *healthyNode) {
			h.rl.lc.Err = errors.New("read the nat table: operation not permitted")
		}, "operation not permitted"},
		{"a plain host", func(h *healthyNode) {
			h.api.configured, h.api.snap = false, cluster.Snapshot{}
			h.rl.lc = rules.CheckSummary{At: t0, Err: errors.New("no Kubernetes API configured")}
		}, "no Kubernetes API is configured"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHealthyNode()
			tc.change(h)
			st := newStatus(h.sources(), 10*time.Minute)
			h.now = t0.Add(-10 * time.Minute)
			st.record(st.src.sample())
			h.now = t0
			rep, raw := getStatus(t, st)
			if string(raw["verdict"]) != `"unknown"` || len(rep.Findings) != 0 {
				t.Errorf("verdict %s, findings %v: want unknown, none", raw["verdict"], rep.Findings)
			}
			if len(rep.NotChecked) != 1 || !slices.Equal(rep.NotChecked[0].Causes, []verdict.Cause{verdict.StaleRules}) ||
				!strings.Contains(rep.NotChecked[0].Reason, tc.reason) {
				t.Errorf("not_checked %s, want stale_rules: ...%s...", raw["not_checked"], tc.reason)
			}
		})
	}
}

func getPage(t *testing.T, h http.Handler) string {
	t.Helper()
	srv := httptest.NewServer(h)
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
		t.Fatalf("GET /: %s %s", resp.Status, resp.Header.Get("Content-Type"))
	}
	return string(body)
}

// The landing page opens with the verdict, then the collectors; its links work.
func TestLandingPage(t *testing.T) {
	h := newHealthyNode()
	st := newStatus(h.sources(), 10*time.Minute)
	h.now = t0.Add(-10 * time.Minute)
	st.record(st.src.sample())
	h.now = t0
	set := newCollectorSet(nil, promslog.NewNopLogger())
	set.status["rules"] = &CollectorStatus{Name: "rules", OK: true}
	page := landingPage("/metrics", false, set, st)

	body := getPage(t, page)
	verdictAt, linksAt, tableAt := strings.Index(body, `id="verdict"`), strings.Index(body, `>Metrics</a>`), strings.Index(body, "<h2>Collectors</h2>")
	if verdictAt < 0 || linksAt < 0 || tableAt < 0 || verdictAt > linksAt || linksAt > tableAt {
		t.Errorf("verdict at %d, links at %d, collectors at %d: want the verdict first, the collectors after the links\n%s", verdictAt, linksAt, tableAt, body)
	}
	for _, want := range []string{
		`class="verdict healthy"`, `Node worker-3: <span class="word">healthy</span>`, "No finding",
		`<a href="https://github.com/proxyhealth/proxyhealth#metrics">metrics reference</a>`,
		`<a href="/status">Status</a>`, `<a href="/metrics">Metrics</a>`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("healthy page lacks %q", want)
		}
	}
	if strings.Contains(body, "Not checked") || strings.Contains(body, "<b>failing</b>") {
		t.Errorf("healthy page with something not checked or failing:\n%s", body)
	}
	if strings.Contains(body, `href="/https:`) {
		t.Error("an external link is prefixed with the route: href=\"/https:...\"")
	}

	h.incident3()
	body = getPage(t, page)
	for _, want := range []string{
		`class="verdict critical"`, `Node worker-3: <span class="word">critical</span>`, `<div class="finding critical">`,
		"critical: stale_rules &middot; kube-system/kube-dns:dns-tcp (53/tcp)",
		"<tr><th>missing</th><td>10.244.2.7:53, 10.244.2.8:53</td></tr>",
		"<tr><th>explained_by</th><td>kube_proxy_watch_failing</td></tr>",
		`<a href="https://github.com/proxyhealth/proxyhealth/blob/main/docs/runbooks.md#proxyhealthkubeproxyrulesstale">runbook</a>`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("critical page lacks %q", want)
		}
	}
	if strings.Index(body, `id="verdict"`) > strings.Index(body, "<h2>Collectors</h2>") {
		t.Error("the verdict does not open the page")
	}

	// A plain host: the rules collector fails for want of an API, so stale rules are not
	// checked. The page says unknown, in grey, and why; never a green healthy beside the
	// failing collector.
	h = newHealthyNode()
	h.api.configured, h.api.snap = false, cluster.Snapshot{}
	h.rl.lc = rules.CheckSummary{At: t0, Err: errors.New("no Kubernetes API configured")}
	st = newStatus(h.sources(), 10*time.Minute)
	h.now = t0.Add(-10 * time.Minute)
	st.record(st.src.sample())
	h.now = t0
	set.status["rules"] = &CollectorStatus{Name: "rules", OK: false, Err: "no Kubernetes API configured"}
	body = getPage(t, landingPage("/metrics", false, set, st))
	for _, want := range []string{
		`class="verdict unknown"`, `Node worker-3: <span class="word">unknown</span>`,
		"Not known to be healthy: stale_rules could not be checked (why below), and nothing else was found.",
		"<h3>Not checked</h3>", "<li>stale_rules: no Kubernetes API is configured",
		"<td>rules</td><td><b>failing</b></td>",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("plain-host page lacks %q", want)
		}
	}
	if strings.Contains(body, `class="verdict healthy"`) || strings.Contains(body, `class="word">healthy`) || strings.Contains(body, "No finding") {
		t.Errorf("plain-host page says healthy:\n%s", body)
	}
	// Other paths are not the landing page.
	srv := httptest.NewServer(page)
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/nothing")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("GET /nothing: %s", resp.Status)
	}
}

// kube-proxy's version reaches the verdict; outside the tested ones it is a note on the page.
func TestLandingPageKubeProxyVersion(t *testing.T) {
	h := newHealthyNode()
	h.kp.st.Version = "v1.38.1"
	st := newStatus(h.sources(), 10*time.Minute)
	if in := h.sources().input([]factSample{h.sources().sample()}, inputOptions{}); in.KubeProxy.Version != "v1.38.1" {
		t.Errorf("the verdict's kube-proxy version %q, want v1.38.1", in.KubeProxy.Version)
	}
	h.now = t0.Add(-10 * time.Minute)
	st.record(st.src.sample())
	h.now = t0
	page := landingPage("/metrics", false, newCollectorSet(nil, promslog.NewNopLogger()), st)
	body := getPage(t, page)
	want := "<h3>Notes</h3>\n<ul class=\"notes\">\n<li>kube-proxy v1.38.1 is outside the versions proxyhealth is tested with (v1.34 to v1.37)"
	if !strings.Contains(body, want) || !strings.Contains(body, `class="verdict healthy"`) {
		t.Errorf("page lacks %q in a healthy verdict:\n%s", want, body)
	}
	h.kp.st.Version = "v1.37.2"
	if body := getPage(t, page); strings.Contains(body, `class="notes"`) {
		t.Errorf("a tested version has a note:\n%s", body)
	}
}
