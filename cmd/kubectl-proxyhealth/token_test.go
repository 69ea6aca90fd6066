package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/proxyhealth/proxyhealth/internal/kubeauth"
	"github.com/proxyhealth/proxyhealth/internal/podproxy"
	"github.com/proxyhealth/proxyhealth/internal/verdict"
)

// authAPIServer is an API server with two healthy exporter pods in monitoring whose pod proxy
// forwards as the real one does: without Authorization. The exporters behind it answer /status
// only with the viewer token in X-Proxyhealth-Token, as with --web.kubernetes-auth.
type authAPIServer struct {
	srv *httptest.Server
	// mayCreateToken: the plugin's user may create the viewer's token.
	mayCreateToken bool
	// released ends the TokenRequests that never answer, when the test is over.
	released chan struct{}

	mu sync.Mutex
	// exportersOpen: the exporters run without --web.kubernetes-auth and need no token.
	exportersOpen bool
	// tokenNeverAnswers: the API server takes TokenRequests but answers none.
	tokenNeverAnswers bool
	// listNeverAnswers: the API server takes the list of the exporter pods but never answers.
	listNeverAnswers bool
	// answer, when set, is what the exporter of node answers to /status in place of a
	// healthy verdict.
	answer        func(node string) []byte
	tokenRequests []authenticationv1.TokenRequestSpec
	proxied       int
}

// counts are the TokenRequests and the reads through the pod proxy the server has had.
func (a *authAPIServer) counts() (tokenRequests, proxied int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.tokenRequests), a.proxied
}

// set changes how the server answers, between runs.
func (a *authAPIServer) set(change func(*authAPIServer)) {
	a.mu.Lock()
	defer a.mu.Unlock()
	change(a)
}

// testViewerToken is the viewer's token for audience proxyhealth, the one the exporters accept.
const testViewerToken = "viewer-token-for-proxyhealth"

func newAuthAPIServer(t *testing.T, mayCreateToken bool) *authAPIServer {
	a := &authAPIServer{mayCreateToken: mayCreateToken, released: make(chan struct{})}
	pods := &corev1.PodList{TypeMeta: metav1.TypeMeta{Kind: "PodList", APIVersion: "v1"}}
	for _, n := range []string{"worker-1", "worker-2"} {
		p := pod("proxyhealth-"+n, n, corev1.PodRunning)
		pods.Items = append(pods.Items, p)
	}
	writeJSON := func(w http.ResponseWriter, code int, v any) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(v)
	}
	a.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodGet && r.URL.Path == "/api/v1/namespaces/monitoring/pods":
			a.mu.Lock()
			hang := a.listNeverAnswers
			a.mu.Unlock()
			if hang {
				select {
				case <-r.Context().Done():
				case <-a.released:
				}
				return
			}
			writeJSON(w, http.StatusOK, pods)
		case r.Method == http.MethodPost && r.URL.Path == "/api/v1/namespaces/monitoring/serviceaccounts/proxyhealth-viewer/token":
			// JSON or protobuf, whichever client-go sent.
			var req authenticationv1.TokenRequest
			body, err := io.ReadAll(r.Body)
			if err == nil {
				_, _, err = scheme.Codecs.UniversalDeserializer().Decode(body, nil, &req)
			}
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			a.mu.Lock()
			a.tokenRequests = append(a.tokenRequests, req.Spec)
			hang := a.tokenNeverAnswers
			a.mu.Unlock()
			if hang {
				select {
				case <-r.Context().Done():
				case <-a.released:
				}
				return
			}
			if !a.mayCreateToken {
				writeJSON(w, http.StatusForbidden, metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure,
					Reason: metav1.StatusReasonForbidden, Code: http.StatusForbidden,
					Message: `serviceaccounts "proxyhealth-viewer" is forbidden: User "oncall" cannot create resource "serviceaccounts/token" in API group "" in the namespace "monitoring"`})
				return
			}
			req.TypeMeta = metav1.TypeMeta{Kind: "TokenRequest", APIVersion: "authentication.k8s.io/v1"}
			req.Status.Token = "viewer-token-for-" + strings.Join(req.Spec.Audiences, ",")
			writeJSON(w, http.StatusCreated, req)
		case r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/api/v1/namespaces/monitoring/pods/proxyhealth-worker-") &&
			strings.HasSuffix(r.URL.Path, ":9869/proxy/status"):
			a.mu.Lock()
			a.proxied++
			open := a.exportersOpen
			a.mu.Unlock()
			if !open && r.Header.Get(podproxy.TokenHeader) != testViewerToken {
				w.Header().Set("WWW-Authenticate", `Bearer realm="proxyhealth"`)
				http.Error(w, "Unauthorized: a Kubernetes bearer token is required", http.StatusUnauthorized)
				return
			}
			node := strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, "/api/v1/namespaces/monitoring/pods/proxyhealth-"), ":9869/proxy/status")
			a.mu.Lock()
			answer := a.answer
			a.mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			if answer != nil {
				_, _ = w.Write(answer(node))
				return
			}
			_, _ = w.Write(statusBody(t, node, verdict.Healthy))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(a.srv.Close)
	// Before the server's close, which waits for its handlers.
	t.Cleanup(func() { close(a.released) })
	return a
}

func (a *authAPIServer) run(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(context.Background(), append([]string{"--server=" + a.srv.URL, "-n", "monitoring"}, args...), &out, &errOut)
	return out.String(), errOut.String(), code
}

// The plugin sends a viewer token the pod proxy lets through: one TokenRequest per namespace,
// for the exporters' audience and ten minutes.
func TestViewerTokenReachesTheExporters(t *testing.T) {
	if podproxy.TokenHeader != kubeauth.TokenHeader {
		t.Fatalf("the plugin sends %s, the exporter reads %s", podproxy.TokenHeader, kubeauth.TokenHeader)
	}
	a := newAuthAPIServer(t, true)
	out, errOut, code := a.run(t)
	if code != exitHealthy || strings.Count(out, "healthy  -") != 2 {
		t.Fatalf("exit %d, want 0 with both nodes healthy:\n%s%s", code, out, errOut)
	}
	if len(a.tokenRequests) != 1 {
		t.Fatalf("%d TokenRequests, want one for the namespace", len(a.tokenRequests))
	}
	if spec := a.tokenRequests[0]; !slices.Equal(spec.Audiences, []string{"proxyhealth"}) || spec.ExpirationSeconds == nil || *spec.ExpirationSeconds != 600 {
		t.Errorf("TokenRequest %+v", spec)
	}
	// The first node answers 401 and is read again with the token; the next is sent it at once.
	a.set(func(a *authAPIServer) { a.proxied = 0 })
	out, errOut, code = a.run(t, "--parallel=1")
	if _, proxied := a.counts(); code != exitHealthy || proxied != 3 {
		t.Errorf("--parallel=1: exit %d, %d reads through the proxy, want 0 and 3:\n%s%s", code, proxied, out, errOut)
	}
	// A token for an audience the exporters do not accept: the nodes say so.
	out, errOut, code = a.run(t, "--token-audience=elsewhere")
	want := `HTTP 401: Unauthorized: a Kubernetes bearer token is required; the exporter rejected the token of ServiceAccount monitoring/proxyhealth-viewer for audience "elsewhere" (is it one of the exporter's --web.kubernetes-auth.audience?)`
	if code != exitCannotRun || strings.Count(out, want) != 2 {
		t.Errorf("--token-audience=elsewhere: exit %d, want 3 with both nodes naming the audience:\n%s%s", code, out, errOut)
	}
}

// A user who may not create the viewer's token is told so by the nodes that need one.
func TestViewerTokenRefused(t *testing.T) {
	a := newAuthAPIServer(t, false)
	out, errOut, code := a.run(t)
	want := `error: GET /status through the pod proxy: HTTP 401: Unauthorized: a Kubernetes bearer token is required; no token of ServiceAccount monitoring/proxyhealth-viewer to send (--viewer-serviceaccount): serviceaccounts "proxyhealth-viewer" is forbidden`
	if code != exitCannotRun || strings.Count(out, want) != 2 {
		t.Fatalf("exit %d, want 3 with both nodes naming the refused token:\n%s%s", code, out, errOut)
	}
	if len(a.tokenRequests) != 1 {
		t.Errorf("%d TokenRequests, want one for the namespace", len(a.tokenRequests))
	}
	// Asked for none, it sends none.
	out, errOut, code = a.run(t, "--viewer-serviceaccount=")
	if code != exitCannotRun || strings.Contains(out, "no token of ServiceAccount") || len(a.tokenRequests) != 1 {
		t.Errorf("--viewer-serviceaccount=: exit %d, %d TokenRequests\n%s%s", code, len(a.tokenRequests), out, errOut)
	}
}

// Exporters without --web.kubernetes-auth need no token: the plugin asks for none, and reads
// each node once.
func TestNoTokenWithoutAuth(t *testing.T) {
	a := newAuthAPIServer(t, true)
	a.set(func(a *authAPIServer) { a.exportersOpen = true })
	out, errOut, code := a.run(t)
	if code != exitHealthy || strings.Count(out, "healthy  -") != 2 {
		t.Fatalf("exit %d, want 0 with both nodes healthy:\n%s%s", code, out, errOut)
	}
	if tokenRequests, proxied := a.counts(); tokenRequests != 0 || proxied != 2 {
		t.Errorf("%d TokenRequests and %d reads through the proxy, want none and 2", tokenRequests, proxied)
	}
}

// An API server that never answers the TokenRequest holds the run up no longer than --timeout:
// the nodes that want a token are unknown, and say why.
func TestViewerTokenRequestBounded(t *testing.T) {
	a := newAuthAPIServer(t, true)
	a.set(func(a *authAPIServer) { a.tokenNeverAnswers = true })
	type result struct {
		out, errOut string
		code        int
	}
	done := make(chan result, 1)
	start := time.Now()
	go func() {
		out, errOut, code := a.run(t, "--timeout=300ms")
		done <- result{out, errOut, code}
	}()
	var r result
	select {
	case r = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the run still waits for the TokenRequest after 10s (--timeout=300ms)")
	}
	t.Logf("ended after %v", time.Since(start))
	want := `error: GET /status through the pod proxy: HTTP 401: Unauthorized: a Kubernetes bearer token is required; no token of ServiceAccount monitoring/proxyhealth-viewer to send (--viewer-serviceaccount): the API server did not answer the TokenRequest within 300ms (--timeout)`
	if r.code != exitCannotRun || strings.Count(r.out, want) != 2 {
		t.Errorf("exit %d, want 3 with both nodes naming the unanswered token:\n%s%s", r.code, r.out, r.errOut)
	}
	if tokenRequests, _ := a.counts(); tokenRequests != 1 {
		t.Errorf("%d TokenRequests, want one for the namespace", tokenRequests)
	}
}

// An API server that never answers the list of the exporter pods ends the run within
// --timeout, exit code 3 with the reason: kubectl's --request-timeout is none by default.
func TestPodListBounded(t *testing.T) {
	a := newAuthAPIServer(t, true)
	a.set(func(a *authAPIServer) { a.listNeverAnswers = true })
	type result struct {
		out, errOut string
		code        int
	}
	done := make(chan result, 1)
	go func() {
		out, errOut, code := a.run(t, "--timeout=300ms")
		done <- result{out, errOut, code}
	}()
	select {
	case r := <-done:
		if r.code != exitCannotRun || !strings.Contains(r.errOut, "listing the exporter pods") {
			t.Errorf("exit %d, want 3 naming the list:\n%s%s", r.code, r.out, r.errOut)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the run still waits for the pod list after 10s (--timeout=300ms)")
	}
}
