//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/proxyhealth/proxyhealth/internal/testsupport/netnsdial"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const (
	kubeAuthExporterPort = 19895
	plainExporterPort    = 19896
	floodExporterPort    = 19898
)

// TestKubernetesAuth runs the exporter with --web.kubernetes-auth against the lab's real
// kube-apiserver (RBAC authorization, ServiceAccount tokens from the TokenRequest API): a
// garbage token gets 401, a ServiceAccount without RBAC 403, one allowed to get /metrics 200
// (and only /metrics), and a real Prometheus scraping with its own ServiceAccount's token has
// its target up. It logs what the check costs: a review of a new caller against the real API
// server, a cached answer, and a whole scrape with and without the check.
func TestKubernetesAuth(t *testing.T) {
	requireKube(t)
	requireExporter(t)
	requirePrometheus(t)
	start := time.Now()
	l := newLabRules(t, labRawRules)
	cp := StartControlPlane(t, l, ControlPlaneOptions{NoKubeProxy: true})

	// The exporter's ServiceAccount: its API view's RBAC, and create on tokenreviews and
	// subjectaccessreviews as deploy/ and the chart grant it. It reaches the API server
	// through a fault proxy (api_unreachable).
	proxy := cp.StartFaultProxy("exporter-fault-proxy", exporterProxyAddr, exporterControlAddr)
	kubeconfig := cp.readOnlyKubeconfig("proxyhealth.kubeconfig", exporterProxyAddr)
	cp.bindClusterRole("proxyhealth-kubernetes-auth", []rbacv1.PolicyRule{
		{APIGroups: []string{"authentication.k8s.io"}, Resources: []string{"tokenreviews"}, Verbs: []string{"create"}},
		{APIGroups: []string{"authorization.k8s.io"}, Resources: []string{"subjectaccessreviews"}, Verbs: []string{"create"}},
	}, "kube-system", "proxyhealth")
	// Prometheus's: get on /metrics, as its ClusterRole in kube-prometheus(-stack) has.
	cp.bindClusterRole("proxyhealth-metrics-reader", []rbacv1.PolicyRule{
		{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}},
	}, "monitoring", "prometheus")
	prometheusToken := cp.serviceAccountToken(t, "monitoring", "prometheus")
	nobodyToken := cp.serviceAccountToken(t, "default", "nobody")

	exporterArgs := []string{"--kubeconfig=" + kubeconfig, "--node-name=" + labNodeName, "--log.level=info"}
	authAddr := fmt.Sprintf("127.0.0.1:%d", kubeAuthExporterPort)
	exporter := l.Start(l.Node, "proxyhealth-kubeauth", append([]string{exporterBin,
		"--web.listen-address=" + authAddr, "--web.kubernetes-auth"}, exporterArgs...)...)
	client := &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{DialContext: netnsdial.Dialer(l.Node)}}
	get := func(t *testing.T, addr, path, token string) (int, string, time.Duration) {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, "http://"+addr+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		began := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			return 0, err.Error(), 0
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		took := time.Since(began)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		return resp.StatusCode, string(b), took
	}
	waitFor(t, 15*time.Second, "the exporter listening", func() (bool, string) {
		if exporter.Exited() {
			b, _ := os.ReadFile(exporter.log)
			t.Fatalf("the exporter exited at start:\n%s", b)
		}
		code, body, _ := get(t, authAddr, "/metrics", "")
		return code != 0, body
	})

	t.Run("answers", func(t *testing.T) {
		for _, tc := range []struct {
			what, path, token string
			want              int
		}{
			{"no token", "/metrics", "", http.StatusUnauthorized},
			{"a garbage token", "/metrics", "garbage-token", http.StatusUnauthorized},
			{"a ServiceAccount without RBAC", "/metrics", nobodyToken, http.StatusForbidden},
			{"Prometheus's ServiceAccount", "/metrics", prometheusToken, http.StatusOK},
			{"Prometheus's ServiceAccount on /status", "/status", prometheusToken, http.StatusForbidden},
			{"Prometheus's ServiceAccount on the landing page", "/", prometheusToken, http.StatusForbidden},
		} {
			code, body, _ := get(t, authAddr, tc.path, tc.token)
			if code != tc.want {
				t.Errorf("%s, GET %s: %d, want %d: %.200s", tc.what, tc.path, code, tc.want, body)
			} else {
				t.Logf("%s, GET %s: %d", tc.what, tc.path, code)
			}
		}
		code, body, _ := get(t, authAddr, "/metrics", prometheusToken)
		if code != http.StatusOK || !strings.Contains(body, "proxyhealth_collector_success") {
			t.Fatalf("the allowed scrape: %d %.200s", code, body)
		}
		s, err := parseScrape(body)
		if err != nil {
			t.Fatal(err)
		}
		checkScrapeSignatures(t, s, readmeReference(t))
		// The reviews the real API server answered: three tokens, two users asking for
		// /metrics, Prometheus's for /status and /.
		for _, want := range []struct {
			review, result string
			n              float64
		}{
			{"token", "authenticated", 2}, {"token", "unauthenticated", 1}, {"token", "error", 0},
			{"access", "allowed", 1}, {"access", "denied", 3}, {"access", "error", 0},
		} {
			checkValue(t, s, "proxyhealth_kubernetes_auth_reviews_total", map[string]string{"review": want.review, "result": want.result}, want.n)
		}
	})

	t.Run("prometheus_scrapes_with_its_token", func(t *testing.T) {
		tokenFile := filepath.Join(cp.Dir, "prometheus.token")
		if err := os.WriteFile(tokenFile, []byte(prometheusToken), 0o600); err != nil {
			t.Fatal(err)
		}
		// StartPrometheus waits until the target is up.
		p := StartPrometheus(t, l.In(t), PrometheusOptions{Targets: []string{authAddr}, CredentialsFile: tokenFile})
		p.WaitQuery(30*time.Second, `proxyhealth_kubernetes_auth_requests_total{job="proxyhealth",result="allowed"}`, func(v model.Vector) bool {
			return len(v) == 1 && v[0].Value >= 1
		})
	})

	t.Run("cost", func(t *testing.T) {
		// A new caller on a new path: one TokenReview and one SubjectAccessReview, both
		// answered by the real API server (a 403, so the handler costs nothing).
		var cold, warm []time.Duration
		for i := range 10 {
			tok := cp.serviceAccountToken(t, "default", "nobody")
			code, body, took := get(t, authAddr, fmt.Sprintf("/cold-%d", i), tok)
			if code != http.StatusForbidden {
				t.Fatalf("a new caller: %d %s", code, body)
			}
			cold = append(cold, took)
		}
		for range 50 {
			code, body, took := get(t, authAddr, "/cold-0", nobodyToken)
			if code != http.StatusForbidden {
				t.Fatalf("a known caller: %d %s", code, body)
			}
			warm = append(warm, took)
		}
		t.Logf("a denied request over a kept-alive connection, median of %d: %v with both reviews sent to the API server, %v with both answers cached",
			len(cold), median(cold), median(warm))

		// Whole scrapes, interleaved: the same exporter without the check beside it.
		plainAddr := fmt.Sprintf("127.0.0.1:%d", plainExporterPort)
		plain := l.In(t).Start(l.Node, "proxyhealth-plain", append([]string{exporterBin, "--web.listen-address=" + plainAddr}, exporterArgs...)...)
		waitFor(t, 15*time.Second, "the exporter without the check", func() (bool, string) {
			if plain.Exited() {
				t.Fatalf("the exporter without the check exited")
			}
			code, body, _ := get(t, plainAddr, "/metrics", "")
			return code == http.StatusOK, body
		})
		var with, without []time.Duration
		for range 30 {
			code, _, took := get(t, authAddr, "/metrics", prometheusToken)
			if code != http.StatusOK {
				t.Fatalf("scrape with the check: %d", code)
			}
			with = append(with, took)
			code, _, took = get(t, plainAddr, "/metrics", "")
			if code != http.StatusOK {
				t.Fatalf("scrape without the check: %d", code)
			}
			without = append(without, took)
		}
		t.Logf("a whole scrape, median of %d: %v with the check (answers cached), %v without", len(with), median(with), median(without))
	})

	// 300 invented tokens at once while Prometheus's answers have just expired (an exporter
	// with a 1 s allow TTL): Prometheus's scrape is served at once, ahead of them, while they
	// get 401 or a fast 429, never 503, and the log says throttled without blaming the API
	// server. Before, the scrape waited 9.8 s in the client-side rate limiter and the invented
	// tokens got 503 "the API server does not answer".
	t.Run("flood", func(t *testing.T) {
		floodAddr := fmt.Sprintf("127.0.0.1:%d", floodExporterPort)
		flood := l.In(t).Start(l.Node, "proxyhealth-flood", append([]string{exporterBin, "--web.listen-address=" + floodAddr,
			"--web.kubernetes-auth", "--web.kubernetes-auth.allow-ttl=1s"}, exporterArgs...)...)
		waitFor(t, 15*time.Second, "the flood exporter serving Prometheus", func() (bool, string) {
			if flood.Exited() {
				t.Fatalf("the flood exporter exited at start")
			}
			code, body, _ := get(t, floodAddr, "/metrics", prometheusToken)
			return code == http.StatusOK, fmt.Sprintf("%d %.100s", code, body)
		})
		time.Sleep(1500 * time.Millisecond) // Prometheus's answers expired, Prometheus known
		const n = 300
		codes, took := make([]int, n), make([]time.Duration, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() { codes[i], _, took[i] = get(t, floodAddr, "/metrics", fmt.Sprintf("invented-token-%d", i)) })
		}
		time.Sleep(200 * time.Millisecond) // the queue is full by now
		code, body, promTook := get(t, floodAddr, "/metrics", prometheusToken)
		wg.Wait()
		count := map[int]int{}
		var slowest429 time.Duration
		for i, c := range codes {
			count[c]++
			if c == http.StatusTooManyRequests {
				slowest429 = max(slowest429, took[i])
			}
		}
		t.Logf("during a flood of %d invented tokens: Prometheus's scrape with its answers expired %d in %v; the invented tokens %v, the slowest 429 in %v",
			n, code, promTook.Round(time.Millisecond), count, slowest429.Round(time.Millisecond))
		if code != http.StatusOK || promTook > 2*time.Second {
			t.Errorf("Prometheus's scrape during the flood: %d in %v, want 200 ahead of the invented tokens: %.200s", code, promTook, body)
		}
		if count[http.StatusUnauthorized]+count[http.StatusTooManyRequests] != n || count[http.StatusTooManyRequests] == 0 || slowest429 > time.Second {
			t.Errorf("the invented tokens: %v, slowest 429 %v; want 401 or a fast 429 only, some 429", count, slowest429)
		}
		b, err := os.ReadFile(flood.log)
		if err != nil {
			t.Fatal(err)
		}
		if log := string(b); strings.Contains(log, "does not answer authentication or authorization reviews") || !strings.Contains(log, "level=WARN source=kubeauth.go") ||
			!strings.Contains(log, "throttled") {
			t.Errorf("the flood exporter's log blames the API server, or does not say throttled:\n%s", log)
		}
	})

	exporterLog := func() string {
		b, err := os.ReadFile(exporter.log)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	if !strings.Contains(exporterLog(), "every request needs a Kubernetes bearer token") {
		t.Errorf("the exporter's log does not say requests need a token")
	}
	const reviewsFailing = "does not answer authentication or authorization reviews"
	if strings.Contains(exporterLog(), reviewsFailing) {
		t.Fatalf("the exporter logged a failed review before the API server was cut off:\n%s", exporterLog())
	}

	// Last: the exporter's connection to the API server black-holed. New callers are refused
	// with 503 once the review times out (10 s), never let through, and that is logged once;
	// a caller whose answers are cached is still served.
	t.Run("api_unreachable", func(t *testing.T) {
		tokens := []string{
			cp.serviceAccountToken(t, "monitoring", "prometheus"), // allowed, were it reviewed
			cp.serviceAccountToken(t, "default", "nobody"),
			"another-garbage-token",
		}
		t.Logf("fault proxy: %s", proxy.Blackhole(t))
		began := time.Now()
		codes := make(chan string, len(tokens))
		for _, tok := range tokens {
			go func() {
				code, body, _ := get(t, authAddr, "/metrics", tok)
				codes <- fmt.Sprintf("%d %.100s", code, body)
			}()
		}
		for range tokens {
			if got := <-codes; !strings.HasPrefix(got, "503 ") {
				t.Errorf("a new caller while the API server is cut off: %s, want 503", got)
			}
		}
		t.Logf("new callers refused with 503 after %s", time.Since(began).Round(time.Millisecond))
		code, body, _ := get(t, authAddr, "/metrics", prometheusToken)
		if code != http.StatusOK {
			t.Fatalf("the cached caller while the API server is cut off: %d %.200s", code, body)
		}
		s, err := parseScrape(body)
		if err != nil {
			t.Fatal(err)
		}
		checkValue(t, s, "proxyhealth_kubernetes_auth_requests_total", map[string]string{"result": "unavailable"}, float64(len(tokens)))
		if n := strings.Count(exporterLog(), reviewsFailing); n != 1 {
			t.Errorf("the failure logged %d times, want once", n)
		}

		t.Logf("fault proxy: %s", proxy.Heal(t))
		waitFor(t, 30*time.Second, "a new caller answered again", func() (bool, string) {
			code, body, _ := get(t, authAddr, "/metrics", cp.serviceAccountToken(t, "default", "nobody"))
			return code == http.StatusForbidden, fmt.Sprintf("%d %.100s", code, body)
		})
		if !strings.Contains(exporterLog(), "answers reviews again") {
			t.Errorf("the exporter did not log that reviews are answered again")
		}
	})
	t.Logf("TestKubernetesAuth took %s", time.Since(start).Round(time.Millisecond))
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

// ensureServiceAccount creates ServiceAccount ns/sa, and its namespace, if missing.
func (cp *ControlPlane) ensureServiceAccount(t *testing.T, ns, sa string) {
	t.Helper()
	cp.EnsureNamespace(ns)
	if _, err := cp.Client.CoreV1().ServiceAccounts(ns).Create(context.Background(), &corev1.ServiceAccount{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: sa},
	}, metav1.CreateOptions{}); err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatalf("creating ServiceAccount %s/%s: %v", ns, sa, err)
	}
}

// bindClusterRole creates ClusterRole name with rules and binds it to ServiceAccount ns/sa,
// which it creates with its namespace if missing.
func (cp *ControlPlane) bindClusterRole(name string, rules []rbacv1.PolicyRule, ns, sa string) {
	t := cp.t
	t.Helper()
	ctx := context.Background()
	cp.ensureServiceAccount(t, ns, sa)
	if _, err := cp.Client.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Rules:      rules,
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating ClusterRole %s: %v", name, err)
	}
	if _, err := cp.Client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: sa}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating ClusterRoleBinding %s: %v", name, err)
	}
}

// serviceAccountToken returns a new token of ServiceAccount ns/sa (TokenRequest), creating the
// account and its namespace if missing.
func (cp *ControlPlane) serviceAccountToken(t *testing.T, ns, sa string) string {
	t.Helper()
	ctx := context.Background()
	cp.ensureServiceAccount(t, ns, sa)
	tok, err := cp.Client.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptrTo(int64(3600))},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("requesting a token for %s/%s: %v", ns, sa, err)
	}
	return tok.Status.Token
}
