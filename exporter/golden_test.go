package exporter

import (
	"bytes"
	"context"
	"flag"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alecthomas/kingpin/v2"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/common/promslog"

	phcollectors "github.com/proxyhealth/proxyhealth/collectors"
	"github.com/proxyhealth/proxyhealth/collectors/collectortest"
	"github.com/proxyhealth/proxyhealth/collectors/conntrack"
	"github.com/proxyhealth/proxyhealth/collectors/kubeproxy"
	"github.com/proxyhealth/proxyhealth/collectors/node"
	"github.com/proxyhealth/proxyhealth/collectors/rules"
	"github.com/proxyhealth/proxyhealth/internal/cluster"
	"github.com/proxyhealth/proxyhealth/internal/kubeauth"
	"github.com/proxyhealth/proxyhealth/internal/nodecondition"
	"github.com/proxyhealth/proxyhealth/internal/reportwriter"
	"github.com/proxyhealth/proxyhealth/internal/verdict"
	authenticationv1 "k8s.io/api/authentication/v1"
)

var update = flag.Bool("update", false, "rewrite testdata/golden-scrape*.txt from this run (go test ./exporter -run Golden -update)")

// A golden scrape is one whole scrape of the exporter, every collector enabled with default
// flags but for those testGoldenScrape sets, run on fixtures. It freezes the exposition: metric
// names, types, help texts, labels and values. There is one per kube-proxy mode whose rules
// the drift check reads.
type golden struct {
	file string // the scrape, under testdata
	// captureDir holds a real kube-proxy's rules and the API objects it programmed them from.
	captureDir string
	// rules is the node's netfilter state with captureDir's rules, read at at: the kernel's
	// recorded answers, decoded by the exporter's own netfilter readers.
	rules func(t *testing.T, at time.Time) goldenRules
}

var (
	goldenIPTables = golden{"testdata/golden-scrape.txt", rulesCaptureDir, nodeRules}
	goldenNFTables = golden{"testdata/golden-scrape-nftables.txt", nftRulesCaptureDir, nftNodeRules}
)

// The golden scrape's two instants. At checkedAt the collectors start: the node's rules check
// runs, the first drift check sees the API's endpoints differ from kube-proxy's rules, and the
// conntrack events arrive. The scrape is at scrapedAt, 90 s later: past the drift grace period
// (60 s) and --conntrack.unreplied-after (3 s). kube-proxy's log and metrics are from
// 2026-11-21 21:00:40-48 UTC, when its watches failed.
var (
	checkedAt = time.Date(2026, 11, 21, 21, 3, 30, 0, time.UTC)
	scrapedAt = checkedAt.Add(90 * time.Second)
)

// TestGoldenScrape runs every collector (conntrack, node, rules, kubeproxy) and the exporter's
// own series together on fixtures alone (no root, no netlink, no network beyond loopback, no
// API server; the node's netfilter rules are the kernel's recorded answers to the exporter's
// readers, decoded by those readers), scrapes the metrics handler once and compares the whole
// exposition with testdata/golden-scrape.txt; docs/metrics.md is then held to that file. The
// node is in incident 3: kube-proxy's watches died, the API moved on, its rules did not; and flows
// to a deleted pod, to local endpoints and to no Service go unreplied. kube-proxy is in
// iptables mode, with its conntrack INVALID drop on the forward path.
//
// After an intended change of the exposition, rewrite the file with
//
//	go test ./exporter -run Golden -update
//
// and review its diff: every line of it is a change users see.
func TestGoldenScrape(t *testing.T) { testGoldenScrape(t, goldenIPTables) }

// TestGoldenScrapeNFTables is TestGoldenScrape's node with kube-proxy in nftables mode
// (testdata/golden-scrape-nftables.txt): its drift check reads kube-proxy's nftables chains,
// and no INVALID drop is on the forward path, since that mode adds none.
func TestGoldenScrapeNFTables(t *testing.T) { testGoldenScrape(t, goldenNFTables) }

func testGoldenScrape(t *testing.T, g golden) {
	clock := &fixedClock{}
	clock.set(checkedAt)
	view := goldenAPIView(t, g.captureDir, scrapedAt.Add(-5*time.Second))
	kernel := newConntrackKernel(t)
	kernel.invalid = invalidLogFixture(t, view.Snap, kernel.events.release)
	procfs := goldenProcfs(t)
	kp := kubeProxy(t)
	logPattern, writeLog := kubeProxyLog(t)

	app := kingpin.New("proxyhealth", "")
	paths := addPathFlags(app)
	var (
		conntrackCfg conntrack.Config
		nodeCfg      node.Config
		rulesCfg     rules.Config
		kubeproxyCfg kubeproxy.Config
	)
	conntrackCfg.AddFlags(app)
	nodeCfg.AddFlags(app)
	rulesCfg.AddFlags(app)
	kubeproxyCfg.AddFlags(app)
	if _, err := app.Parse([]string{
		"--path.procfs=" + procfs,
		"--conntrack.invalid-reasons",
		"--conntrack.invalid-reasons.state-dir=" + t.TempDir(),
		// Two label sets per series: the conntrack events make three, and the third shows
		// in the *_unlisted series.
		"--conntrack.max-service-series=2",
		// The drift check repeats at once; each check at one instant of the fixed clock
		// finds the same, and the test waits for one at the scrape's instant.
		"--rules.check-interval=10ms",
		"--kubeproxy.log-path=" + logPattern,
		"--kubeproxy.log-poll-interval=10ms",
		"--kubeproxy.metrics-url=" + kp.URL + "/metrics",
		"--kubeproxy.health-url=" + kp.URL + "/livez",
	}); err != nil {
		t.Fatal(err)
	}
	// The node's netfilter state, read once at checkedAt, shared as the exporter shares it.
	host := g.rules(t, checkedAt)
	conntrackCfg.ProcPath, conntrackCfg.View, conntrackCfg.Rules, conntrackCfg.Kernel, conntrackCfg.Now = paths.ProcFS, view, host, kernel, clock.now
	nodeCfg.ProcPath, nodeCfg.Rules = paths.ProcFS, host
	rulesCfg.View, rulesCfg.Rules, rulesCfg.Now, rulesCfg.MinCheckGap = view, host, clock.now, 10*time.Millisecond
	kubeproxyCfg.Now = clock.now

	logger := promslog.NewNopLogger()
	conntrackC, err := conntrack.New(conntrackCfg, logger)
	if err != nil {
		t.Fatal(err)
	}
	nodeC, err := node.New(nodeCfg, logger)
	if err != nil {
		t.Fatal(err)
	}
	rulesC, err := rules.New(rulesCfg, logger)
	if err != nil {
		t.Fatal(err)
	}
	kubeproxyC, err := kubeproxy.New(kubeproxyCfg, logger)
	if err != nil {
		t.Fatal(err)
	}
	built := map[string]phcollectors.Collector{conntrack.Name: conntrackC, node.Name: nodeC, rules.Name: rulesC, kubeproxy.Name: kubeproxyC}
	registry := newRegistry(newCollectorSet(built, logger), true)
	registry.MustRegister(cluster.NewHealthCollector(view))
	// --node-conditions' series, after its first round on a healthy node.
	conditions, err := nodecondition.New(acceptingAPI{}, nodecondition.Config{NodeName: "lab-node", HeartbeatInterval: 5 * time.Minute}, logger)
	if err != nil {
		t.Fatal(err)
	}
	conditions.Publish(context.Background(), verdict.Report{Node: "lab-node", Verdict: verdict.Healthy})
	registry.MustRegister(conditions)
	// --node-report's, after its first write.
	report, err := reportwriter.New(acceptingAPI{}, reportwriter.Config{NodeName: "lab-node", Namespace: "proxyhealth", MinInterval: 30 * time.Second, Heartbeat: 5 * time.Minute}, logger)
	if err != nil {
		t.Fatal(err)
	}
	report.Write(context.Background(), verdict.Report{Node: "lab-node", Verdict: verdict.Healthy})
	registry.MustRegister(report)

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, r := range []phcollectors.Runner{conntrackC, rulesC, kubeproxyC} {
		wg.Go(func() { r.Run(ctx) })
	}
	t.Cleanup(func() { cancel(); wg.Wait() })

	// At checkedAt: the background work's first results.
	waitFor(t, "the node's INVALID-drop check", nodeC, "proxyhealth_node_rules_last_check_timestamp_seconds", unixSeconds(checkedAt))
	waitFor(t, "the first drift check", rulesC, "proxyhealth_rules_last_check_timestamp_seconds", unixSeconds(checkedAt))
	// Events are attributed with the Service map of their time: let them flow once it is
	// loaded from the API view, as it is a second after start on a node.
	waitFor(t, "conntrack's Service map", conntrackC, "proxyhealth_conntrack_service_ports_known", float64(len(view.Snap.Ports)))
	kernel.release(t)
	waitFor(t, "conntrack's INVALID log read", conntrackC, "proxyhealth_conntrack_invalid_reason_packets_lost_total", 1)
	// kube-proxy's log is read from its end when the exporter starts: the failures are
	// written once it follows the file.
	waitFor(t, "kube-proxy's log followed", kubeproxyC, "proxyhealth_kubeproxy_log_files_followed", 1)
	lines := writeLog()
	waitFor(t, "kube-proxy's log read", kubeproxyC, "proxyhealth_kubeproxy_log_lines_total", float64(lines))
	waitFor(t, "kube-proxy polled", kubeproxyC, "proxyhealth_kubeproxy_up", 1)

	// At scrapedAt: a drift check past the grace period, then the scrape.
	clock.set(scrapedAt)
	waitFor(t, "a drift check past the grace period", rulesC, "proxyhealth_rules_last_check_timestamp_seconds", unixSeconds(scrapedAt))
	// The scrape passes --web.kubernetes-auth's check, answered by the test's reviewer: its
	// counters show one token accepted and one access allowed.
	auth, err := kubeauth.New(kubeauth.Config{}, goldenReviewer{}, logger)
	if err != nil {
		t.Fatal(err)
	}
	registry.MustRegister(auth)
	srv := httptest.NewServer(auth.Wrap(metricsHandler(registry, logger, 1)))
	defer srv.Close()
	req, err := http.NewRequest(http.MethodGet, srv.URL+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer prometheus")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape: %s, %v", resp.Status, err)
	}
	got := normalise(body)

	if *update {
		if err := os.WriteFile(g.file, got, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s", g.file)
	}
	want, err := os.ReadFile(g.file)
	if err != nil {
		t.Fatalf("%v (create it with -update)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("the scrape differs from %s (if intended: go test ./exporter -run Golden -update, and review the diff):\n%s", g.file, lineDiff(want, got))
	}
	checkReadmeAgainst(t, g.file, want)
}

// goldenReviewer accepts the token "prometheus" and lets its user get /metrics.
type goldenReviewer struct{}

func (goldenReviewer) ReviewToken(_ context.Context, token string) (authenticationv1.UserInfo, bool, error) {
	return authenticationv1.UserInfo{Username: "system:serviceaccount:monitoring:prometheus"}, token == "prometheus", nil
}

func (goldenReviewer) ReviewAccess(_ context.Context, u authenticationv1.UserInfo, verb, path string) (bool, string, error) {
	return verb == "get" && path == "/metrics", "", nil
}

// normalise makes a scrape comparable between runs and machines. It changes only what no
// fixture or clock can fix, and keeps every family and label name:
//
//   - go_* and process_* (the exporter's own runtime, served unless
//     --web.disable-exporter-metrics): memory, goroutines, CPU and file descriptors of the test
//     process, and a set of families that changes with the Go release. They are dropped.
//   - proxyhealth_collector_duration_seconds: the wall time each collector's Update took. Its
//     values are set to 0.
//   - proxyhealth_build_info: its label values describe the build that runs the test (version
//     and revision are empty in a test binary; goversion, goos, goarch, tags follow the
//     toolchain and flags). They are set to "normalised".
func normalise(scrape []byte) []byte {
	var out bytes.Buffer
	for _, line := range strings.SplitAfter(string(scrape), "\n") {
		name, sample := familyOf(line)
		switch {
		case strings.HasPrefix(name, "go_"), strings.HasPrefix(name, "process_"):
			continue
		case sample && name == "proxyhealth_collector_duration_seconds":
			line = line[:strings.LastIndexByte(line, ' ')+1] + "0\n"
		case sample && name == "proxyhealth_build_info":
			line = labelValue.ReplaceAllString(line, `="normalised"`)
		}
		out.WriteString(line)
	}
	return out.Bytes()
}

var labelValue = regexp.MustCompile(`="[^"]*"`)

// familyOf returns the metric name of an exposition line ("# HELP name ...", "# TYPE name ...",
// "name{labels} value") and whether it is a sample.
func familyOf(line string) (name string, sample bool) {
	if rest, ok := strings.CutPrefix(line, "# "); ok {
		f := strings.Fields(rest)
		if len(f) >= 2 {
			return f[1], false
		}
		return "", false
	}
	end := strings.IndexAny(line, "{ ")
	if end < 0 {
		return "", false
	}
	return line[:end], true
}

// checkReadmeAgainst holds the metrics reference (docs/metrics.md) to a golden scrape (file): every proxyhealth_
// family of the scrape is documented there with its type and label names (any other family is
// at least named in docs/metrics.md), and every documented metric is in the scrape: the fixtures
// produce each one, none is excused.
func checkReadmeAgainst(t *testing.T, file string, scrape []byte) {
	t.Helper()
	docs := readmeMetrics(t)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(scrape))
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	readme, err := os.ReadFile("../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	for name, fam := range families {
		if !strings.HasPrefix(name, "proxyhealth_") {
			// The table lists proxyhealth's own metrics; the handler's are named in its text.
			if !bytes.Contains(readme, []byte("`"+name+"`")) {
				t.Errorf("%s is in %s but docs/metrics.md does not name it", name, file)
			}
			continue
		}
		doc, ok := docs[name]
		if !ok {
			t.Errorf("%s is in %s but not in docs/metrics.md's table", name, file)
			continue
		}
		typ := strings.ToLower(fam.GetType().String())
		for _, m := range fam.GetMetric() {
			if got := typ + " {" + strings.Join(labelNames(m), ",") + "}"; got != doc.Signature() {
				t.Errorf("%s: %s in %s, %s in docs/metrics.md", name, got, file, doc.Signature())
				break
			}
		}
	}
	for name := range docs {
		// The netfilter reader's own series (internal/hostrules.Source) count its reads of
		// the kernel: the scrape here serves a fixed read instead, so they are held to the
		// docs/metrics.md by readme_test.go's descriptors and to their values by hostrules' tests.
		if strings.HasPrefix(name, "proxyhealth_netfilter_") {
			continue
		}
		if _, ok := families[name]; !ok {
			t.Errorf("%s is in docs/metrics.md's table but not in %s", name, file)
		}
	}
}

func labelNames(m *dto.Metric) []string {
	var names []string
	for _, l := range m.GetLabel() {
		names = append(names, l.GetName())
	}
	sort.Strings(names)
	return names
}

// waitFor waits until collector c sends metric name with value want (a gauge or counter without
// labels, or the first of its series).
func waitFor(t *testing.T, what string, c phcollectors.Collector, name string, want float64) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		s, _ := collectortest.Collect(t, c)
		v, ok := s.Value(name)
		if ok && v == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: %s is %v (sent: %v), want %v", what, name, v, ok, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func unixSeconds(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }

// lineDiff lists the lines only in want (-) and only in got (+), in order.
func lineDiff(want, got []byte) string {
	w, g := strings.Split(string(want), "\n"), strings.Split(string(got), "\n")
	inW, inG := map[string]int{}, map[string]int{}
	for _, l := range w {
		inW[l]++
	}
	for _, l := range g {
		inG[l]++
	}
	var b strings.Builder
	for _, l := range w {
		if inG[l] == 0 {
			b.WriteString("- " + l + "\n")
		}
	}
	for _, l := range g {
		if inW[l] == 0 {
			b.WriteString("+ " + l + "\n")
		}
	}
	if b.Len() == 0 {
		b.WriteString("(the same lines, in another order or number)\n")
	}
	return b.String()
}
