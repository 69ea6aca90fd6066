package exporter

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
)

// reviewingAPIServer answers TokenReviews (token "allowed" and "denied" are users of those
// names, for whatever audiences are asked) and SubjectAccessReviews (user "allowed" may get
// /metrics) as the API server does. Each TokenReview's audiences are sent to audiences, when
// not nil.
func reviewingAPIServer(t *testing.T, audiences chan<- []string) *httptest.Server {
	// TLS: client-go sends a kubeconfig's credentials to no other server.
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/apis/authentication.k8s.io/v1/tokenreviews":
			var review authenticationv1.TokenReview
			if err := json.NewDecoder(r.Body).Decode(&review); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			tok := review.Spec.Token
			review.Status.Authenticated = tok == "allowed" || tok == "denied"
			review.Status.User.Username = tok
			review.Status.Audiences = review.Spec.Audiences
			if audiences != nil {
				audiences <- review.Spec.Audiences
			}
			_ = json.NewEncoder(w).Encode(review)
		case "/apis/authorization.k8s.io/v1/subjectaccessreviews":
			var review authorizationv1.SubjectAccessReview
			if err := json.NewDecoder(r.Body).Decode(&review); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			a := review.Spec.NonResourceAttributes
			review.Status.Allowed = review.Spec.User == "allowed" && a != nil && a.Verb == "get" && a.Path == "/metrics"
			_ = json.NewEncoder(w).Encode(review)
		default:
			// The API view is off in this test; nothing else is asked.
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

func writeKubeconfig(t *testing.T, server string) string {
	t.Helper()
	return writeTokenKubeconfig(t, server, "exporter")
}

// writeTokenKubeconfig is a kubeconfig whose user has token.
func writeTokenKubeconfig(t *testing.T, server, token string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "kubeconfig")
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: %q, insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: %q}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`, server, token)
	if err := os.WriteFile(p, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// With --web.kubernetes-auth every path needs a token allowed to get it: /metrics opens to
// the allowed user only, the landing page and /status to nobody here, and the auth's own
// counters are in the scrape.
func TestKubernetesAuthCoversEveryPath(t *testing.T) {
	api := reviewingAPIServer(t, nil)
	addr := freeAddr(t)
	done := make(chan int)
	go func() {
		done <- Main([]string{"--web.listen-address=" + addr, "--web.kubernetes-auth", "--web.enable-pprof",
			"--kubeconfig=" + writeKubeconfig(t, api.URL),
			"--no-collector.conntrack", "--no-collector.rules", "--no-collector.node",
			"--kubeproxy.metrics-url=http://127.0.0.1:1/metrics", "--log.level=error"})
	}()
	get := func(path, token string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, "http://"+addr+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for range 200 {
		if code, _ := get("/metrics", ""); code != 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, tc := range []struct {
		path, token string
		want        int
	}{
		{"/metrics", "", http.StatusUnauthorized},
		{"/metrics", "made-up", http.StatusUnauthorized},
		{"/metrics", "denied", http.StatusForbidden},
		{"/", "allowed", http.StatusForbidden},
		{"/", "", http.StatusUnauthorized},
		{"/status", "allowed", http.StatusForbidden},
		{"/debug/pprof/", "allowed", http.StatusForbidden},
		{"/no-such-path", "", http.StatusUnauthorized},
		{"/metrics", "allowed", http.StatusOK},
	} {
		code, body := get(tc.path, tc.token)
		if code != tc.want {
			t.Errorf("GET %s with token %q: %d, want %d: %s", tc.path, tc.token, code, tc.want, body)
		}
	}
	_, body := get("/metrics", "allowed")
	for _, want := range []string{
		// This scrape is the second allowed request: it counts before it is served.
		`proxyhealth_kubernetes_auth_requests_total{result="allowed"} 2`,
		`proxyhealth_kubernetes_auth_requests_total{result="forbidden"} 4`,
		// The four above and the first answer while waiting for the exporter to listen.
		`proxyhealth_kubernetes_auth_requests_total{result="unauthenticated"} 5`,
		`proxyhealth_kubernetes_auth_reviews_total{result="unauthenticated",review="token"} 1`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("the scrape lacks %s", want)
		}
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("no exit after SIGTERM")
	}
}

// Basic auth in the web config and --web.kubernetes-auth would both need the Authorization
// header: refused at start, in one line. So is --web.kubernetes-auth without an API server.
func TestKubernetesAuthRefusals(t *testing.T) {
	webConfig := filepath.Join(t.TempDir(), "web.yml")
	if err := os.WriteFile(webConfig, []byte("basic_auth_users:\n  prometheus: $2y$10$abcdefghijklmnopqrstuu5Hf6gPp0nZ9bG4L2R6n1sQyYqKZ8r5e\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--web.config.file=" + webConfig, "--kubeconfig=" + writeKubeconfig(t, "https://127.0.0.1:1")}, "basic_auth_users"},
		{[]string{"--kubeconfig=/nonexistent"}, "--web.kubernetes-auth needs the Kubernetes API"},
		// The API server's audiences cannot be read from an opaque token.
		{[]string{"--web.kubernetes-auth.audience=kube-apiserver", "--kubeconfig=" + writeKubeconfig(t, "https://127.0.0.1:1")},
			"--web.kubernetes-auth.audience=kube-apiserver: the API server's audiences: the exporter's own token: not a JWT"},
		{[]string{"--web.kubernetes-auth.audience=", "--kubeconfig=" + writeKubeconfig(t, "https://127.0.0.1:1")},
			"--web.kubernetes-auth.audience must not be empty"},
	} {
		args := append([]string{"--web.kubernetes-auth", "--web.listen-address=127.0.0.1:1", "--log.level=error",
			"--no-collector.conntrack", "--no-collector.rules", "--no-collector.node", "--no-collector.kubeproxy"}, tc.args...)
		code, stderr := runMain(t, args...)
		lines := strings.Split(strings.TrimSpace(stderr), "\n")
		if code != 2 || len(lines) != 1 || !strings.Contains(lines[0], tc.want) {
			t.Errorf("%v: exit %d, stderr %q: want 2 and one line with %q", tc.args, code, stderr, tc.want)
		}
	}
}

// --web.kubernetes-auth.audience names the TokenReview's audiences, kube-apiserver standing for
// those of the exporter's own token; a token reaches the exporter in Authorization or in
// X-Proxyhealth-Token.
func TestKubernetesAuthAudiences(t *testing.T) {
	audiences := make(chan []string, 10)
	api := reviewingAPIServer(t, audiences)
	enc := base64.RawURLEncoding.EncodeToString
	ownToken := enc([]byte(`{"alg":"RS256"}`)) + "." + enc([]byte(`{"aud":["https://kubernetes.default.svc"],"exp":4102444800}`)) + ".sig"
	addr := freeAddr(t)
	done := make(chan int)
	go func() {
		done <- Main([]string{"--web.listen-address=" + addr, "--web.kubernetes-auth",
			"--web.kubernetes-auth.audience=proxyhealth", "--web.kubernetes-auth.audience=kube-apiserver",
			"--kubeconfig=" + writeTokenKubeconfig(t, api.URL, ownToken),
			"--no-collector.conntrack", "--no-collector.rules", "--no-collector.node",
			"--kubeproxy.metrics-url=http://127.0.0.1:1/metrics", "--log.level=error"})
	}()
	get := func(header, value string) int {
		req, err := http.NewRequest(http.MethodGet, "http://"+addr+"/metrics", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set(header, value)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	code := 0
	for range 200 {
		if code = get("X-Proxyhealth-Token", "allowed"); code != 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if code != http.StatusOK {
		t.Errorf("a token in X-Proxyhealth-Token: %d, want 200", code)
	}
	select {
	case got := <-audiences:
		if !slices.Equal(got, []string{"https://kubernetes.default.svc", "proxyhealth"}) {
			t.Errorf("TokenReview audiences %q", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no TokenReview")
	}
	if code := get("Authorization", "Bearer denied"); code != http.StatusForbidden {
		t.Errorf("a token in Authorization without RBAC: %d, want 403", code)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("no exit after SIGTERM")
	}
}
