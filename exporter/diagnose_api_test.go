package exporter

import (
	"bytes"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/proxyhealth/proxyhealth/exporter/diagnose"
)

// goingAwayAPIServer answers the API view's first requests as an API server with nothing in
// it: each resource's initial list (streamed: its end-of-initial-events bookmark; or a plain
// list) and /version. Once every resource was listed and probes more /version requests
// answered, it goes away: with hang, every request after that waits without an answer (a dead
// HTTP/2 connection), the open watches stay open and silent; without, it closes every
// connection and stops listening.
type goingAwayAPIServer struct {
	*httptest.Server
	hang bool

	mu     sync.Mutex
	listed map[string]bool
	probes int // /version requests still answered once everything was listed
	gone   bool

	released  chan struct{} // closed when the test ends: every waiting handler returns
	closeOnce sync.Once
}

var apiListKinds = map[string]string{
	"/api/v1/services": `"kind":"ServiceList","apiVersion":"v1"`,
	"/api/v1/nodes":    `"kind":"NodeList","apiVersion":"v1"`,
	"/apis/discovery.k8s.io/v1/endpointslices": `"kind":"EndpointSliceList","apiVersion":"discovery.k8s.io/v1"`,
}

func newGoingAwayAPIServer(t *testing.T, hang bool, probes int) *goingAwayAPIServer {
	t.Helper()
	f := &goingAwayAPIServer{hang: hang, listed: map[string]bool{}, probes: probes, released: make(chan struct{})}
	f.Server = httptest.NewUnstartedServer(http.HandlerFunc(f.serve))
	f.EnableHTTP2 = true
	f.StartTLS()
	t.Cleanup(f.stop)
	return f
}

func (f *goingAwayAPIServer) stop() {
	f.closeOnce.Do(func() {
		close(f.released)
		f.Close()
	})
}

func (f *goingAwayAPIServer) wait(r *http.Request) {
	select {
	case <-r.Context().Done():
	case <-f.released:
	}
}

// goAwayLocked goes away once every resource has been listed and no probe is left to answer.
func (f *goingAwayAPIServer) goAwayLocked() {
	if f.gone || len(f.listed) < len(apiListKinds) || f.probes > 0 {
		return
	}
	f.gone = true
	if f.hang {
		return // later requests wait in serve
	}
	// Not from the handler that answered the last list: Close waits for the handlers.
	go func() {
		f.CloseClientConnections()
		f.stop()
	}()
}

func (f *goingAwayAPIServer) serve(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	gone := f.gone
	f.mu.Unlock()
	if gone {
		f.wait(r)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if r.URL.Path == "/version" {
		fmt.Fprint(w, `{"major":"1","minor":"36","gitVersion":"v1.36.3"}`)
		f.mu.Lock()
		if len(f.listed) == len(apiListKinds) {
			f.probes--
			f.goAwayLocked()
		}
		f.mu.Unlock()
		return
	}
	kind, ok := apiListKinds[r.URL.Path]
	if !ok {
		http.NotFound(w, r)
		return
	}
	q := r.URL.Query()
	initial := q.Get("watch") != "true" || q.Get("sendInitialEvents") == "true"
	switch {
	case q.Get("watch") != "true":
		fmt.Fprintf(w, `{%s,"metadata":{"resourceVersion":"1"},"items":[]}`, kind)
	case q.Get("sendInitialEvents") == "true":
		item := strings.Replace(kind, "List", "", 1)
		fmt.Fprintf(w, `{"type":"BOOKMARK","object":{%s,"metadata":{"resourceVersion":"1","annotations":{"k8s.io/initial-events-end":"true"}}}}`+"\n", item)
	}
	if initial {
		f.mu.Lock()
		f.listed[r.URL.Path] = true
		f.goAwayLocked()
		f.mu.Unlock()
	}
	if q.Get("watch") == "true" {
		w.(http.Flusher).Flush()
		f.wait(r)
	}
}

// kubeconfig writes a kubeconfig for the server, trusting its certificate.
func (f *goingAwayAPIServer) kubeconfig(t *testing.T) string {
	t.Helper()
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: f.Certificate().Raw})
	path := filepath.Join(t.TempDir(), "kubeconfig")
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: %q, certificate-authority-data: %s}}]
users: [{name: u, user: {token: diagnose}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`, f.URL, base64.StdEncoding.EncodeToString(ca))
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// runMainOutput runs Main with args, its standard output and error captured.
func runMainOutput(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	capture := func(f **os.File) func() string {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		saved := *f
		*f = w
		out := make(chan string)
		go func() {
			var b bytes.Buffer
			_, _ = io.Copy(&b, r)
			out <- b.String()
		}()
		return func() string {
			*f = saved
			w.Close()
			return <-out
		}
	}
	endStdout, endStderr := capture(&os.Stdout), capture(&os.Stderr)
	code = Main(args)
	return code, endStdout(), endStderr()
}

// kubeProxyFailingLog is a kube-proxy pod log under a fixture /var/log/pods whose
// EndpointSlice watch failed three times in the last minutes (cri.log's line, as the container
// runtime writes it, at times of now); it returns the --kubeproxy.log-path glob.
func kubeProxyFailingLog(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(kubeProxyDataDir + "cri.log")
	if err != nil {
		t.Fatal(err)
	}
	var failure string
	for line := range strings.Lines(string(b)) {
		if strings.Contains(line, `type="*v1.EndpointSlice"`) {
			failure = line
		}
	}
	const criTime, klogTime = "2026-11-21T21:00:47.996689000Z", "I1121 21:00:47.996689"
	if !strings.Contains(failure, criTime) || !strings.Contains(failure, klogTime) {
		t.Fatalf("cri.log's EndpointSlice watch failure is not the line expected: %q", failure)
	}
	var log strings.Builder
	for i := range 3 {
		at := time.Now().UTC().Add(time.Duration(i-3) * time.Minute)
		line := strings.Replace(failure, criTime, at.Format(time.RFC3339Nano), 1)
		log.WriteString(strings.Replace(line, klogTime, at.Format("I0102 15:04:05.000000"), 1))
	}
	root := t.TempDir()
	dir := filepath.Join(root, "var/log/pods/kube-system_kube-proxy-x7k2p_6f1c2a80/kube-proxy")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "0.log"), []byte(log.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, "var/log/pods/kube-system_kube-proxy-*/kube-proxy/*.log")
}

// The API server answers diagnose's first requests, then goes away (hangs, or stops), while
// the API view syncs or during the window: diagnose ends within its sync timeout and window
// and a probe of the API, says it could not check kube-proxy's rules against the API and
// names the server it could not reach, still prints what it learnt on the node (kube-proxy's
// own list/watch failures, from its log), and exits 3 (a cause not checked, nothing critical).
func TestDiagnoseAPIServerGoesAway(t *testing.T) {
	const (
		window        = 2 * time.Second
		syncTimeout   = 2 * time.Second
		probeInterval = 200 * time.Millisecond
	)
	for _, tc := range []struct {
		name string
		hang bool
		// probes is how many /version requests are answered after the lists: none, and the
		// API goes away before the view is ready; a few, and it goes away in the window.
		probes int
	}{
		{"hangs while the view syncs", true, 0},
		{"hangs during the window", true, 4},
		{"stops during the window", false, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api := newGoingAwayAPIServer(t, tc.hang, tc.probes)
			kp := kubeProxy(t)
			start := time.Now()
			code, stdout, stderr := runMainOutput(t, "diagnose",
				"--kubeconfig="+api.kubeconfig(t), "--node-name=worker-3",
				"--window="+window.String(), "--sync-timeout="+syncTimeout.String(),
				"--api.probe-interval="+probeInterval.String(), "--api.fresh-within=500ms",
				"--path.procfs="+procFixture, "--no-collector.conntrack",
				"--kubeproxy.metrics-url="+kp.URL+"/metrics", "--kubeproxy.health-url="+kp.URL+"/livez",
				"--kubeproxy.log-path="+kubeProxyFailingLog(t))
			took := time.Since(start)
			t.Logf("exit %d after %v\nstdout:\n%s\nstderr:\n%s", code, took, stdout, stderr)

			if code != diagnose.ExitCannotDiagnose {
				t.Errorf("exit code %d, want %d (a cause not checked, nothing critical)", code, diagnose.ExitCannotDiagnose)
			}
			// The sync timeout, the window, a probe of the API (its interval and timeout) and a
			// drift check at the window's end, and time to start and stop.
			if limit := syncTimeout + window + 2*probeInterval + driftCheckInterval + time.Second; took > limit {
				t.Errorf("diagnose took %v, want at most %v", took, limit)
			}
			u, err := url.Parse(api.URL)
			if err != nil {
				t.Fatal(err)
			}
			for _, want := range []string{
				"node worker-3: unknown (1 warning, ", " not checked), judged over ",
				// What it learnt on the node: kube-proxy's own list/watch failures, told with
				// the exporter's stale view of the API as one story (kube_proxy_watch_failing
				// explains api_view_stale).
				"WARNING kube_proxy_watch_failing\n",
				"kube-proxy failed to list or watch the API 3 times in the last 1h (endpointslices watch 3)",
				"and the exporter's own view of the API is stale too",
				// What it could not reach, by address.
				"    exporter_api_view.fresh: false\n",
				"    exporter_api_view.error: probing the API server: ",
				u.Host + "/version",
				"\nnot checked:\n  stale_rules: the API view is not fresh",
			} {
				if !strings.Contains(stdout, want) {
					t.Errorf("output lacks %q", want)
				}
			}
			if !strings.Contains(stderr, "proxyhealth diagnose: could not check everything:\n") || !strings.Contains(stderr, "stale_rules: the API view is not fresh") {
				t.Errorf("stderr does not say the rules were not checked against the API:\n%s", stderr)
			}
		})
	}
}
