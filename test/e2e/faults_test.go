//go:build e2e

package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/proxyhealth/proxyhealth/internal/testsupport/netnsdial"
)

// The faults suite: the reproductions of how a hostile or broken node once hurt the exporter,
// each run against the real binary in a lab node namespace. Every case asserts what the
// exporter is held to: peak memory under a stated bound, scrapes answered within a scrape
// timeout, the fault reported (with its reason, once), and nothing left behind (goroutines,
// file descriptors, child processes). The bounds are generous on purpose: they tell a leak or
// a whole-body read from normal work, not one machine's speed.
//
// Covered elsewhere, not repeated here: bad flags (exporter.TestBadFlags, one table over all
// flags; one case below checks the real binary's exit code), an exporter that needs no child
// process (TestExporter/no_iptables_binaries), and the exporter's own API connection
// black-holed (TestDrift/exporter_connection_dead, with the real apiserver).

const (
	faultsPort      = 19872
	faultsPprofPort = 19873
	faultsLimitPort = 19874
	fakeKPAddr      = "127.0.0.1:19249" // a fake kube-proxy's metrics and health endpoints

	// peakRSSBound is the most the exporter may ever hold resident (VmHWM) in this suite: a
	// third of the DaemonSet's 384 MiB limit. Reading a 32 MiB metrics body whole took about
	// 480 MB, the command output of a huge ruleset 1.6 GB.
	peakRSSBound = 128 << 20
	// scrapeTimeout is Prometheus's default: a scrape answered later than this is lost.
	scrapeTimeout = 10 * time.Second
	// The exporter's HTTP server's ReadHeaderTimeout (exporter/server.go).
	readHeaderTimeout = 10 * time.Second

	goroutineSlack = 10
	fdSlack        = 5
)

// procState is what /proc and one scrape tell about the exporter.
type procState struct {
	hwm        int64 // VmHWM, bytes
	fds        int
	children   int
	goroutines float64
}

func (e *Exporter) pid() int { return e.p.cmd.Process.Pid }

// state reads the exporter's peak RSS, open fds, children and (from a scrape) goroutines.
func (e *Exporter) state(t *testing.T) procState {
	t.Helper()
	pid := e.pid()
	var st procState
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "VmHWM:" {
			kib, _ := strconv.ParseInt(f[1], 10, 64)
			st.hwm = kib << 10
		}
	}
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	st.fds = len(ents)
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	for _, f := range tasks {
		b, _ := os.ReadFile(f)
		st.children += len(strings.Fields(string(b)))
	}
	st.goroutines = mustValue(t, e.Scrape(t), "go_goroutines", nil)
	return st
}

// settledState is the exporter's state at its quietest over two seconds (the fewest goroutines
// and fds of five looks): one look can fall while a poll's request is in flight, or a scrape
// is being served, and count their goroutines; what piles up across polls stays in the least.
func (e *Exporter) settledState(t *testing.T) procState {
	t.Helper()
	least := e.state(t)
	for range 4 {
		time.Sleep(500 * time.Millisecond)
		st := e.state(t)
		least.goroutines, least.fds = min(least.goroutines, st.goroutines), min(least.fds, st.fds)
	}
	return least
}

// timedScrape scrapes and fails when the answer took longer than a scrape timeout.
func (e *Exporter) timedScrape(t *testing.T) Scrape {
	t.Helper()
	start := time.Now()
	s := e.Scrape(t)
	if d := time.Since(start); d > scrapeTimeout {
		t.Errorf("a scrape took %v, more than a scrape timeout (%v)", d, scrapeTimeout)
	}
	return s
}

// checkBounded fails when the exporter's peak RSS passed peakRSSBound.
func checkBounded(t *testing.T, st procState) {
	t.Helper()
	if st.hwm > peakRSSBound {
		t.Errorf("peak RSS (VmHWM) %.1f MiB, bound %d MiB", float64(st.hwm)/(1<<20), peakRSSBound>>20)
	}
}

// waitClean polls until the exporter's goroutines and fds are back within the slack of base
// and it runs no child, for at most timeout; it returns the last state.
func (e *Exporter) waitClean(t *testing.T, base procState, timeout time.Duration) procState {
	t.Helper()
	var st procState
	waitFor(t, timeout, "goroutines and fds back to the baseline, no child", func() (bool, string) {
		st = e.state(t)
		detail := fmt.Sprintf("goroutines %g (baseline %g), fds %d (baseline %d), children %d",
			st.goroutines, base.goroutines, st.fds, base.fds, st.children)
		return st.goroutines <= base.goroutines+goroutineSlack && st.fds <= base.fds+fdSlack && st.children == 0, detail
	})
	checkBounded(t, st)
	return st
}

// logCount counts the exporter's log lines that contain every one of parts.
func (e *Exporter) logCount(t *testing.T, parts ...string) int {
	t.Helper()
	b, err := os.ReadFile(e.p.log)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
next:
	for _, line := range strings.Split(string(b), "\n") {
		for _, p := range parts {
			if !strings.Contains(line, p) {
				continue next
			}
		}
		n++
	}
	return n
}

// TestFaults runs one lab and one exporter through the faults, in order; the shutdown case has
// an exporter of its own.
func TestFaults(t *testing.T) {
	requireExporter(t)
	l := newLab(t)
	kp := startFakeKubeProxy(t, l)
	kpLog := filepath.Join(l.Dir, "kube-proxy.log")
	if err := os.WriteFile(kpLog, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	e := l.StartExporter("proxyhealth-faults", faultsPort, nil, "--log.level=info",
		"--kubeproxy.metrics-url=http://"+fakeKPAddr+"/metrics",
		"--kubeproxy.health-url=http://"+fakeKPAddr+"/livez",
		"--kubeproxy.poll-interval=1s", "--kubeproxy.timeout=1s",
		"--kubeproxy.log-path="+kpLog, "--kubeproxy.log-poll-interval=1s", "--kubeproxy.log-rescan-interval=2s")
	e.Poll(t, 10*time.Second, "kube-proxy up", nil, func(s Scrape) (bool, string) {
		v, ok, _ := s.Value("proxyhealth_kubeproxy_up", nil)
		return ok && v == 1, s.Series("proxyhealth_kubeproxy_up")
	})
	base := e.state(t)
	t.Logf("baseline: VmHWM %.1f MiB, %g goroutines, %d fds", float64(base.hwm)/(1<<20), base.goroutines, base.fds)

	t.Run("half_sent_headers", func(t *testing.T) { testHalfSentHeaders(t, l.In(t), e, base) })
	t.Run("kubeproxy_metrics_32mib", func(t *testing.T) { testKubeProxyBigBody(t, e, kp, base) })
	t.Run("kubeproxy_metrics_hang", func(t *testing.T) { testKubeProxyHang(t, e, kp, base) })
	t.Run("kubeproxy_log", func(t *testing.T) { testKubeProxyLogFaults(t, e, kpLog, base) })
	t.Run("sighup", func(t *testing.T) { testSIGHUP(t, e, base) })
	t.Run("bad_flag", testBadFlagBinary)
	t.Run("netfilter_read_limit", func(t *testing.T) { testNetfilterReadLimit(t, l.In(t)) })
	t.Run("shutdown_with_profile_in_flight", func(t *testing.T) { testShutdownInFlight(t, l.In(t)) })
	st := e.waitClean(t, base, 15*time.Second)
	t.Logf("after the faults: VmHWM %.1f MiB, %g goroutines, %d fds", float64(st.hwm)/(1<<20), st.goroutines, st.fds)
}

// testHalfSentHeaders: 500 clients send half their request headers and nothing more. Scrapes
// still answer meanwhile, and the server closes every one of those connections after its
// ReadHeaderTimeout (none was ever closed before that timeout existed: 500 were still open
// after 60 s).
func testHalfSentHeaders(t *testing.T, l *Lab, e *Exporter, base procState) {
	const n = 500
	dial := netnsdial.Dialer(l.Node)
	conns := make([]net.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range n {
		c, err := dial(context.Background(), "tcp4", fmt.Sprintf("127.0.0.1:%d", faultsPort))
		if err != nil {
			t.Fatalf("connection %d: %v", len(conns), err)
		}
		if _, err := io.WriteString(c, "GET /metrics HTTP/1.1\r\nHost: lab\r\n"); err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	opened := time.Now()
	var held procState
	waitFor(t, 5*time.Second, fmt.Sprintf("the exporter to accept the %d connections", n), func() (bool, string) {
		held = e.state(t)
		return held.fds >= base.fds+n, fmt.Sprintf("%d fds, baseline %d", held.fds, base.fds)
	})
	for range 3 {
		checkValue(t, e.timedScrape(t), success, map[string]string{"collector": "kubeproxy"}, 1)
	}
	// Every connection is closed by the server: a read ends (EOF, or an error response then
	// EOF) within the timeout and a margin.
	var closed atomic.Int64
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = c.SetReadDeadline(opened.Add(readHeaderTimeout + 10*time.Second))
			if _, err := io.Copy(io.Discard, c); err == nil || errors.Is(err, syscall.ECONNRESET) {
				closed.Add(1)
			}
		}()
	}
	wg.Wait()
	took := time.Since(opened)
	if got := closed.Load(); got != n {
		t.Errorf("%d of %d half-sent connections closed by the server within %v", got, n, readHeaderTimeout+10*time.Second)
	}
	t.Logf("%d half-sent connections closed by the server %v after they were opened (ReadHeaderTimeout %v); %d fds while held",
		closed.Load(), took.Round(100*time.Millisecond), readHeaderTimeout, held.fds)
	e.waitClean(t, base, 10*time.Second)
}

// fakeKubeProxy serves kube-proxy's metrics and health endpoints in the lab's node namespace,
// from the test process: the real kube-proxy's captured metrics, or them after 32 MiB of unique
// series, or no answer at all.
type fakeKubeProxy struct {
	captured []byte
	mode     atomic.Value // "ok", "big" or "hang"
	bigDone  atomic.Int64 // big bodies served whole
	release  chan struct{}
}

func startFakeKubeProxy(t *testing.T, l *Lab) *fakeKubeProxy {
	t.Helper()
	captured, err := os.ReadFile(filepath.Join("testdata", "kube-proxy-v1.36.3", "kube-proxy-metrics.txt"))
	if err != nil {
		t.Fatal(err)
	}
	kp := &fakeKubeProxy{captured: captured, release: make(chan struct{})}
	kp.mode.Store("ok")
	ln, err := netnsdial.Listen(l.Node, "tcp4", fakeKPAddr)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: kp, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() {
		close(kp.release)
		_ = srv.Close()
	})
	return kp
}

func (kp *fakeKubeProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	mode := kp.mode.Load().(string)
	if mode == "hang" {
		select {
		case <-r.Context().Done():
		case <-kp.release:
		}
		return
	}
	switch r.URL.Path {
	case "/livez":
		_, _ = io.WriteString(w, "ok")
	case "/metrics":
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		if mode == "big" {
			if writeUniqueSeries(w, 32<<20-len(kp.captured)) == nil {
				if _, err := w.Write(kp.captured); err == nil {
					kp.bigDone.Add(1)
				}
			}
			return
		}
		_, _ = w.Write(kp.captured)
	default:
		http.NotFound(w, r)
	}
}

// writeUniqueSeries writes about size bytes of a counter family whose every series is unique
// (about 150 bytes a line), generated as it goes so that the test holds none of it.
func writeUniqueSeries(w io.Writer, size int) error {
	buf := make([]byte, 0, 64<<10)
	buf = append(buf, "# HELP rest_client_unique_requests_total Requests, one series each.\n# TYPE rest_client_unique_requests_total counter\n"...)
	written := 0
	for i := 0; ; i++ {
		line := fmt.Sprintf("rest_client_unique_requests_total{code=\"200\",host=\"10.%d.%d.%d:6443\",method=\"GET\",path=\"/apis/discovery.k8s.io/v1/endpointslices\",series=\"%d\"} %d\n",
			i>>16&255, i>>8&255, i&255, i, i%1000)
		if written+len(buf)+len(line) > size {
			break
		}
		buf = append(buf, line...)
		if len(buf) > cap(buf)-512 {
			if _, err := w.Write(buf); err != nil {
				return err
			}
			written += len(buf)
			buf = buf[:0]
		}
	}
	_, err := w.Write(buf)
	return err
}

// testKubeProxyBigBody: kube-proxy's metrics, 32 MiB of unique series first (the body cap),
// are read with memory bounded, and the families the exporter reads still come out.
func testKubeProxyBigBody(t *testing.T, e *Exporter, kp *fakeKubeProxy, base procState) {
	kp.mode.Store("big")
	defer kp.mode.Store("ok")
	served := kp.bigDone.Load()
	waitFor(t, 30*time.Second, "three 32 MiB bodies read by the exporter", func() (bool, string) {
		return kp.bigDone.Load() >= served+3, fmt.Sprintf("%d served", kp.bigDone.Load()-served)
	})
	s := e.timedScrape(t)
	checkValue(t, s, "proxyhealth_kubeproxy_up", nil, 1)
	checkValue(t, s, success, map[string]string{"collector": "kubeproxy"}, 1)
	// From the captured metrics after the unique series: kube-proxy's last sync and its
	// pending changes.
	for _, name := range []string{"proxyhealth_kubeproxy_last_sync_age_seconds", "proxyhealth_kubeproxy_endpoint_changes_pending", "proxyhealth_kubeproxy_sync_failures_total"} {
		if _, ok := s[name]; !ok {
			t.Errorf("%s absent after a 32 MiB metrics body: the families after the unique series were not read", name)
		}
	}
	if n := e.logCount(t, "metrics go on past"); n != 0 {
		t.Errorf("the exporter says the body was cut (%d lines): it is within the cap", n)
	}
	st := e.waitClean(t, base, 10*time.Second)
	t.Logf("after three 32 MiB bodies: VmHWM %.1f MiB", float64(st.hwm)/(1<<20))
}

// testKubeProxyHang: kube-proxy accepts and never answers. Each poll times out; the exporter
// says kube-proxy does not answer (proxyhealth_kubeproxy_up 0, which is its contract for an
// absent or stuck kube-proxy: a state, not a collector failure) and logs why once, and its
// goroutines do not pile up across polls; once kube-proxy answers again, up is 1.
func testKubeProxyHang(t *testing.T, e *Exporter, kp *fakeKubeProxy, base procState) {
	const notAnswering = "kube-proxy's metrics endpoint does not answer"
	before := e.logCount(t, notAnswering)
	kp.mode.Store("hang")
	e.WaitValue(t, 10*time.Second, "proxyhealth_kubeproxy_up", nil, 0)
	first := e.settledState(t)
	time.Sleep(6 * time.Second) // two more polls, each 2 x --kubeproxy.timeout + 1 s at most
	s := e.timedScrape(t)
	checkValue(t, s, "proxyhealth_kubeproxy_up", nil, 0)
	checkValue(t, s, success, map[string]string{"collector": "kubeproxy"}, 1)
	later := e.settledState(t)
	if later.goroutines > first.goroutines+3 || later.fds > first.fds+3 {
		t.Errorf("across polls of a kube-proxy that never answers, goroutines went %g -> %g and fds %d -> %d",
			first.goroutines, later.goroutines, first.fds, later.fds)
	}
	if n := e.logCount(t, notAnswering) - before; n != 1 {
		t.Errorf("%q logged %d times over several polls, want once", notAnswering, n)
	}
	if n := e.logCount(t, notAnswering, "Timeout"); n < 1 {
		t.Errorf("the log line does not give the timeout as the reason")
	}
	kp.mode.Store("ok")
	e.WaitValue(t, 10*time.Second, "proxyhealth_kubeproxy_up", nil, 1)
	e.waitClean(t, base, 10*time.Second)
}

// kpWatchError is the real kube-proxy v1.36's reflector watch failure line (klog).
func kpWatchError(i int) string {
	return fmt.Sprintf(`I1121 21:00:47.%06d   10834 reflector.go:664] "Warning: watch ended with error" reflector="k8s.io/client-go@v0.36.3/tools/cache/reflector.go:343" type="*v1.EndpointSlice" err="an error on the server (\"unable to decode an event from the watch stream: http2: client connection lost\") has prevented the request from succeeding"`+"\n", i)
}

// testKubeProxyLogFaults: the log follower through copytruncate with the file regrown past the
// old offset within one poll, a deletion, and a 50 MB line: no line lost, none counted twice,
// memory bounded.
func testKubeProxyLogFaults(t *testing.T, e *Exporter, path string, base procState) {
	errs := func(s Scrape) float64 {
		return s.Sum(listErrors, map[string]string{"resource": "endpointslices", "verb": "watch"})
	}
	appendLines := func(n, from int, pad int) {
		t.Helper()
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		var b strings.Builder
		for i := range n {
			b.WriteString(kpWatchError(from + i))
			for range pad {
				b.WriteString(`I1121 21:00:48.000000   10834 proxier.go:812] "SyncProxyRules complete" elapsed="12ms"` + "\n")
			}
		}
		if _, err := f.WriteString(b.String()); err != nil {
			t.Fatal(err)
		}
	}
	waitErrors := func(what string, want float64) Scrape {
		t.Helper()
		return e.Poll(t, 10*time.Second, what, nil, func(s Scrape) (bool, string) {
			return errs(s) >= want, s.Series(listErrors)
		})
	}
	start := errs(e.Scrape(t))

	// Written, then read.
	appendLines(10, 0, 5)
	waitErrors("10 watch errors", start+10)
	// copytruncate: truncated and at once written again past the old size, faster than the
	// 1 s poll; the 10 error lines in the new content must all count.
	old, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	appendLines(10, 100, 10)
	if now, _ := os.Stat(path); now.Size() <= old.Size() {
		t.Fatalf("regrown log %d bytes, not past the old %d", now.Size(), old.Size())
	}
	waitErrors("10 watch errors after copytruncate", start+20)

	// Deleted and created again: the new file is found by the next rescan of the paths
	// (--kubeproxy.log-rescan-interval) and read from its start.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond) // a poll sees it gone
	appendLines(5, 200, 0)
	waitErrors("5 watch errors after the deletion", start+25)

	// A 50 MB line, then 3 error lines: the long line is skipped and counted, the rest read.
	skipped := e.Scrape(t).Sum("proxyhealth_kubeproxy_log_lines_skipped_total", nil)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	chunk := []byte(strings.Repeat("x", 1<<20))
	for range 50 {
		if _, err := f.Write(chunk); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.WriteString("\n"); err != nil {
		t.Fatal(err)
	}
	f.Close()
	appendLines(3, 300, 0)
	s := waitErrors("3 watch errors after a 50 MB line", start+28)
	time.Sleep(1500 * time.Millisecond) // one more poll: nothing counted twice
	s = e.timedScrape(t)
	if got := errs(s) - start; got != 28 {
		t.Errorf("watch errors counted %g, want exactly 28 (10 + 10 after copytruncate + 5 after deletion + 3)", got)
	}
	if got := s.Sum("proxyhealth_kubeproxy_log_lines_skipped_total", nil) - skipped; got != 1 {
		t.Errorf("long lines skipped +%g, want 1", got)
	}
	st := e.waitClean(t, base, 10*time.Second)
	t.Logf("log faults: VmHWM %.1f MiB", float64(st.hwm)/(1<<20))
}

// testSIGHUP: SIGHUP once ended the process (rc 129); now it is said once and ignored.
func testSIGHUP(t *testing.T, e *Exporter, base procState) {
	before := e.logCount(t, "SIGHUP ignored")
	if err := e.p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the SIGHUP log line", func() (bool, string) {
		return e.logCount(t, "SIGHUP ignored") > before, ""
	})
	time.Sleep(500 * time.Millisecond)
	if e.p.Exited() {
		t.Fatal("the exporter exited on SIGHUP")
	}
	checkValue(t, e.timedScrape(t), success, map[string]string{"collector": "kubeproxy"}, 1)
	if n := e.logCount(t, "SIGHUP ignored") - before; n != 1 {
		t.Errorf("SIGHUP logged %d times, want once", n)
	}
	e.waitClean(t, base, 5*time.Second)
}

// testBadFlagBinary: the real binary, given a bad flag, prints one line naming it and exits 2
// (the table over every flag is exporter.TestBadFlags).
func testBadFlagBinary(t *testing.T) {
	cmd := exec.Command(exporterBin, "--web.telemetry-path=metrics", "--web.listen-address=127.0.0.1:1")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 {
		t.Fatalf("exit %v, want 2; output %q", err, out)
	}
	if lines := strings.Split(strings.TrimSpace(string(out)), "\n"); len(lines) != 1 || !strings.Contains(lines[0], "--web.telemetry-path") {
		t.Errorf("output %q: want one line naming --web.telemetry-path", out)
	}
}

// testShutdownInFlight: with a 20 s CPU profile in flight, SIGTERM ends the exporter within
// its shutdown budget and a margin (it once waited for the profile: 19.5 s, past a pod's
// grace period), says so once, and exits 0.
func testShutdownInFlight(t *testing.T, l *Lab) {
	const budget = 2 * time.Second
	e := l.StartExporter("proxyhealth-pprof", faultsPprofPort, nil, "--log.level=info",
		"--web.enable-pprof", "--web.shutdown-timeout="+budget.String(), "--no-collector.kubeproxy")
	client := netnsdial.HTTPClient(l.Node, 30*time.Second)
	profile := make(chan error, 1)
	go func() {
		resp, err := client.Get(fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/profile?seconds=20", faultsPprofPort))
		if err == nil {
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		profile <- err
	}()
	time.Sleep(time.Second) // the profile is running
	select {
	case err := <-profile:
		t.Fatalf("the 20 s profile ended after 1 s: %v", err)
	default:
	}
	start := time.Now()
	if err := e.p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-e.p.done:
	case <-time.After(budget + 5*time.Second):
		t.Fatalf("the exporter still runs %v after SIGTERM with a %v shutdown budget", budget+5*time.Second, budget)
	}
	took := time.Since(start)
	t.Logf("exited %v after SIGTERM (budget %v)", took.Round(10*time.Millisecond), budget)
	if code := e.p.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("exit code %d after SIGTERM, want 0", code)
	}
	if n := e.logCount(t, "requests still in flight after the shutdown budget"); n != 1 {
		t.Errorf("the cut-short shutdown logged %d times, want once", n)
	}
	if err := <-profile; err == nil {
		t.Errorf("the profile request completed though the server closed it at shutdown")
	}
}

// testNetfilterReadLimit: an nf_tables reply larger than --netfilter.max-dump-bytes (here 1 KiB,
// smaller than the lab's own tables) is abandoned: the collectors that need the rules report
// failure and the log says why, once; the rest serve, and memory stays bounded.
func testNetfilterReadLimit(t *testing.T, l *Lab) {
	e := l.StartExporter("proxyhealth-limit", faultsLimitPort, nil, "--log.level=info",
		"--netfilter.max-dump-bytes=1024", "--no-collector.kubeproxy")
	const why = "larger than the read limit"
	s := e.Poll(t, 15*time.Second, "the node collector failing", nil, func(s Scrape) (bool, string) {
		v, ok, _ := s.Value(success, map[string]string{"collector": "node"})
		return ok && v == 0, s.Series(success)
	})
	// The sysctls need no rules and are still served.
	checkValue(t, s, bridgeNF, nil, 1)
	time.Sleep(2 * time.Second)
	first := e.logCount(t, why)
	for range 3 {
		s = e.timedScrape(t)
		checkValue(t, s, success, map[string]string{"collector": "node"}, 0)
		time.Sleep(time.Second)
	}
	if first < 1 {
		t.Errorf("no log line says a reply was %s", why)
	}
	if n := e.logCount(t, why); n != first {
		t.Errorf("lines saying %q grew from %d to %d over three scrapes: logged per try, not once", why, first, n)
	}
	checkBounded(t, e.state(t))
}
