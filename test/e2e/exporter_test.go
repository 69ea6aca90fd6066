//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

const (
	unrepliedTotal = "proxyhealth_conntrack_unreplied_flows_total"
	openUnreplied  = "proxyhealth_conntrack_open_unreplied_flows"
	invalidTotal   = "proxyhealth_conntrack_invalid_packets_total"
	eventsTotal    = "proxyhealth_conntrack_events_total"
	bridgeNF       = "proxyhealth_bridge_nf_call_iptables"
	beLiberal      = "proxyhealth_conntrack_tcp_be_liberal"
	dropRule       = "proxyhealth_invalid_drop_rule_present"
	success        = "proxyhealth_collector_success"

	exporterPort = 19869
	nobodyPort   = 19870
	noToolsPort  = 19871
)

// svc selects the unreplied-flow series of one lab Service port and reason.
func svc(name, reason string) map[string]string {
	return map[string]string{"service_namespace": "lab", "service_name": name, "service_port": "80", "protocol": "tcp", "reason": reason}
}

// Exporter is a proxyhealth process running in the lab's node namespace.
type Exporter struct {
	l    *Lab
	p    *proc
	URL  string
	Name string
}

// StartExporter runs proxyhealth in the node namespace on 127.0.0.1:port, behind wrapper
// (e.g. setpriv), and waits until /metrics answers.
func (l *Lab) StartExporter(name string, port int, wrapper []string, extra ...string) *Exporter {
	l.t.Helper()
	requireExporter(l.t)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	args := append([]string{"netns", "exec", l.Node}, wrapper...)
	args = append(args, exporterBin,
		"--web.listen-address="+addr,
		"--conntrack.unreplied-after=1s",
		"--conntrack.service-refresh-interval=1s",
		"--node.rules-check-interval=1s",
	)
	args = append(args, withInvalidReasonsStateDir(l.t, extra)...)
	e := &Exporter{l: l, URL: "http://" + addr + "/metrics", Name: name}
	e.p = l.start(exec.Command("ip", args...), name)
	waitFor(l.t, 15*time.Second, name+" /metrics", func() (bool, string) {
		if e.p.Exited() {
			b, _ := os.ReadFile(e.p.log)
			l.t.Fatalf("%s exited at start:\n%s", name, b)
		}
		_, err := l.Get(l.Node, e.URL)
		return err == nil, fmt.Sprint(err)
	})
	return e
}

// withInvalidReasonsStateDir gives args with --conntrack.invalid-reasons a state directory of
// the test's own, unless they name one: the default, /run/proxyhealth, is the machine's.
func withInvalidReasonsStateDir(t *testing.T, args []string) []string {
	t.Helper()
	if !slices.Contains(args, "--conntrack.invalid-reasons") || slices.ContainsFunc(args, func(a string) bool {
		return strings.HasPrefix(a, "--conntrack.invalid-reasons.state-dir")
	}) {
		return args
	}
	return append(slices.Clip(args), "--conntrack.invalid-reasons.state-dir="+t.TempDir())
}

// Scrape fetches and parses /metrics.
func (e *Exporter) Scrape(t *testing.T) Scrape {
	t.Helper()
	body, err := e.l.Get(e.l.Node, e.URL)
	if err != nil {
		t.Fatalf("scraping %s: %v", e.Name, err)
	}
	s, err := parseScrape(body)
	if err != nil {
		t.Fatalf("parsing %s's scrape: %v", e.Name, err)
	}
	return s
}

// Poll scrapes until cond holds, every 200ms, for at most timeout; before each scrape it runs
// prepare when not nil. On timeout the test fails and stops.
func (e *Exporter) Poll(t *testing.T, timeout time.Duration, what string, prepare func(), cond func(Scrape) (bool, string)) Scrape {
	t.Helper()
	s, ok := e.poll(t, timeout, what, prepare, cond)
	if !ok {
		t.FailNow()
	}
	return s
}

// poll is Poll that reports a timeout as an error and lets the test go on.
func (e *Exporter) poll(t *testing.T, timeout time.Duration, what string, prepare func(), cond func(Scrape) (bool, string)) (Scrape, bool) {
	t.Helper()
	timeout *= waitScale
	deadline := time.Now().Add(timeout)
	for {
		if prepare != nil {
			prepare()
		}
		s := e.Scrape(t)
		ok, detail := cond(s)
		if ok {
			return s, true
		}
		if time.Now().After(deadline) {
			t.Errorf("%s: timed out after %s waiting for %s; last scrape: %s", e.Name, timeout, what, detail)
			return s, false
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// WaitValue polls until name{labels} exists and equals want; a timeout is reported as an
// error and the test goes on (these settings gauges are independent of each other).
func (e *Exporter) WaitValue(t *testing.T, timeout time.Duration, name string, labels map[string]string, want float64) bool {
	t.Helper()
	_, ok := e.poll(t, timeout, fmt.Sprintf("%s%s == %g", name, fmtLabels(labels), want), nil, func(s Scrape) (bool, string) {
		v, ok, err := s.Value(name, labels)
		if err != nil {
			return false, err.Error()
		}
		return ok && v == want, s.Series(name)
	})
	return ok
}

// checkValue reports an error unless name{labels} is present in s and equals want.
func checkValue(t *testing.T, s Scrape, name string, labels map[string]string, want float64) {
	t.Helper()
	v, ok, err := s.Value(name, labels)
	switch {
	case err != nil:
		t.Error(err)
	case !ok:
		t.Errorf("%s%s absent, want %g; have: %s", name, fmtLabels(labels), want, s.Series(name))
	case v != want:
		t.Errorf("%s%s = %g, want %g", name, fmtLabels(labels), v, want)
	}
}

// mustValue returns name{labels} from s and fails when it is absent.
func mustValue(t *testing.T, s Scrape, name string, labels map[string]string) float64 {
	t.Helper()
	v, ok, err := s.Value(name, labels)
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		t.Fatalf("%s%s absent; have: %s", name, fmtLabels(labels), s.Series(name))
	}
	return v
}

// TestExporter runs the exporter in a lab node and checks its scrape against incidents 1 and 2
// reproduced on the real kernel. The subtests share one lab and one exporter and run in order;
// each compares counters before and after its own traffic.
func TestExporter(t *testing.T) {
	requireExporter(t)
	l := newLab(t)
	l.ServeTCP(l.B, "0.0.0.0:"+podPort)
	e := l.StartExporter("proxyhealth", exporterPort, nil, "--log.level=debug")

	t.Run("incident1_same_bridge", func(t *testing.T) { testIncident1(t, l.In(t), e) })
	t.Run("remote_endpoint_and_no_service", func(t *testing.T) { testRemoteAndNoService(t, l.In(t), e) })
	t.Run("incident2_invalid_and_settings", func(t *testing.T) { testIncident2(t, l.In(t), e) })
	t.Run("no_capability", func(t *testing.T) { testNoCapability(t, l.In(t)) })
	t.Run("no_iptables_binaries", func(t *testing.T) { testNoBinaries(t, l.In(t)) })
	// Last, when the incidents have made the per-service series exist.
	t.Run("scrape_matches_readme", func(t *testing.T) { testScrapeMatchesReadme(t, e.Scrape(t)) })
}

// testIncident1: bridge-nf-call-iptables=0 breaks a Service whose endpoint is on the client's
// bridge; every such connection must show up as a same_bridge unreplied flow of lab/web:80, and
// nothing once the setting is back to 1.
func testIncident1(t *testing.T, l *Lab, e *Exporter) {
	web := svc("web", "same_bridge")
	anyWeb := map[string]string{"service_name": "web"}

	s := e.Scrape(t)
	checkValue(t, s, bridgeNF, nil, 1)
	base, baseAny := s.Sum(unrepliedTotal, web), s.Sum(unrepliedTotal, anyWeb)
	baseNew := s.Sum(eventsTotal, map[string]string{"event": "new"})

	l.Sysctl("net.bridge.bridge-nf-call-iptables=0")
	t.Cleanup(func() { l.Sysctl("net.bridge.bridge-nf-call-iptables=1") })
	e.WaitValue(t, 3*time.Second, bridgeNF, nil, 0)

	const n = 3
	if ok := l.Connect(l.A, webVIP+":80", n, 2*time.Second); ok != 0 {
		t.Fatalf("bridge-nf-call-iptables=0: %d of %d connections to the web VIP succeeded, want 0", ok, n)
	}
	// The reproduction itself, before the flows expire (syn_sent timeout 5s).
	assertUnrepliedToB(t, l.UnrepliedTo(webVIP), n)

	e.Poll(t, 3*time.Second, "open same_bridge unreplied flows of lab/web >= 1", nil, func(s Scrape) (bool, string) {
		return s.Sum(openUnreplied, web) >= 1, s.Series(openUnreplied)
	})
	s = e.Poll(t, 15*time.Second, fmt.Sprintf("%s%s to rise by %d", unrepliedTotal, fmtLabels(web), n), l.ReapExpired, func(s Scrape) (bool, string) {
		return s.Sum(unrepliedTotal, web)-base >= n, s.Series(unrepliedTotal)
	})
	if got := s.Sum(unrepliedTotal, web) - base; got != n {
		t.Errorf("%s%s rose by %g, want exactly %d (one per connection)", unrepliedTotal, fmtLabels(web), got, n)
	}
	if got := s.Sum(unrepliedTotal, anyWeb) - baseAny; got != n {
		t.Errorf("all unreplied flows of lab/web rose by %g, want %d (all same_bridge):\n%s", got, n, s.Series(unrepliedTotal))
	}
	if got := s.Sum(eventsTotal, map[string]string{"event": "new"}) - baseNew; got < n {
		t.Errorf("%s{event=\"new\"} rose by %g, want >= %d", eventsTotal, got, n)
	}
	e.Poll(t, 3*time.Second, "no open unreplied flows of lab/web once they ended", nil, func(s Scrape) (bool, string) {
		return s.Sum(openUnreplied, anyWeb) == 0, s.Series(openUnreplied)
	})
	// The fix: the same connections succeed and add nothing.
	l.Sysctl("net.bridge.bridge-nf-call-iptables=1")
	e.WaitValue(t, 3*time.Second, bridgeNF, nil, 1)
	s = e.Scrape(t)
	base, baseDestroy := s.Sum(unrepliedTotal, anyWeb), s.Sum(eventsTotal, map[string]string{"event": "destroy"})
	if ok := l.Connect(l.A, webVIP+":80", n, 2*time.Second); ok != n {
		t.Fatalf("bridge-nf-call-iptables=1: %d of %d connections succeeded, want %d", ok, n, n)
	}
	// Wait until the exporter has seen the replied flows end (time_wait shortened to 2s).
	s = e.Poll(t, 10*time.Second, "the replied flows' DESTROY events", l.ReapExpired, func(s Scrape) (bool, string) {
		return s.Sum(eventsTotal, map[string]string{"event": "destroy"})-baseDestroy >= n, s.Series(eventsTotal)
	})
	if got := s.Sum(unrepliedTotal, anyWeb) - base; got != 0 {
		t.Errorf("replied flows counted as unreplied: %s of lab/web rose by %g:\n%s", unrepliedTotal, got, s.Series(unrepliedTotal))
	}
	if got := s.Sum(openUnreplied, anyWeb); got != 0 {
		t.Errorf("%s of lab/web = %g after replied flows:\n%s", openUnreplied, got, s.Series(openUnreplied))
	}
}

// testRemoteAndNoService: an endpoint on another node that never answers gives
// remote_endpoint; a DNAT no Service owns gives no_service with empty service labels.
func testRemoteAndNoService(t *testing.T, l *Lab, e *Exporter) {
	remote := svc("web-remote", "remote_endpoint")
	anyRemote := map[string]string{"service_name": "web-remote"}
	noSvc := map[string]string{"service_namespace": "", "service_name": "", "service_port": "", "reason": "no_service"}

	s := e.Scrape(t)
	baseR, baseAny, baseN := s.Sum(unrepliedTotal, remote), s.Sum(unrepliedTotal, anyRemote), s.Sum(unrepliedTotal, noSvc)

	const nRemote, nPlain = 2, 2
	ok := l.ConnectMany(l.A, nRemote, 2*time.Second, remoteVIP+":80", plainVIP+":80")
	if ok[0] != 0 || ok[1] != 0 {
		t.Fatalf("connections to C answered (%v), want none: C drops port %s", ok, podPort)
	}
	if got := len(l.UnrepliedTo(remoteVIP)); got != nRemote {
		t.Errorf("conntrack shows %d unreplied flows to %s, want %d", got, remoteVIP, nRemote)
	}
	if got := len(l.UnrepliedTo(plainVIP)); got != nPlain {
		t.Errorf("conntrack shows %d unreplied flows to %s, want %d", got, plainVIP, nPlain)
	}
	e.Poll(t, 3*time.Second, "open remote_endpoint and no_service unreplied flows", nil, func(s Scrape) (bool, string) {
		return s.Sum(openUnreplied, remote) >= 1 && s.Sum(openUnreplied, noSvc) >= 1, s.Series(openUnreplied)
	})
	s = e.Poll(t, 15*time.Second, "remote_endpoint and no_service unreplied counters to rise", l.ReapExpired, func(s Scrape) (bool, string) {
		return s.Sum(unrepliedTotal, remote)-baseR >= nRemote && s.Sum(unrepliedTotal, noSvc)-baseN >= nPlain, s.Series(unrepliedTotal)
	})
	if got := s.Sum(unrepliedTotal, remote) - baseR; got != nRemote {
		t.Errorf("%s%s rose by %g, want %d", unrepliedTotal, fmtLabels(remote), got, nRemote)
	}
	if got := s.Sum(unrepliedTotal, anyRemote) - baseAny; got != nRemote {
		t.Errorf("all unreplied flows of lab/web-remote rose by %g, want %d (all remote_endpoint):\n%s", got, nRemote, s.Series(unrepliedTotal))
	}
	if got := s.Sum(unrepliedTotal, noSvc) - baseN; got != nPlain {
		t.Errorf("%s%s rose by %g, want %d:\n%s", unrepliedTotal, fmtLabels(noSvc), got, nPlain, s.Series(unrepliedTotal))
	}
}

// testIncident2: every INVALID packet through the node counts, exactly; be_liberal and the
// INVALID drop rule, the two fixes, are reported as they change.
func testIncident2(t *testing.T, l *Lab, e *Exporter) {
	s := e.Scrape(t)
	before := mustValue(t, s, invalidTotal, nil)
	kernelBefore := l.ConntrackInvalid()

	const n = 50
	l.SendInvalid(l.A, podC+":"+blackPort, n)
	s = e.Poll(t, 3*time.Second, fmt.Sprintf("%s to rise by %d", invalidTotal, n), nil, func(s Scrape) (bool, string) {
		return mustValue(t, s, invalidTotal, nil)-before >= n, s.Series(invalidTotal)
	})
	if got := mustValue(t, s, invalidTotal, nil) - before; got != n {
		t.Errorf("%s rose by %g, want exactly %d", invalidTotal, got, n)
	}
	if got := l.ConntrackInvalid() - kernelBefore; got != n {
		t.Errorf("kernel (conntrack -S) invalid rose by %d, want %d: the lab is not quiet", got, n)
	}

	t.Run("be_liberal", func(t *testing.T) {
		checkValue(t, s, beLiberal, nil, 0)
		l := l.In(t)
		l.Sysctl("net.netfilter.nf_conntrack_tcp_be_liberal=1")
		t.Cleanup(func() { l.Sysctl("net.netfilter.nf_conntrack_tcp_be_liberal=0") })
		if e.WaitValue(t, 2*time.Second, beLiberal, nil, 1) {
			l.Sysctl("net.netfilter.nf_conntrack_tcp_be_liberal=0")
			e.WaitValue(t, 2*time.Second, beLiberal, nil, 0)
		}
	})
	t.Run("invalid_drop_rule", func(t *testing.T) {
		l := l.In(t)
		rule := []string{"KUBE-FORWARD", "-m", "conntrack", "--ctstate", "INVALID", "-j", "DROP"}
		if !e.WaitValue(t, 3*time.Second, dropRule, nil, 0) {
			return
		}
		l.MustExec(l.Node, append([]string{"iptables-nft", "-A"}, rule...)...)
		if e.WaitValue(t, 5*time.Second, dropRule, nil, 1) {
			l.MustExec(l.Node, append([]string{"iptables-nft", "-D"}, rule...)...)
			e.WaitValue(t, 5*time.Second, dropRule, nil, 0)
		}
	})
}

var permissionRE = regexp.MustCompile(`(?i)CAP_NET_ADMIN|permission denied|operation not permitted`)

// testNoCapability: an exporter without CAP_NET_ADMIN keeps serving, reports the conntrack
// collector as failing, still reads the sysctls, and says what is missing once, not per scrape.
func testNoCapability(t *testing.T, l *Lab) {
	wrapper := []string{"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all"}
	// Info level: the log as an operator runs it (debug repeats "still failing" by design).
	e := l.StartExporter("proxyhealth-nobody", nobodyPort, wrapper, "--log.level=info")

	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", e.p.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Uid:\t65534", "CapEff:\t0000000000000000"} {
		if !strings.Contains(string(status), want) {
			t.Fatalf("exporter not running unprivileged: want %q in its status:\n%s", want, status)
		}
	}

	const scrapes = 3
	var afterFirst []string
	for i := 0; i < scrapes; i++ {
		if i > 0 {
			time.Sleep(time.Second) // let background retries (1s intervals in the lab) show in the log
		}
		s := e.Scrape(t)
		checkValue(t, s, success, map[string]string{"collector": "conntrack"}, 0)
		// The sysctls are readable without capabilities.
		checkValue(t, s, bridgeNF, nil, 1)
		checkValue(t, s, beLiberal, nil, 0)
		if i == 0 {
			// Each background check has had its first try by the second scrape: what is
			// missing is said by then, and must not be said again.
			time.Sleep(time.Second)
			afterFirst = permissionLines(t, e.p.log)
		}
	}

	lines := permissionLines(t, e.p.log)
	t.Logf("permission lines after %d scrapes:\n%s", scrapes, strings.Join(lines, "\n"))
	if len(lines) != len(afterFirst) {
		t.Errorf("permission lines grew from %d after the first scrape to %d after %d: logged per scrape, not once",
			len(afterFirst), len(lines), scrapes)
	}
	// Once: no message is repeated (a collector may say two different things, e.g. netlink and
	// iptables both refused, but each once).
	seen := map[string]int{}
	namesCap := false
	for _, line := range lines {
		key := logField(line, "collector") + " " + logField(line, "msg")
		seen[key]++
		if logField(line, "collector") == "conntrack" && strings.Contains(line, "CAP_NET_ADMIN") {
			namesCap = true
		}
	}
	for key, n := range seen {
		if n > 1 {
			t.Errorf("logged %d times, want once: %s", n, key)
		}
	}
	if !namesCap {
		t.Errorf("no conntrack collector log line names CAP_NET_ADMIN as what is missing")
	}
}

// testNoBinaries runs an exporter that finds no iptables or nft binary (an empty PATH): it
// needs none, since it reads netfilter in-process, so every collector that needs no API serves
// as with them, the INVALID drop check included, and no child process is ever run.
func testNoBinaries(t *testing.T, l *Lab) {
	e := l.StartExporter("proxyhealth-no-tools", noToolsPort, []string{"env", "PATH=/nonexistent"}, "--log.level=info")
	s := e.Poll(t, 15*time.Second, "the node collector's INVALID drop check", nil, func(s Scrape) (bool, string) {
		_, ok := s[dropRule]
		return ok, s.Series(dropRule)
	})
	checkValue(t, s, success, map[string]string{"collector": "node"}, 1)
	checkValue(t, s, success, map[string]string{"collector": "conntrack"}, 1)
	checkValue(t, s, bridgeNF, nil, 1)
	log, err := os.ReadFile(e.p.log)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(log), "not found") || strings.Contains(string(log), "executable file") {
		t.Errorf("the exporter looked for a binary:\n%s", log)
	}
}

// permissionLines returns the log lines that tell a permission is missing.
func permissionLines(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if permissionRE.MatchString(line) {
			out = append(out, line)
		}
	}
	return out
}

// logField returns the value of key in a logfmt line ("" when absent), unquoted.
func logField(line, key string) string {
	i := strings.Index(line, " "+key+"=")
	if i < 0 {
		return ""
	}
	rest := line[i+len(key)+2:]
	if strings.HasPrefix(rest, `"`) {
		if v, err := strconv.QuotedPrefix(rest); err == nil {
			u, _ := strconv.Unquote(v)
			return u
		}
	}
	if j := strings.IndexByte(rest, ' '); j >= 0 {
		return rest[:j]
	}
	return rest
}
