package kubeauth

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	authenticationv1 "k8s.io/api/authentication/v1"

	"github.com/proxyhealth/proxyhealth/internal/testsupport/logbuf"
)

const (
	promToken    = "prometheus-token"
	noRBACToken  = "nobody-token"
	promUser     = "system:serviceaccount:monitoring:prometheus"
	noRBACUser   = "system:serviceaccount:default:nobody"
	testRealm    = "proxyhealth"
	wantBody     = "metrics body"
	metricsPath  = "/metrics"
	statusPath   = "/status"
	garbageToken = "not-a-token"
)

// fakeClock is a settable clock for the caches' expiry.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Step(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// fixture is an Auth in front of a handler that records what reached it, asking a fake API
// server that knows Prometheus's token (allowed get /metrics) and one without RBAC.
type fixture struct {
	api    *fakeAPIServer
	auth   *Auth
	h      http.Handler
	clock  *fakeClock
	log    *logbuf.Buffer
	served struct {
		sync.Mutex
		n             int
		authorization []string
	}
}

// newFixture's Auth accepts tokens for audiences (none: the API server's own).
func newFixture(t *testing.T, cfg Config, audiences ...string) *fixture {
	t.Helper()
	f := &fixture{api: newFakeAPIServer(t), clock: &fakeClock{now: time.Unix(1_700_000_000, 0)}, log: &logbuf.Buffer{}}
	f.api.addUser(promToken, authenticationv1.UserInfo{
		Username: promUser, UID: "uid-1",
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:monitoring", "system:authenticated"},
		Extra:  map[string]authenticationv1.ExtraValue{"authentication.kubernetes.io/pod-name": {"prometheus-0"}},
	})
	f.api.addUser(noRBACToken, authenticationv1.UserInfo{Username: noRBACUser, Groups: []string{"system:authenticated"}})
	f.api.allow(promUser, "get", metricsPath)
	cfg.Clock = f.clock
	cfg.Realm = testRealm
	logger := slog.New(slog.NewTextHandler(f.log, &slog.HandlerOptions{Level: slog.LevelInfo}))
	a, err := New(cfg, f.api.reviewer(t, audiences...), logger)
	if err != nil {
		t.Fatal(err)
	}
	f.auth = a
	f.h = a.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.served.Lock()
		f.served.n++
		f.served.authorization = append(f.served.authorization, r.Header.Get("Authorization")+r.Header.Get(TokenHeader))
		f.served.Unlock()
		io.WriteString(w, wantBody)
	}))
	return f
}

// do sends a GET of path with the Authorization header auth ("" for none).
func (f *fixture) do(path, auth string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodGet, path, nil)
	if auth != "" {
		r.Header.Set("Authorization", auth)
	}
	w := httptest.NewRecorder()
	f.h.ServeHTTP(w, r)
	return w
}

func (f *fixture) requests(result string) float64 {
	return testutil.ToFloat64(f.auth.metrics.requests.WithLabelValues(result))
}

func expectStatus(t *testing.T, w *httptest.ResponseRecorder, want int) {
	t.Helper()
	if w.Code != want {
		t.Fatalf("status %d, want %d; body %q", w.Code, want, w.Body.String())
	}
}

func expectReviews(t *testing.T, f *fixture, wantTokens, wantAccess int) {
	t.Helper()
	if tok, acc := f.api.counts(); tok != wantTokens || acc != wantAccess {
		t.Fatalf("%d TokenReviews and %d SubjectAccessReviews, want %d and %d", tok, acc, wantTokens, wantAccess)
	}
}

func TestNoTokenIs401WithoutAReview(t *testing.T) {
	f := newFixture(t, Config{})
	for _, auth := range []string{"", "Basic dXNlcjpwYXNz", "Bearer", "Bearer   ", "Token abc"} {
		w := f.do(metricsPath, auth)
		expectStatus(t, w, http.StatusUnauthorized)
		if got := w.Header().Get("WWW-Authenticate"); got != `Bearer realm="proxyhealth"` {
			t.Errorf("Authorization %q: WWW-Authenticate %q", auth, got)
		}
	}
	expectReviews(t, f, 0, 0)
	if got := f.requests(resultUnauthenticated); got != 5 {
		t.Errorf("unauthenticated requests counted %v, want 5", got)
	}
}

func TestGarbageTokenIs401AndRemembered(t *testing.T) {
	f := newFixture(t, Config{})
	for range 3 {
		w := f.do(metricsPath, "Bearer "+garbageToken)
		expectStatus(t, w, http.StatusUnauthorized)
		if got := w.Header().Get("WWW-Authenticate"); got != `Bearer realm="proxyhealth", error="invalid_token"` {
			t.Errorf("WWW-Authenticate %q", got)
		}
	}
	expectReviews(t, f, 1, 0)
	if f.served.n != 0 {
		t.Errorf("the handler was reached %d times", f.served.n)
	}
}

func TestTokenWithoutRBACIs403(t *testing.T) {
	f := newFixture(t, Config{})
	w := f.do(metricsPath, "Bearer "+noRBACToken)
	expectStatus(t, w, http.StatusForbidden)
	if !strings.Contains(w.Body.String(), noRBACUser) {
		t.Errorf("403 body %q does not name the user", w.Body.String())
	}
	expectStatus(t, f.do(metricsPath, "Bearer "+noRBACToken), http.StatusForbidden)
	expectReviews(t, f, 1, 1)
	if got := f.requests(resultForbidden); got != 2 {
		t.Errorf("forbidden requests counted %v, want 2", got)
	}
}

func TestAllowedTokenReachesTheHandlerAndIsRemembered(t *testing.T) {
	f := newFixture(t, Config{})
	for range 5 {
		w := f.do(metricsPath, "bearer "+promToken) // the scheme is case-insensitive
		expectStatus(t, w, http.StatusOK)
		if w.Body.String() != wantBody {
			t.Fatalf("body %q", w.Body.String())
		}
	}
	expectReviews(t, f, 1, 1)
	// What the SubjectAccessReview asked: the whole user, and get on the path.
	spec := f.api.lastAccess
	if spec.User != promUser || spec.UID != "uid-1" || len(spec.Groups) != 3 ||
		spec.Extra["authentication.kubernetes.io/pod-name"][0] != "prometheus-0" {
		t.Errorf("SubjectAccessReview user %+v", spec)
	}
	if a := spec.NonResourceAttributes; a == nil || a.Verb != "get" || a.Path != metricsPath || spec.ResourceAttributes != nil {
		t.Errorf("SubjectAccessReview attributes %+v %+v", spec.NonResourceAttributes, spec.ResourceAttributes)
	}
	for _, h := range f.served.authorization {
		if h != "" {
			t.Errorf("the handler saw the caller's token: %q", h)
		}
	}
	if hits := testutil.ToFloat64(f.auth.metrics.cacheHits.WithLabelValues(reviewToken)); hits != 4 {
		t.Errorf("token cache hits %v, want 4", hits)
	}
	if hits := testutil.ToFloat64(f.auth.metrics.cacheHits.WithLabelValues(reviewAccess)); hits != 4 {
		t.Errorf("access cache hits %v, want 4", hits)
	}
}

// Each path and verb is authorized on its own: get /metrics does not open /status, nor a
// POST to /metrics.
func TestEachPathAndVerbIsAuthorized(t *testing.T) {
	f := newFixture(t, Config{})
	expectStatus(t, f.do(metricsPath, "Bearer "+promToken), http.StatusOK)
	expectStatus(t, f.do(statusPath, "Bearer "+promToken), http.StatusForbidden)
	expectStatus(t, f.do("/metrics/../status", "Bearer "+promToken), http.StatusForbidden)
	r := httptest.NewRequest(http.MethodPost, metricsPath, nil)
	r.Header.Set("Authorization", "Bearer "+promToken)
	w := httptest.NewRecorder()
	f.h.ServeHTTP(w, r)
	expectStatus(t, w, http.StatusForbidden)
	if a := f.api.lastAccess.NonResourceAttributes; a.Verb != "post" {
		t.Errorf("POST reviewed as verb %q, want post", a.Verb)
	}
	expectReviews(t, f, 1, 4)
}

// Allowed answers are remembered for AllowTTL, denied ones for DenyTTL: access granted after a
// denial works once DenyTTL has passed; access taken away stops once AllowTTL has.
func TestTTLs(t *testing.T) {
	f := newFixture(t, Config{AllowTTL: time.Minute, DenyTTL: 10 * time.Second})
	expectStatus(t, f.do(statusPath, "Bearer "+promToken), http.StatusForbidden)
	f.api.allow(promUser, "get", statusPath)
	f.clock.Step(9 * time.Second)
	expectStatus(t, f.do(statusPath, "Bearer "+promToken), http.StatusForbidden)
	expectReviews(t, f, 1, 1)
	f.clock.Step(2 * time.Second)
	expectStatus(t, f.do(statusPath, "Bearer "+promToken), http.StatusOK)
	expectReviews(t, f, 1, 2) // the token was remembered for AllowTTL

	f.api.mu.Lock()
	delete(f.api.allowed, promUser)
	f.api.mu.Unlock()
	f.clock.Step(50 * time.Second) // 61s after the token's review, 50s after the access's
	expectStatus(t, f.do(statusPath, "Bearer "+promToken), http.StatusOK)
	expectReviews(t, f, 2, 2)
	f.clock.Step(11 * time.Second)
	expectStatus(t, f.do(statusPath, "Bearer "+promToken), http.StatusForbidden)
	expectReviews(t, f, 2, 3)

	// A rejected token is asked about again after DenyTTL: it may have become valid.
	expectStatus(t, f.do(metricsPath, "Bearer late-token"), http.StatusUnauthorized)
	f.api.addUser("late-token", authenticationv1.UserInfo{Username: promUser})
	f.clock.Step(11 * time.Second)
	expectStatus(t, f.do(metricsPath, "Bearer late-token"), http.StatusForbidden)
}

// With the API server failing, every request is refused with 503 (never let through), the
// failure is logged once, and nothing of it is remembered: the first request after it
// recovers is answered.
func TestAPIServerDownFailsClosedAndLogsOnce(t *testing.T) {
	f := newFixture(t, Config{})
	f.api.setDown(true)
	for _, tok := range []string{promToken, promToken, noRBACToken, garbageToken, promToken} {
		expectStatus(t, f.do(metricsPath, "Bearer "+tok), http.StatusServiceUnavailable)
	}
	if f.served.n != 0 {
		t.Fatalf("the handler was reached %d times while the API server was down", f.served.n)
	}
	log := f.log.String()
	if n := strings.Count(log, "level=ERROR"); n != 1 || !strings.Contains(log, "does not answer") || !strings.Contains(log, "etcdserver: request timed out") {
		t.Errorf("want one error line naming the failure, got:\n%s", log)
	}
	if got := f.requests(resultUnavailable); got != 5 {
		t.Errorf("unavailable requests counted %v, want 5", got)
	}
	if got := testutil.ToFloat64(f.auth.metrics.reviews.WithLabelValues(reviewToken, resultError)); got != 5 {
		t.Errorf("failed token reviews counted %v, want 5", got)
	}

	f.api.setDown(false)
	expectStatus(t, f.do(metricsPath, "Bearer "+promToken), http.StatusOK)
	if !strings.Contains(f.log.String(), "answers reviews again") {
		t.Errorf("no recovery line:\n%s", f.log.String())
	}
	// Down again after an allowed answer: the cached answer keeps serving the known caller;
	// a new failure is logged again, once.
	f.api.setDown(true)
	expectStatus(t, f.do(metricsPath, "Bearer "+promToken), http.StatusOK)
	expectStatus(t, f.do(metricsPath, "Bearer "+noRBACToken), http.StatusServiceUnavailable)
	expectStatus(t, f.do(metricsPath, "Bearer "+noRBACToken), http.StatusServiceUnavailable)
	if n := strings.Count(f.log.String(), "level=ERROR"); n != 2 {
		t.Errorf("want a second error line for the second outage, got %d:\n%s", n, f.log.String())
	}
}

// A review that hangs ends at ReviewTimeout with 503.
func TestReviewTimeout(t *testing.T) {
	f := newFixture(t, Config{ReviewTimeout: 50 * time.Millisecond})
	hold := make(chan struct{})
	f.api.mu.Lock()
	f.api.hold = hold
	f.api.mu.Unlock()
	defer close(hold)
	expectStatus(t, f.do(metricsPath, "Bearer "+promToken), http.StatusServiceUnavailable)
}

// Concurrent requests with one token cost one TokenReview, and with one user and path one
// SubjectAccessReview: each review is held until every request waits on it.
func TestConcurrentRequestsShareReviews(t *testing.T) {
	f := newFixture(t, Config{ReviewTimeout: time.Minute})
	expectStatus(t, f.do(metricsPath, "Bearer "+promToken), http.StatusOK)
	expectReviews(t, f, 1, 1)
	const n = 50
	concurrently := func(path, token string) {
		t.Helper()
		hold := make(chan struct{})
		f.api.mu.Lock()
		f.api.hold = hold
		f.api.mu.Unlock()
		released := sync.OnceFunc(func() { close(hold) })
		defer released()
		codes := make(chan int, n)
		var wg sync.WaitGroup
		for range n {
			wg.Go(func() { codes <- f.do(path, "Bearer "+token).Code })
		}
		for deadline := time.Now().Add(30 * time.Second); f.auth.sharing.Load() < n; {
			if time.Now().After(deadline) {
				released()
				t.Fatalf("%d requests wait on the review, want %d", f.auth.sharing.Load(), n)
			}
			time.Sleep(time.Millisecond)
		}
		f.api.mu.Lock()
		f.api.hold = nil
		f.api.mu.Unlock()
		released()
		wg.Wait()
		close(codes)
		for c := range codes {
			if c != http.StatusOK {
				t.Fatalf("status %d", c)
			}
		}
	}
	// A new token of a user whose access is cached: only the TokenReview is shared.
	const rotated = "rotated-prometheus-token"
	f.api.mu.Lock()
	f.api.users[rotated] = f.api.users[promToken]
	f.api.mu.Unlock()
	concurrently(metricsPath, rotated)
	expectReviews(t, f, 2, 1)
	// A path not asked for yet, with the token cached: only the SubjectAccessReview is.
	f.api.allow(promUser, "get", statusPath)
	concurrently(statusPath, promToken)
	expectReviews(t, f, 2, 2)
}

// The caches are bounded: the least recently used entry goes. Rejected tokens are kept apart,
// so invented tokens cannot push out a known caller's.
func TestCachesAreBounded(t *testing.T) {
	f := newFixture(t, Config{CacheSize: 2})
	for i := range 3 {
		tok := fmt.Sprintf("token-%d", i)
		f.api.addUser(tok, authenticationv1.UserInfo{Username: promUser})
		expectStatus(t, f.do(metricsPath, "Bearer "+tok), http.StatusOK)
	}
	expectReviews(t, f, 3, 1)
	expectStatus(t, f.do(metricsPath, "Bearer token-0"), http.StatusOK) // pushed out by token-2
	expectReviews(t, f, 4, 1)

	for i := range 15 { // within the review rate limit's burst
		expectStatus(t, f.do(metricsPath, fmt.Sprintf("Bearer invented-%d", i)), http.StatusUnauthorized)
	}
	expectReviews(t, f, 19, 1)
	expectStatus(t, f.do(metricsPath, "Bearer token-0"), http.StatusOK)
	expectReviews(t, f, 19, 1)
}

func TestAccessKeyTellsFieldsApart(t *testing.T) {
	u := func(name string, groups ...string) authenticationv1.UserInfo {
		return authenticationv1.UserInfo{Username: name, Groups: groups}
	}
	keys := map[[32]byte]string{}
	for name, k := range map[string][32]byte{
		"a/get/x":        accessKey(u("a"), "get", "/x"),
		"a+g/get/x":      accessKey(u("a", "g"), "get", "/x"),
		"ag/get/x":       accessKey(u("ag"), "get", "/x"),
		"a/getx":         accessKey(u("a"), "get/x", ""),
		"a/get/x-extra":  accessKey(authenticationv1.UserInfo{Username: "a", Extra: map[string]authenticationv1.ExtraValue{"k": {"v"}}}, "get", "/x"),
		"a/get/x-extra2": accessKey(authenticationv1.UserInfo{Username: "a", Extra: map[string]authenticationv1.ExtraValue{"k": {"v", ""}}}, "get", "/x"),
		"a/get/x-uid":    accessKey(authenticationv1.UserInfo{Username: "a", UID: "1"}, "get", "/x"),
	} {
		if other, dup := keys[k]; dup {
			t.Errorf("%s and %s share a key", name, other)
		}
		keys[k] = name
	}
	extra := func(order ...string) authenticationv1.UserInfo {
		e := map[string]authenticationv1.ExtraValue{}
		for _, k := range order {
			e[k] = authenticationv1.ExtraValue{k}
		}
		return authenticationv1.UserInfo{Username: "a", Extra: e}
	}
	if accessKey(extra("k1", "k2", "k3"), "get", "/x") != accessKey(extra("k3", "k1", "k2"), "get", "/x") {
		t.Error("the key depends on the extra map's order")
	}
}

func TestBadConfig(t *testing.T) {
	for _, cfg := range []Config{{AllowTTL: -1}, {DenyTTL: -1}, {CacheSize: -1}, {ReviewTimeout: -1},
		{KnownTTL: -1}, {ReviewQPS: -1}, {ReviewBurst: -1}, {MaxReviewing: -1}, {MaxWaiting: -1}} {
		if _, err := New(cfg, nil, slog.Default()); err == nil {
			t.Errorf("%+v accepted", cfg)
		}
	}
}
