//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

const dashboardsExporterPort = 19876

// The value the query test gives Grafana's $__rate_interval: four of the lab's 1 s scrapes and
// more, as Grafana would compute it (max(4 x scrape interval, $__interval + scrape interval)).
const labRateInterval = "15s"

// dashboardQuery is one target of a committed dashboard.
type dashboardQuery struct {
	dashboard, panel, ref, expr string
	instant                     bool
}

// committedDashboardQueries reads every panel target of the committed dashboards.
func committedDashboardQueries(t *testing.T) []dashboardQuery {
	t.Helper()
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(root, "dashboards", "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no dashboards under %s/dashboards (%v)", root, err)
	}
	var qs []dashboardQuery
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var d struct {
			UID    string `json:"uid"`
			Panels []struct {
				Title   string `json:"title"`
				Type    string `json:"type"`
				Targets []struct {
					Expr    string `json:"expr"`
					RefID   string `json:"refId"`
					Instant bool   `json:"instant"`
				} `json:"targets"`
			} `json:"panels"`
		}
		if err := json.Unmarshal(b, &d); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, p := range d.Panels {
			for _, tg := range p.Targets {
				qs = append(qs, dashboardQuery{d.UID, p.Title, tg.RefID, tg.Expr, tg.Instant})
			}
		}
	}
	return qs
}

var unresolvedVariable = regexp.MustCompile(`\$\{?\w+`)

// substitute replaces the dashboards' variables the way Grafana does for a selection: the
// overview with job and node at "All" (their allValue ".+"), the drill-down with the lab node.
// The lab's Prometheus, like any one-cluster Prometheus, puts no cluster label on the series:
// the cluster variable lists nothing and is empty, and cluster="" must match them all.
func (q dashboardQuery) substitute(job, node string) (string, error) {
	expr := strings.NewReplacer(
		"$__rate_interval", labRateInterval,
		"${datasource}", "",
		"$cluster", "",
		"$job", job,
		"$node", node,
	).Replace(q.expr)
	if v := unresolvedVariable.FindString(expr); v != "" {
		return "", fmt.Errorf("variable %s left unsubstituted in %s", v, expr)
	}
	return expr, nil
}

// TestDashboardQueries drives incidents 1 and 3 in one lab with a real control plane, has a
// real Prometheus scrape the exporter, and then runs every query of the committed dashboards
// against Prometheus's HTTP API with the variables substituted: each must parse and return
// data, the per-service panels included. Range targets run as query_range over the test's
// span (as Grafana runs time series panels), instant targets as instant queries (the stat
// panels).
func TestDashboardQueries(t *testing.T) {
	requireKube(t)
	requireExporter(t)
	requirePrometheus(t)
	queries := committedDashboardQueries(t)
	start := time.Now()
	l := newLabRules(t, labRawRules)
	cp := StartControlPlane(t, l, ControlPlaneOptions{})
	kubeconfig := cp.readOnlyKubeconfig("proxyhealth.kubeconfig", apiserverAddr)
	args := append(driftExporterArgs(kubeconfig), kubeProxyExporterArgs(cp)...)
	e := l.StartExporter("proxyhealth", dashboardsExporterPort, nil, append(args, "--conntrack.max-service-series=1", "--conntrack.invalid-reasons")...)
	waitDriftSynced(t, e, cp)
	p := StartPrometheus(t, l, PrometheusOptions{Targets: []string{fmt.Sprintf("127.0.0.1:%d", dashboardsExporterPort)}})
	from := time.Now()

	// Incident 1: two Services whose endpoints are on the client's bridge, bridge netfilter
	// off. The exporter lists one Service per series (--conntrack.max-service-series=1), so
	// the other's flows go to the *_unlisted series, which the dashboards show as well.
	const ns = "lab"
	known := mustValue(t, e.Scrape(t), "proxyhealth_conntrack_service_ports_known", nil)
	const web2VIP = "10.96.0.11"
	for _, s := range []struct{ name, vip, ep string }{{"web", webVIP, podB}, {"web2", web2VIP, podB2}} {
		cp.CreateService(httpService(ns, s.name, s.vip, nil))
		cp.ApplySlice(EndpointSlice(ns, s.name, s.name+"-1", httpSlicePorts, []LabEndpoint{{IP: s.ep, NodeName: labNodeName, Zone: labNodeZone}}))
		cp.WaitServicePortEndpoints(30*time.Second, ns+"/"+s.name+":http", "tcp", []string{s.ep + ":" + podPort})
	}
	l.ServeTCP(l.B, "0.0.0.0:"+podPort)
	e.Poll(t, 10*time.Second, "the exporter to know lab/web's and lab/web2's Service ports", nil, func(s Scrape) (bool, string) {
		v, ok, _ := s.Value("proxyhealth_conntrack_service_ports_known", nil)
		return ok && v >= known+2, s.Series("proxyhealth_conntrack_service_ports_known")
	})
	if ok := l.ConnectMany(l.A, 1, 2*time.Second, webVIP+":80", web2VIP+":80"); ok[0] != 1 || ok[1] != 1 {
		t.Fatalf("lab/web and lab/web2 do not answer with bridge-nf-call-iptables=1 (%v)", ok)
	}
	l.Sysctl("net.bridge.bridge-nf-call-iptables=0")
	t.Cleanup(func() { l.Sysctl("net.bridge.bridge-nf-call-iptables=1") })
	if ok := l.ConnectMany(l.A, 3, 2*time.Second, webVIP+":80", web2VIP+":80"); ok[0] != 0 || ok[1] != 0 {
		t.Fatalf("bridge-nf-call-iptables=0: %v of 3 connections to lab/web and lab/web2 succeeded, want none", ok)
	}
	sameBridge := map[string]string{"reason": "same_bridge"}
	e.Poll(t, 15*time.Second, "6 same_bridge unreplied flows, listed and unlisted", l.ReapExpired, func(s Scrape) (bool, string) {
		unlisted := s.Sum("proxyhealth_conntrack_unreplied_flows_unlisted_total", sameBridge)
		return unlisted >= 3 && s.Sum(unrepliedTotal, sameBridge)+unlisted >= 6,
			s.Series(unrepliedTotal) + s.Series("proxyhealth_conntrack_unreplied_flows_unlisted_total")
	})
	// Incident 2's INVALID packets, so that their rate is not only zeros, named by Service and
	// reason (--conntrack.invalid-reasons): lab/web's take the one series the cap allows,
	// lab/web2's go beyond it.
	l.SendInvalid(l.A, webVIP+":80", 5)
	l.SendInvalid(l.A, web2VIP+":80", 5)
	l.SendInvalid(l.A, podC+":"+blackPort, 20)
	const invalidUnlisted = "proxyhealth_conntrack_invalid_reason_packets_unlisted_total"
	e.Poll(t, 5*time.Second, "INVALID packets named, listed and beyond the cap", nil, func(s Scrape) (bool, string) {
		return s.Sum(invalidReasonTotal, nil) >= 5 && s.Sum(invalidUnlisted, nil) >= 5, s.Series(invalidReasonTotal) + s.Series(invalidUnlisted)
	})

	// Incident 3: kube-proxy's API connection black-holed while the API moves on.
	cp.CreateService(httpService(ns, "backend", "10.96.0.50", nil))
	oldEps, oldAddrs := remoteEndpoints(3, 1, 10)
	cp.ApplySlice(EndpointSlice(ns, "backend", "backend-1", httpSlicePorts, oldEps))
	cp.WaitServicePortEndpoints(30*time.Second, ns+"/backend:http", "tcp", oldAddrs)
	waitConverged(t, e, cp, "lab/backend checked without drift")
	t.Logf("kube-proxy's fault proxy: %s", cp.Blackhole())
	t.Cleanup(func() { cp.Heal() })
	newEps, _ := remoteEndpoints(3, 3, 13)
	cp.ApplySlice(EndpointSlice(ns, "backend", "backend-1", httpSlicePorts, newEps))
	e.Poll(t, 40*time.Second, "lab/backend drifting and kube-proxy's watch errors counted", nil, func(s Scrape) (bool, string) {
		return gauge(t, s, servicesDrifted, nil) == 1 && s.Sum(listErrors, map[string]string{"resource": "services"}) >= 1,
			driftSummary(s) + "\n" + s.Series(listErrors)
	})
	t.Logf("incidents driven %s after start (%s after Prometheus started)", time.Since(start).Round(time.Millisecond), time.Since(from).Round(time.Millisecond))

	// Each query must parse now, and return data within a few scrapes (rates need two).
	vars := map[string][2]string{
		"proxyhealth-overview": {".+", ".+"},
		"proxyhealth-node":     {"proxyhealth", labNodeName},
	}
	passed := 0
	pending := map[int]string{}
	for i := range queries {
		pending[i] = "not run"
	}
	deadline := time.Now().Add(20 * time.Second)
	for len(pending) > 0 {
		for i := range pending {
			q := queries[i]
			v, ok := vars[q.dashboard]
			if !ok {
				t.Fatalf("dashboard %q: no variables for it in this test", q.dashboard)
			}
			expr, err := q.substitute(v[0], v[1])
			if err != nil {
				t.Errorf("%s / %s / %s: %v", q.dashboard, q.panel, q.ref, err)
				delete(pending, i)
				continue
			}
			n, bad, err := runDashboardQuery(p, expr, q.instant, from, time.Now())
			switch {
			case bad:
				t.Errorf("%s / %s / %s: Prometheus rejects the query: %v\n  %s", q.dashboard, q.panel, q.ref, err, expr)
				delete(pending, i)
			case err != nil:
				pending[i] = err.Error()
			case n == 0:
				pending[i] = "no data"
			default:
				passed++
				delete(pending, i)
			}
		}
		if len(pending) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second)
	}
	for i, why := range pending {
		q := queries[i]
		expr, _ := q.substitute(vars[q.dashboard][0], vars[q.dashboard][1])
		t.Errorf("%s / %s / %s: %s\n  %s", q.dashboard, q.panel, q.ref, why, expr)
	}
	t.Logf("%d of %d dashboard queries parsed and returned data; TestDashboardQueries took %s",
		passed, len(queries), time.Since(start).Round(time.Millisecond))
}

// runDashboardQuery runs expr as Grafana would for the target: an instant query at to, or a
// range query over [from, to] at a 1 s step. It returns the number of series in the result;
// bad reports that Prometheus refused the query itself (HTTP 400, bad_data), as opposed to a
// transient failure.
func runDashboardQuery(p *Prometheus, expr string, instant bool, from, to time.Time) (n int, bad bool, err error) {
	params := url.Values{"query": {expr}}
	path := "/api/v1/query"
	if instant {
		params.Set("time", strconv.FormatInt(to.Unix(), 10))
	} else {
		path = "/api/v1/query_range"
		params.Set("start", strconv.FormatInt(from.Unix(), 10))
		params.Set("end", strconv.FormatInt(to.Unix(), 10))
		params.Set("step", "1")
	}
	data, err := p.api(path, params)
	if err != nil {
		return 0, strings.Contains(err.Error(), "bad_data"), err
	}
	var res struct {
		ResultType string            `json:"resultType"`
		Result     []json.RawMessage `json:"result"`
	}
	if err := json.Unmarshal(data, &res); err != nil {
		return 0, false, fmt.Errorf("%v: %s", err, data)
	}
	return len(res.Result), false, nil
}
