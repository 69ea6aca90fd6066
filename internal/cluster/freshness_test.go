package cluster

import (
	"context"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeAPIServer answers just enough of the API for the reflectors and the probe: empty lists,
// watches that stay open and silent (a quiet cluster), and /version. While hung, every new
// request waits without an answer, like a dead HTTP/2 connection (incident 3).
type fakeAPIServer struct {
	*httptest.Server
	hung     atomic.Bool
	released chan struct{} // closed at cleanup: every handler returns
	versions atomic.Int64
	protos   sync.Map // protocols seen
}

var listKinds = map[string]string{
	"/api/v1/services": `"kind":"ServiceList","apiVersion":"v1"`,
	"/api/v1/nodes":    `"kind":"NodeList","apiVersion":"v1"`,
	"/apis/discovery.k8s.io/v1/endpointslices": `"kind":"EndpointSliceList","apiVersion":"discovery.k8s.io/v1"`,
}

func newFakeAPIServer(t *testing.T) *fakeAPIServer {
	f := &fakeAPIServer{released: make(chan struct{})}
	f.Server = httptest.NewUnstartedServer(http.HandlerFunc(f.serve))
	f.EnableHTTP2 = true
	f.StartTLS()
	t.Cleanup(func() {
		close(f.released)
		f.Close()
	})
	return f
}

func (f *fakeAPIServer) wait(r *http.Request) {
	select {
	case <-r.Context().Done():
	case <-f.released:
	}
}

func (f *fakeAPIServer) serve(w http.ResponseWriter, r *http.Request) {
	f.protos.Store(r.Proto, true)
	if f.hung.Load() {
		f.wait(r)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if r.URL.Path == "/version" {
		f.versions.Add(1)
		fmt.Fprint(w, `{"major":"1","minor":"36","gitVersion":"v1.36.3"}`)
		return
	}
	kind, ok := listKinds[r.URL.Path]
	if !ok {
		http.NotFound(w, r)
		return
	}
	if r.URL.Query().Get("watch") != "true" {
		fmt.Fprintf(w, `{%s,"metadata":{"resourceVersion":"1"},"items":[]}`, kind)
		return
	}
	if r.URL.Query().Get("sendInitialEvents") == "true" {
		// A watch-list (client-go's default since v1.35): no objects, then the bookmark
		// that ends the initial events.
		item := strings.Replace(kind, "List", "", 1)
		fmt.Fprintf(w, `{"type":"BOOKMARK","object":{%s,"metadata":{"resourceVersion":"1","annotations":{"k8s.io/initial-events-end":"true"}}}}`+"\n", item)
	}
	w.(http.Flusher).Flush()
	f.wait(r)
}

// kubeconfig writes a kubeconfig for the server, trusting its certificate.
func (f *fakeAPIServer) kubeconfig(t *testing.T) string {
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: f.Certificate().Raw})
	path := filepath.Join(t.TempDir(), "kubeconfig")
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: test
  user:
    token: test-token
contexts:
- name: test
  context: {cluster: test, user: test}
current-context: test
`, f.URL, encodeBase64(ca))
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestFreshnessFollowsTheAPIServer(t *testing.T) {
	srv := newFakeAPIServer(t)
	const freshWithin = 600 * time.Millisecond
	c, err := New(Config{
		Kubeconfig:        srv.kubeconfig(t),
		NodeName:          "node-a",
		FreshWithin:       freshWithin,
		ProbeInterval:     100 * time.Millisecond,
		ProbeTimeout:      100 * time.Millisecond,
		RecomputeInterval: 10 * time.Millisecond,
	}, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	if s := c.Snapshot(); s.Synced || s.Fresh || !s.LastHeard.IsZero() {
		t.Fatalf("before Run: %+v, want nothing known", s)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { c.Run(ctx) })
	defer func() { cancel(); wg.Wait() }()

	waitFor(t, "synced and fresh", func() (bool, string) {
		s := c.Snapshot()
		return s.Synced && s.Fresh, fmt.Sprintf("%+v, last error %v", s, c.LastError())
	})
	if _, h2 := srv.protos.Load("HTTP/2.0"); !h2 {
		t.Errorf("the client did not use HTTP/2; protocols seen: %v", protocols(srv))
	}
	// The cluster is quiet (no events): only the probe keeps the view fresh.
	time.Sleep(2 * freshWithin)
	if s := c.Snapshot(); !s.Fresh || c.LastError() != nil {
		t.Fatalf("quiet but answering API server: %+v, last error %v; want fresh", s, c.LastError())
	}

	srv.hung.Store(true)
	hungAt := time.Now()
	waitFor(t, "stale", func() (bool, string) {
		s := c.Snapshot()
		return !s.Fresh, fmt.Sprintf("%+v", s)
	})
	if took := time.Since(hungAt); took > freshWithin+500*time.Millisecond {
		t.Errorf("went stale after %v, want within fresh-within (%v) plus a probe", took, freshWithin)
	}
	s := c.Snapshot()
	if !s.Synced || s.LastHeard.After(hungAt.Add(200*time.Millisecond)) {
		t.Errorf("stale snapshot %+v: want still synced, last heard before the hang", s)
	}
	if err := c.LastError(); err == nil || !strings.Contains(err.Error(), "no answer within") {
		t.Errorf("LastError() = %v, want the probe's timeout", err)
	}

	srv.hung.Store(false)
	waitFor(t, "fresh again", func() (bool, string) {
		s := c.Snapshot()
		return s.Fresh && c.LastError() == nil, fmt.Sprintf("%+v, last error %v", s, c.LastError())
	})
}

func protocols(f *fakeAPIServer) []string {
	var out []string
	f.protos.Range(func(k, _ any) bool { out = append(out, k.(string)); return true })
	return out
}

func TestNoAPIConfigured(t *testing.T) {
	t.Setenv("KUBECONFIG", "")
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	c, err := New(Config{NodeName: "node-a", FreshWithin: time.Second, ProbeInterval: 50 * time.Millisecond}, testLogger())
	if err != nil {
		t.Fatalf("New must not fail without an API: %v", err)
	}
	if err := c.LastError(); !errors.Is(err, errNoAPI) || !strings.HasPrefix(err.Error(), "no Kubernetes API configured: ") {
		t.Fatalf("LastError() = %v, want no Kubernetes API configured", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	c.Run(ctx) // retries quietly until ctx ends
	if s := c.Snapshot(); s.Synced || s.Fresh {
		t.Errorf("snapshot %+v, want unsynced and not fresh", s)
	}
}

func TestMissingKubeconfigDegrades(t *testing.T) {
	c, err := New(Config{Kubeconfig: filepath.Join(t.TempDir(), "absent"), NodeName: "n", FreshWithin: time.Second, ProbeInterval: time.Second}, testLogger())
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if err := c.LastError(); err == nil || !strings.Contains(err.Error(), "--kubeconfig") {
		t.Errorf("LastError() = %v, want the kubeconfig's error", err)
	}
}

func TestConfigValidation(t *testing.T) {
	for _, cfg := range []Config{
		{NodeName: "n", FreshWithin: 0, ProbeInterval: time.Second},
		{NodeName: "n", FreshWithin: time.Second, ProbeInterval: -1},
	} {
		if _, err := New(cfg, testLogger()); err == nil {
			t.Errorf("New(%+v) succeeded, want an error", cfg)
		}
	}
	t.Setenv("KUBECONFIG", "")
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	c, err := New(Config{FreshWithin: time.Second, ProbeInterval: time.Second}, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	if host, _ := os.Hostname(); c.cfg.NodeName != host {
		t.Errorf("node name %q, want the host name %q", c.cfg.NodeName, host)
	}
}

func encodeBase64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }
