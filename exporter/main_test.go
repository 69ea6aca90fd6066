package exporter

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

// runMain runs Main with args, its standard error captured.
func runMain(t *testing.T, args ...string) (code int, stderr string) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	saved := os.Stderr
	os.Stderr = w
	out := make(chan string)
	go func() {
		var b bytes.Buffer
		_, _ = io.Copy(&b, r)
		out <- b.String()
	}()
	code = Main(args)
	os.Stderr = saved
	w.Close()
	return code, <-out
}

// Every bad flag value is a one-line error naming the flag, before anything starts.
func TestBadFlags(t *testing.T) {
	for _, tc := range []struct{ arg, names string }{
		{"--web.telemetry-path=metrics", "--web.telemetry-path"},
		{"--web.telemetry-path=", "--web.telemetry-path"},
		{"--web.telemetry-path=/", "--web.telemetry-path"},
		{"--web.telemetry-path=/debug/pprof/", "--web.telemetry-path"},
		{"--web.max-requests=-1", "--web.max-requests"},
		{"--web.shutdown-timeout=0s", "--web.shutdown-timeout"},
		{"--web.shutdown-timeout=soon", "web.shutdown-timeout"},
		{"--conntrack.unreplied-after=0s", "--conntrack.unreplied-after"},
		{"--conntrack.max-tracked-flows=0", "--conntrack.max-tracked-flows"},
		{"--conntrack.max-service-series=-1", "--conntrack.max-service-series"},
		{"--conntrack.socket-buffer-bytes=0", "--conntrack.socket-buffer-bytes"},
		{"--conntrack.service-refresh-interval=0s", "--conntrack.service-refresh-interval"},
		{"--conntrack.resync-min-interval=-1s", "--conntrack.resync-min-interval"},
		{"--rules.check-interval=0s", "--rules.check-interval"},
		{"--rules.grace-period=-1s", "--rules.grace-period"},
		{"--rules.max-service-series=-1", "--rules.max-service-series"},
		{"--api.fresh-within=0s", "--api.fresh-within"},
		{"--api.probe-interval=0s", "--api.probe-interval"},
		{"--netfilter.legacy-poll-interval=0s", "--netfilter.legacy-poll-interval"},
		{"--netfilter.legacy-min-read-interval=-1s", "--netfilter.legacy-min-read-interval"},
		{"--netfilter.resync-interval=0s", "--netfilter.resync-interval"},
		{"--netfilter.max-dump-bytes=0", "--netfilter.max-dump-bytes"},
		{"--netfilter.legacy-max-table-bytes=-1", "--netfilter.legacy-max-table-bytes"},
		{"--netfilter.legacy-max-table-bytes=lots", "--netfilter.legacy-max-table-bytes"},
		{"--kubeproxy.log-poll-interval=0s", "--kubeproxy.log-poll-interval"},
		{"--kubeproxy.log-rescan-interval=0s", "--kubeproxy.log-rescan-interval"},
		{"--kubeproxy.log-max-line-bytes=10", "--kubeproxy.log-max-line-bytes"},
		{"--kubeproxy.log-path=[", "--kubeproxy.log-path"},
		{"--kubeproxy.poll-interval=0s", "--kubeproxy.poll-interval"},
		{"--kubeproxy.timeout=0s", "--kubeproxy.timeout"},
		{"--kubeproxy.metrics-url=", "--kubeproxy.metrics-url"},
		{"--web.kubernetes-auth.allow-ttl=0s", "--web.kubernetes-auth.allow-ttl"},
		{"--web.kubernetes-auth.deny-ttl=-1s", "--web.kubernetes-auth.deny-ttl"},
		{"--web.kubernetes-auth.deny-ttl=later", "web.kubernetes-auth.deny-ttl"},
		{"--no-such-flag", "no-such-flag"},
	} {
		t.Run(tc.arg, func(t *testing.T) {
			code, stderr := runMain(t, tc.arg, "--web.listen-address=127.0.0.1:1", "--kubeconfig=/nonexistent")
			lines := strings.Split(strings.TrimSpace(stderr), "\n")
			if code != 2 || len(lines) != 1 || !strings.Contains(lines[0], tc.names) {
				t.Errorf("exit %d, stderr %q: want 2 and one line naming %s", code, stderr, tc.names)
			}
		})
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// A running exporter: SIGHUP is said and ignored, pprof is off by default, and SIGTERM ends it
// within the shutdown budget though a request is still in flight.
func TestSignalsAndShutdown(t *testing.T) {
	addr := freeAddr(t)
	done := make(chan int)
	go func() {
		// Only the exporter's own collectors that need no privilege and no API.
		done <- Main([]string{"--web.listen-address=" + addr, "--web.shutdown-timeout=1s", "--no-collector.conntrack",
			"--no-collector.rules", "--no-collector.node", "--kubeproxy.metrics-url=http://127.0.0.1:1/metrics", "--log.level=error"})
	}()
	base := "http://" + addr
	var up bool
	for range 200 {
		if resp, err := http.Get(base + "/metrics"); err == nil {
			resp.Body.Close()
			up = true
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !up {
		t.Fatal("exporter did not answer")
	}
	resp, err := http.Get(base + "/debug/pprof/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("/debug/pprof/ without --web.enable-pprof: %d, want 404", resp.StatusCode)
	}

	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if resp, err := http.Get(base + "/metrics"); err != nil {
		t.Fatalf("after SIGHUP: %v", err)
	} else {
		resp.Body.Close()
	}

	// A client that sent half its headers holds a connection: shutdown must not wait on it
	// past its budget.
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprint(conn, "GET /metrics HTTP/1.1\r\nHost: x\r\n")
	start := time.Now()
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("exit %d after SIGTERM", code)
		}
		if d := time.Since(start); d > 3*time.Second {
			t.Errorf("shutdown took %v with a 1s budget", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no exit 10s after SIGTERM")
	}
}

// Allocation sampling is off without the profiler, and on with it even where the environment
// (the image's GODEBUG=memprofilerate=0) turned it off from the start.
func TestAllocationSampling(t *testing.T) {
	for _, tc := range []struct {
		pprof      bool
		rate, want int
	}{
		{false, defaultMemProfileRate, 0},
		{false, 0, 0},
		{true, 0, defaultMemProfileRate},
		{true, 4096, 4096},
	} {
		if got := allocationSampling(tc.pprof, tc.rate); got != tc.want {
			t.Errorf("allocationSampling(pprof %v, rate %d) = %d, want %d", tc.pprof, tc.rate, got, tc.want)
		}
	}
}
