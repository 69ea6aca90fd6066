package kubeauth

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	authenticationv1 "k8s.io/api/authentication/v1"
)

// doHeader sends a GET of path with the token in TokenHeader, as through the pod proxy.
func (f *fixture) doHeader(path, token string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodGet, path, nil)
	r.Header.Set(TokenHeader, token)
	w := httptest.NewRecorder()
	f.h.ServeHTTP(w, r)
	return w
}

// The API server's pod proxy drops Authorization: a token in TokenHeader is reviewed the same
// way, and hidden from the handler too.
func TestTokenHeader(t *testing.T) {
	f := newFixture(t, Config{})
	expectStatus(t, f.doHeader(metricsPath, promToken), http.StatusOK)
	expectStatus(t, f.doHeader(metricsPath, noRBACToken), http.StatusForbidden)
	expectStatus(t, f.doHeader(metricsPath, garbageToken), http.StatusUnauthorized)
	expectStatus(t, f.doHeader(metricsPath, "  "), http.StatusUnauthorized)
	expectReviews(t, f, 3, 2)
	// Authorization, when it holds a bearer token, is the one reviewed.
	r := httptest.NewRequest(http.MethodGet, metricsPath, nil)
	r.Header.Set("Authorization", "Bearer "+noRBACToken)
	r.Header.Set(TokenHeader, promToken)
	w := httptest.NewRecorder()
	f.h.ServeHTTP(w, r)
	expectStatus(t, w, http.StatusForbidden)
	for _, h := range f.served.authorization {
		if h != "" {
			t.Errorf("the handler saw the caller's token: %q", h)
		}
	}
}

// A cached acceptance ends no later than the token does: a token expiring 30 s after its review
// is reviewed again at 30 s, not after the allow TTL.
func TestAcceptanceEndsWithTheToken(t *testing.T) {
	f := newFixture(t, Config{AllowTTL: 2 * time.Minute})
	now := f.clock.Now().Unix()
	expiring := fakeJWT(fmt.Sprintf(`{"aud":[%q],"exp":%d}`, apiAudience, now+30))
	f.api.addUser(expiring, authenticationv1.UserInfo{Username: promUser})
	expectStatus(t, f.do(metricsPath, "Bearer "+expiring), http.StatusOK)
	f.clock.Step(29 * time.Second)
	expectStatus(t, f.do(metricsPath, "Bearer "+expiring), http.StatusOK)
	expectReviews(t, f, 1, 1)
	// Expired: the API server rejects it, and its acceptance is no longer cached.
	f.api.removeUser(expiring)
	f.clock.Step(2 * time.Second)
	expectStatus(t, f.do(metricsPath, "Bearer "+expiring), http.StatusUnauthorized)
	expectReviews(t, f, 2, 1)

	// A token already expired by this clock (the API server's runs behind) is not cached.
	past := fakeJWT(fmt.Sprintf(`{"exp":%d}`, now))
	f.api.addUser(past, authenticationv1.UserInfo{Username: promUser})
	expectStatus(t, f.do(metricsPath, "Bearer "+past), http.StatusOK)
	expectStatus(t, f.do(metricsPath, "Bearer "+past), http.StatusOK)
	expectReviews(t, f, 4, 1)
	// An opaque token, or a JWT without exp, is cached for the allow TTL (the access, cached
	// since the start, is reviewed again meanwhile).
	expectStatus(t, f.do(metricsPath, "Bearer "+promToken), http.StatusOK)
	f.clock.Step(119 * time.Second)
	expectStatus(t, f.do(metricsPath, "Bearer "+promToken), http.StatusOK)
	expectReviews(t, f, 5, 2)
}

// The TokenReview names the configured audiences; a token for none of them is rejected, and so
// is an answer that names none (an authenticator ignoring audiences).
func TestAudiences(t *testing.T) {
	const pluginToken, pluginUser, otherToken = "plugin-token", "system:serviceaccount:monitoring:proxyhealth-viewer", "vault-token"
	f := newFixture(t, Config{}, "proxyhealth", apiAudience)
	f.api.addUser(pluginToken, authenticationv1.UserInfo{Username: pluginUser}, "proxyhealth")
	f.api.addUser(otherToken, authenticationv1.UserInfo{Username: promUser}, "vault")
	f.api.allow(pluginUser, "get", statusPath)
	expectStatus(t, f.doHeader(statusPath, pluginToken), http.StatusOK)
	if got := f.api.lastTokenAudiences; !slices.Equal(got, []string{"proxyhealth", apiAudience}) {
		t.Errorf("TokenReview audiences %q", got)
	}
	expectStatus(t, f.do(metricsPath, "Bearer "+promToken), http.StatusOK) // the API server's audience
	expectStatus(t, f.do(metricsPath, "Bearer "+otherToken), http.StatusUnauthorized)

	ignoring := newFixture(t, Config{}, "proxyhealth")
	ignoring.api.ignoreAudiences = true
	expectStatus(t, ignoring.do(metricsPath, "Bearer "+promToken), http.StatusUnauthorized)

	// None configured: the API server's own, and only those.
	plain := newFixture(t, Config{})
	plain.api.addUser(pluginToken, authenticationv1.UserInfo{Username: pluginUser}, "proxyhealth")
	plain.api.allow(pluginUser, "get", statusPath)
	expectStatus(t, plain.doHeader(statusPath, pluginToken), http.StatusUnauthorized)
	if got := plain.api.lastTokenAudiences; len(got) != 0 {
		t.Errorf("TokenReview audiences %q, want none", got)
	}
}

// flood sends one request for each of n invented tokens at once and returns each one's status
// and how long it took.
func flood(f *fixture, n int) (codes []int, took []time.Duration, wait func()) {
	codes, took = make([]int, n), make([]time.Duration, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			began := time.Now()
			w := f.do(metricsPath, fmt.Sprintf("Bearer invented-%d", i))
			codes[i], took[i] = w.Code, time.Since(began)
			if w.Code == http.StatusTooManyRequests && (!strings.Contains(w.Body.String(), "throttled") || w.Header().Get("Retry-After") == "") {
				panic(fmt.Sprintf("429 without the word throttled or Retry-After: %q %v", w.Body.String(), w.Header()))
			}
		})
	}
	return codes, took, wg.Wait
}

// Prometheus's answers have expired when 300 invented tokens arrive at once: its token and
// access were reviewed before, so they are reviewed again at once, ahead of the flood, and its
// scrape is served while the invented ones wait or are refused.
func TestKnownCallersAreServedDuringAFlood(t *testing.T) {
	// The fake API server's hold sets the pace, not the review timeout.
	f := newFixture(t, Config{ReviewTimeout: time.Minute})
	expectStatus(t, f.do(metricsPath, "Bearer "+promToken), http.StatusOK)
	f.clock.Step(DefaultAllowTTL + time.Second)
	// The invented tokens' reviews are not answered until Prometheus has been served: if its
	// scrape waited behind them, it would never be.
	invented := make(chan struct{})
	f.api.mu.Lock()
	f.api.holdUnknown = invented
	f.api.mu.Unlock()

	const n = 300
	codes, _, wait := flood(f, n)
	for deadline := time.Now().Add(30 * time.Second); f.auth.queue.waiting() < DefaultMaxReviewing+DefaultMaxWaiting; {
		if time.Now().After(deadline) {
			close(invented)
			t.Fatalf("the queue never filled: %d waiting", f.auth.queue.waiting())
		}
		time.Sleep(time.Millisecond)
	}
	began := time.Now()
	served := make(chan *httptest.ResponseRecorder, 1)
	go func() { served <- f.do(metricsPath, "Bearer "+promToken) }()
	select {
	case w := <-served:
		expectStatus(t, w, http.StatusOK)
	case <-time.After(30 * time.Second):
		close(invented)
		t.Fatal("Prometheus's scrape waited behind the invented tokens")
	}
	t.Logf("Prometheus's scrape with its answers expired, during a flood of %d invented tokens: %v", n, time.Since(began))
	close(invented)
	wait()
	count := map[int]int{}
	for _, c := range codes {
		count[c]++
	}
	t.Logf("the invented tokens: %v", count)
	if count[http.StatusUnauthorized]+count[http.StatusTooManyRequests] != n || count[http.StatusTooManyRequests] == 0 {
		t.Errorf("the invented tokens got %v, want 401 or 429 only, some 429", count)
	}
	if got := f.requests(resultThrottled); got != float64(count[http.StatusTooManyRequests]) {
		t.Errorf("throttled requests counted %v, want %d", got, count[http.StatusTooManyRequests])
	}
	if log := f.log.String(); strings.Contains(log, "does not answer") || !strings.Contains(log, "throttled") {
		t.Errorf("the log blames the API server, or does not say throttled:\n%s", log)
	}
}

// Past the queue, a new credential is refused at once with 429 and the word throttled, and the
// log says the exporter throttled it, once, without blaming the API server. Those admitted are
// reviewed once the API server answers.
func TestQueueOverflowIsThrottledAtOnce(t *testing.T) {
	// The fake API server's hold sets the pace, not the review timeout.
	f := newFixture(t, Config{MaxReviewing: 2, MaxWaiting: 3, ReviewTimeout: time.Minute})
	hold := make(chan struct{})
	f.api.mu.Lock()
	f.api.hold = hold
	f.api.mu.Unlock()
	codes, _, wait := flood(f, 5)
	for deadline := time.Now().Add(30 * time.Second); f.auth.queue.waiting() < 5; {
		if time.Now().After(deadline) {
			close(hold)
			t.Fatalf("the queue never filled: %d waiting", f.auth.queue.waiting())
		}
		time.Sleep(time.Millisecond)
	}
	answered := make(chan *httptest.ResponseRecorder, 2)
	began := time.Now()
	for i := range 2 {
		go func() { answered <- f.do(metricsPath, fmt.Sprintf("Bearer one-too-many-%d", i)) }()
	}
	for range 2 {
		select {
		case w := <-answered:
			expectStatus(t, w, http.StatusTooManyRequests)
			if !strings.Contains(w.Body.String(), "throttled") || w.Header().Get("Retry-After") != "1" {
				t.Errorf("429 body %q, Retry-After %q", w.Body.String(), w.Header().Get("Retry-After"))
			}
		case <-time.After(30 * time.Second):
			close(hold)
			t.Fatal("no answer past a full queue while the API server held every review")
		}
	}
	// Answered while the API server holds every review (it counts none until released):
	// refused without waiting for one.
	if tok, acc := f.api.counts(); tok != 0 || acc != 0 {
		t.Fatalf("%d TokenReviews and %d SubjectAccessReviews answered while held", tok, acc)
	}
	t.Logf("past a full queue, refused in %v", time.Since(began))
	log := f.log.String()
	if n := strings.Count(log, "level=WARN"); n != 1 || !strings.Contains(log, "throttled") || strings.Contains(log, "does not answer") {
		t.Errorf("want one warning saying throttled, not blaming the API server:\n%s", log)
	}
	if got := testutil.ToFloat64(f.auth.metrics.requests.WithLabelValues(resultThrottled)); got != 2 {
		t.Errorf("throttled requests counted %v, want 2", got)
	}
	close(hold)
	wait()
	for i, c := range codes {
		if c != http.StatusUnauthorized {
			t.Errorf("admitted invented token %d: %d, want 401", i, c)
		}
	}
	if tok, _ := f.api.counts(); tok != 5 {
		t.Errorf("%d TokenReviews, want 5: the refused ones are never sent", tok)
	}
}

// madeUpPaths has noRBACToken's user, whose token is valid, ask for n paths no RBAC allows,
// one after the other: each is denied.
func madeUpPaths(t *testing.T, f *fixture, n int) {
	t.Helper()
	for i := range n {
		expectStatus(t, f.do(fmt.Sprintf("/made-up-%d", i), "Bearer "+noRBACToken), http.StatusForbidden)
	}
}

// A caller with a valid token asking for hundreds of made-up paths, denied each, then asking
// for them all again once their denials have expired, gets no priority for the second round:
// a denied access is not known. So it cannot run the review rate into debt, and a new
// credential (a Prometheus with a freshly rotated token) is served once the flood is over,
// not refused with 429.
func TestMadeUpPathsCannotLockOutNewCredentials(t *testing.T) {
	const paths = 300
	// A burst that lets the first round through at once; the rate is the default's.
	f := newFixture(t, Config{ReviewBurst: paths + 10, MaxReviewing: 2, MaxWaiting: 3})
	madeUpPaths(t, f, paths)
	f.clock.Step(DefaultDenyTTL + time.Second)
	var wg sync.WaitGroup
	for i := range paths {
		wg.Go(func() {
			w := f.do(fmt.Sprintf("/made-up-%d", i), "Bearer "+noRBACToken)
			if w.Code != http.StatusForbidden && w.Code != http.StatusTooManyRequests {
				t.Errorf("made-up path %d again: %d, want 403 or 429", i, w.Code)
			}
		})
	}
	wg.Wait()
	const rotated = "rotated-prometheus-token"
	f.api.addUser(rotated, authenticationv1.UserInfo{Username: promUser})
	expectStatus(t, f.do(metricsPath, "Bearer "+rotated), http.StatusOK)
}

// Made-up paths, denied, push no known caller out: once Prometheus's answers have expired, its
// scrape is reviewed again at once while the queue is full, and the made-up paths' callers
// wait in the queue like new ones (here: refused, the queue being full).
func TestMadeUpPathsCannotPushOutAKnownCaller(t *testing.T) {
	const paths = 300
	f := newFixture(t, Config{CacheSize: 100, ReviewBurst: paths + 10, MaxReviewing: 2, MaxWaiting: 3, ReviewTimeout: time.Minute})
	expectStatus(t, f.do(metricsPath, "Bearer "+promToken), http.StatusOK)
	madeUpPaths(t, f, paths)
	f.clock.Step(DefaultAllowTTL + time.Second)

	release := fillQueue(t, f)
	prom := f.do(metricsPath, "Bearer "+promToken)
	madeUp := f.do("/made-up-0", "Bearer "+noRBACToken)
	release()
	expectStatus(t, prom, http.StatusOK)
	expectStatus(t, madeUp, http.StatusTooManyRequests)
}

// fillQueue holds every TokenReview of an unknown token and sends invented tokens until the
// queue of new credentials is full; the returned release lets them through and waits for
// their answers.
func fillQueue(t *testing.T, f *fixture) (release func()) {
	t.Helper()
	invented := make(chan struct{})
	f.api.mu.Lock()
	f.api.holdUnknown = invented
	f.api.mu.Unlock()
	full := f.auth.cfg.MaxReviewing + f.auth.cfg.MaxWaiting
	_, _, wait := flood(f, full)
	release = sync.OnceFunc(func() {
		close(invented)
		wait()
	})
	t.Cleanup(release)
	for deadline := time.Now().Add(30 * time.Second); f.auth.queue.waiting() < full; {
		if time.Now().After(deadline) {
			t.Fatalf("the queue never filled: %d waiting", f.auth.queue.waiting())
		}
		time.Sleep(time.Millisecond)
	}
	return release
}

// A caller allowed many paths (a wildcard such as /debug/pprof/*) makes as many known
// accesses, but tokens are known apart from accesses: Prometheus's token stays known, and is
// reviewed again at once while the queue is full.
func TestAccessesCannotPushOutAKnownToken(t *testing.T) {
	const wideToken, wideUser, paths = "wide-token", "system:serviceaccount:ops:debugger", 10
	f := newFixture(t, Config{CacheSize: 4, MaxReviewing: 2, MaxWaiting: 3, ReviewTimeout: time.Minute})
	f.api.addUser(wideToken, authenticationv1.UserInfo{Username: wideUser})
	for i := range paths {
		f.api.allow(wideUser, "get", fmt.Sprintf("/debug/pprof/%d", i))
	}
	expectStatus(t, f.do(metricsPath, "Bearer "+promToken), http.StatusOK)
	for i := range paths {
		expectStatus(t, f.do(fmt.Sprintf("/debug/pprof/%d", i), "Bearer "+wideToken), http.StatusOK)
	}
	// Prometheus's access, pushed out of the access cache, is reviewed again 10 s on; its token
	// is still cached.
	f.clock.Step(10 * time.Second)
	expectStatus(t, f.do(metricsPath, "Bearer "+promToken), http.StatusOK)
	expectReviews(t, f, 2, 12)
	// Its token's acceptance has expired, its access's not yet.
	f.clock.Step(DefaultAllowTTL - 9*time.Second)
	release := fillQueue(t, f)
	w := f.do(metricsPath, "Bearer "+promToken)
	release()
	expectStatus(t, w, http.StatusOK)
}

// concurrencyReviewer counts the most reviews it was asked at once.
type concurrencyReviewer struct {
	Reviewer
	mu            sync.Mutex
	running, most int
}

func (r *concurrencyReviewer) begin() func() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.running++
	r.most = max(r.most, r.running)
	return func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.running--
	}
}

func (r *concurrencyReviewer) ReviewToken(ctx context.Context, token string) (authenticationv1.UserInfo, bool, error) {
	defer r.begin()()
	return r.Reviewer.ReviewToken(ctx, token)
}

func (r *concurrencyReviewer) ReviewAccess(ctx context.Context, u authenticationv1.UserInfo, verb, path string) (bool, string, error) {
	defer r.begin()()
	return r.Reviewer.ReviewAccess(ctx, u, verb, path)
}

// Known reviews are bounded too: a caller allowed hundreds of paths, all of them known once
// their answers expire, gets at most MaxReviewing of them reviewed at once ahead of the queue,
// each at the review rate like any other, and the rest queue as new ones. The rate is never
// run into debt, and a new credential is served once the flood is over.
func TestKnownReviewsAreBounded(t *testing.T) {
	const wideToken, wideUser, paths = "wide-token", "system:serviceaccount:ops:debugger", 300
	f := newFixture(t, Config{ReviewBurst: paths + 10, MaxReviewing: 2, MaxWaiting: 3})
	reviewer := &concurrencyReviewer{Reviewer: f.auth.reviewer}
	f.auth.reviewer = reviewer
	f.api.addUser(wideToken, authenticationv1.UserInfo{Username: wideUser})
	for i := range paths {
		f.api.allow(wideUser, "get", fmt.Sprintf("/debug/pprof/%d", i))
	}
	for i := range paths {
		expectStatus(t, f.do(fmt.Sprintf("/debug/pprof/%d", i), "Bearer "+wideToken), http.StatusOK)
	}
	f.clock.Step(DefaultAllowTTL + time.Second)
	expectStatus(t, f.do(metricsPath, "Bearer "+wideToken), http.StatusForbidden) // its token, reviewed again
	reviewer.mu.Lock()
	reviewer.most = 0
	reviewer.mu.Unlock()
	var wg sync.WaitGroup
	for i := range paths {
		wg.Go(func() {
			w := f.do(fmt.Sprintf("/debug/pprof/%d", i), "Bearer "+wideToken)
			if w.Code != http.StatusOK && w.Code != http.StatusTooManyRequests {
				t.Errorf("path %d again: %d, want 200 or 429", i, w.Code)
			}
		})
	}
	wg.Wait()
	reviewer.mu.Lock()
	most := reviewer.most
	reviewer.mu.Unlock()
	if most > 2*f.auth.cfg.MaxReviewing {
		t.Errorf("%d reviews at once, want at most %d known and %d new", most, f.auth.cfg.MaxReviewing, f.auth.cfg.MaxReviewing)
	}
	// No more in debt than the reviews that may wait for their turn at once.
	if tokens := f.auth.queue.limiter.Tokens(); tokens < -float64(2*f.auth.cfg.MaxReviewing) {
		t.Errorf("the review rate is %.0f reviews in debt", -tokens)
	}
	const rotated = "rotated-prometheus-token"
	f.api.addUser(rotated, authenticationv1.UserInfo{Username: promUser})
	expectStatus(t, f.do(metricsPath, "Bearer "+rotated), http.StatusOK)
}

// A new credential whose turn at the review rate would come after the review timeout is
// refused at once with 429, not after waiting for the timeout.
func TestTurnPastTheTimeoutIsThrottledAtOnce(t *testing.T) {
	// One review, then one every 1,000 s: the second's turn is far past the minute.
	f := newFixture(t, Config{ReviewQPS: 0.001, ReviewBurst: 1, ReviewTimeout: time.Minute})
	expectStatus(t, f.do(metricsPath, "Bearer invented-0"), http.StatusUnauthorized)
	answered := make(chan *httptest.ResponseRecorder, 1)
	go func() { answered <- f.do(metricsPath, "Bearer invented-1") }()
	select {
	case w := <-answered:
		expectStatus(t, w, http.StatusTooManyRequests)
	case <-time.After(30 * time.Second):
		t.Fatal("a turn past the review timeout was waited for")
	}
	expectReviews(t, f, 1, 0)
}
