// Package kubeauth puts Kubernetes authentication and authorization in front of an HTTP
// handler, the way kube-rbac-proxy and controller-runtime's metrics filter do: the caller's
// bearer token is checked with a TokenReview, and whether its user may use the request's verb
// on the request's path (a non-resource URL such as /metrics) with a SubjectAccessReview. Both
// answers are remembered for a short while, allowed ones longer than denied ones, in caches of
// bounded size, so that a Prometheus scraping every 30 seconds costs the API server two
// reviews per TTL, not two per scrape.
//
// The token is read from the Authorization header ("Bearer <token>") or, where that header
// cannot pass, from TokenHeader: a proxy such as the API server's pod proxy removes
// Authorization from every request it has authenticated, so a client reading the exporter
// through one sends its token in TokenHeader. Either is reviewed the same way.
//
// Known callers are not starved by unknown ones: an answer is cached, and when it expires, a
// token accepted or an access allowed before is reviewed again ahead of new ones, while a new
// one (an invented token, say) waits in a bounded queue, and past that queue is refused at
// once with 429. Both kinds take their turns at one bounded rate, and a bounded number of
// known reviews run at once (past that they queue as new ones), so that neither kind can lock
// the other out. A cached acceptance ends no later than the token's own expiry.
//
// Anything but an allowed answer fails closed: no token or a rejected one is 401, a denied
// access 403, a review refused by the exporter's own limit 429, and a review the API server
// did not answer 503.
package kubeauth

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sync/singleflight"
	authenticationv1 "k8s.io/api/authentication/v1"
	"k8s.io/apimachinery/pkg/util/cache"
)

// Defaults of Config's zero values.
const (
	// DefaultAllowTTL and DefaultDenyTTL: between controller-runtime's metrics filter (tokens
	// 1m, allowed access 5m, denied 30s) and kube-rbac-proxy (tokens 2m).
	DefaultAllowTTL = 2 * time.Minute
	DefaultDenyTTL  = 30 * time.Second
	// DefaultCacheSize is each cache's number of entries: far more callers than a metrics
	// endpoint has, and at most a few hundred KiB.
	DefaultCacheSize = 1024
	// DefaultReviewTimeout bounds one review, as in controller-runtime's filter.
	DefaultReviewTimeout = 10 * time.Second
	// DefaultKnownTTL is how long a credential once accepted, or a user and path once
	// allowed, counts as known: its next review does not queue behind new ones. A
	// ServiceAccount token lives an hour before the kubelet replaces it.
	DefaultKnownTTL = time.Hour
	// DefaultReviewQPS and DefaultReviewBurst bound the reviews sent to the API server: each
	// new token costs one, so callers inventing tokens could otherwise turn every request into
	// one.
	DefaultReviewQPS   = 10
	DefaultReviewBurst = 20
	// DefaultMaxReviewing and DefaultMaxWaiting bound the reviews of new credentials running
	// at once and waiting for their turn (what waits clears within a few seconds at the
	// review rate); DefaultMaxReviewing, apart, the reviews of known ones running at once.
	DefaultMaxReviewing = 4
	DefaultMaxWaiting   = 2 * DefaultReviewBurst
)

// TokenHeader carries a bearer token where the Authorization header cannot: the API server's
// pod proxy removes Authorization from the requests it forwards. Its value is the token alone.
// A client reading through a proxy of that kind sends it (the API server's pod proxy, which
// no role the project ships grants).
const TokenHeader = "X-Proxyhealth-Token"

// Config shapes an Auth. The zero value is the defaults.
type Config struct {
	// AllowTTL is how long an authenticated token and an allowed access are remembered:
	// taking a caller's RBAC away takes effect within it.
	AllowTTL time.Duration
	// DenyTTL is how long a rejected token and a denied access are remembered: granting
	// access takes effect within it.
	DenyTTL time.Duration
	// CacheSize bounds each cache (accepted tokens, rejected tokens, access decisions, known
	// tokens, known accesses), in entries; the least recently used goes first. Rejected tokens
	// have their own cache, so that callers inventing tokens cannot push a known caller out.
	CacheSize int
	// ReviewTimeout bounds one review, its wait for a turn included.
	ReviewTimeout time.Duration
	// KnownTTL is how long a credential once accepted, and a user and path once allowed,
	// are known: reviewed again without queueing behind new ones.
	KnownTTL time.Duration
	// ReviewQPS and ReviewBurst bound the rate of reviews sent to the API server.
	ReviewQPS   float64
	ReviewBurst int
	// MaxReviewing bounds the reviews of new credentials sent at once, and apart from them
	// those of known ones; MaxWaiting, the new ones waiting for their turn. Past both a new
	// one is refused at once with 429.
	MaxReviewing, MaxWaiting int
	// Realm is named in the WWW-Authenticate header of a 401.
	Realm string
	// Clock reads the time for the caches' expiry; nil is the real clock (tests set one).
	Clock cache.Clock
}

func (c *Config) setDefaults() error {
	if c.AllowTTL == 0 {
		c.AllowTTL = DefaultAllowTTL
	}
	if c.DenyTTL == 0 {
		c.DenyTTL = DefaultDenyTTL
	}
	if c.CacheSize == 0 {
		c.CacheSize = DefaultCacheSize
	}
	if c.ReviewTimeout == 0 {
		c.ReviewTimeout = DefaultReviewTimeout
	}
	if c.KnownTTL == 0 {
		c.KnownTTL = DefaultKnownTTL
	}
	if c.ReviewQPS == 0 {
		c.ReviewQPS = DefaultReviewQPS
	}
	if c.ReviewBurst == 0 {
		c.ReviewBurst = DefaultReviewBurst
	}
	if c.MaxReviewing == 0 {
		c.MaxReviewing = DefaultMaxReviewing
	}
	if c.MaxWaiting == 0 {
		c.MaxWaiting = DefaultMaxWaiting
	}
	switch {
	case c.AllowTTL < 0:
		return fmt.Errorf("allow TTL must be positive, got %v", c.AllowTTL)
	case c.DenyTTL < 0:
		return fmt.Errorf("deny TTL must be positive, got %v", c.DenyTTL)
	case c.CacheSize < 0:
		return fmt.Errorf("cache size must be positive, got %d", c.CacheSize)
	case c.ReviewTimeout < 0:
		return fmt.Errorf("review timeout must be positive, got %v", c.ReviewTimeout)
	case c.KnownTTL < 0:
		return fmt.Errorf("known TTL must be positive, got %v", c.KnownTTL)
	case c.ReviewQPS < 0 || c.ReviewBurst < 0:
		return fmt.Errorf("review rate must be positive, got %v a second, burst %d", c.ReviewQPS, c.ReviewBurst)
	case c.MaxReviewing < 0 || c.MaxWaiting < 0:
		return fmt.Errorf("review queue must be positive, got %d reviewing and %d waiting", c.MaxReviewing, c.MaxWaiting)
	}
	if c.Clock == nil {
		c.Clock = realClock{}
	}
	return nil
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

// Auth authenticates and authorizes requests with the API server; Wrap puts it in front of a
// handler. It is a prometheus.Collector of its own counters.
type Auth struct {
	cfg      Config
	reviewer Reviewer
	logger   *slog.Logger

	// Keyed by the SHA-256 of the token (the tokens themselves are not kept): accepted
	// tokens hold their user, rejected ones nothing.
	acceptedTokens, rejectedTokens *cache.LRUExpireCache
	// Keyed by accessKey: a decision.
	access *cache.LRUExpireCache
	// Keyed by the reviews' flight keys: the tokens accepted and the accesses allowed before,
	// whose next review does not queue behind new ones. Apart, so that a caller allowed many
	// paths cannot push a known token out.
	knownTokens, knownAccesses *cache.LRUExpireCache
	queue                      *reviewQueue
	// Concurrent requests with the same token, or the same user and request, wait on one
	// review.
	flight singleflight.Group
	// failing is set while the API server does not answer reviews: its first failure is
	// logged, then nothing until it answers again.
	failing atomic.Bool
	// throttling is set while new credentials are refused for want of a place in the queue:
	// logged once, then nothing until one is admitted to an empty queue.
	throttling atomic.Bool
	// sharing counts the callers waiting on a review in flight, each once it has joined it:
	// what tests wait for before they let a review answer.
	sharing atomic.Int64

	metrics *metrics
}

type decision struct {
	allowed bool
	reason  string
}

// New returns an Auth asking reviewer.
func New(cfg Config, reviewer Reviewer, logger *slog.Logger) (*Auth, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	return &Auth{
		cfg:            cfg,
		reviewer:       reviewer,
		logger:         logger,
		acceptedTokens: cache.NewLRUExpireCacheWithClock(cfg.CacheSize, cfg.Clock),
		rejectedTokens: cache.NewLRUExpireCacheWithClock(cfg.CacheSize, cfg.Clock),
		access:         cache.NewLRUExpireCacheWithClock(cfg.CacheSize, cfg.Clock),
		knownTokens:    cache.NewLRUExpireCacheWithClock(cfg.CacheSize, cfg.Clock),
		knownAccesses:  cache.NewLRUExpireCacheWithClock(cfg.CacheSize, cfg.Clock),
		queue:          newReviewQueue(cfg.MaxReviewing, cfg.MaxWaiting, cfg.ReviewQPS, cfg.ReviewBurst),
		metrics:        newMetrics(),
	}, nil
}

// Wrap returns next behind authentication and authorization. Every path goes through: the
// authorized path is the request's own, as the API server's non-resource URLs are, and the verb
// its method in lower case (GET: get). An unclean path (/metrics/../status) is authorized as it
// is and then only redirected by net/http's ServeMux, so the clean path is authorized in turn.
func (a *Auth) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, ok := bearerToken(r)
		if !ok {
			a.metrics.requests.WithLabelValues(resultUnauthenticated).Inc()
			a.unauthorized(w, "")
			return
		}
		user, authenticated, err := a.authenticate(r.Context(), token)
		if err != nil {
			a.failed(w, r, err)
			return
		}
		if !authenticated {
			a.metrics.requests.WithLabelValues(resultUnauthenticated).Inc()
			a.unauthorized(w, "invalid_token")
			return
		}
		verb, path := strings.ToLower(r.Method), r.URL.Path
		d, err := a.authorize(r.Context(), user, verb, path)
		if err != nil {
			a.failed(w, r, err)
			return
		}
		if !d.allowed {
			a.metrics.requests.WithLabelValues(resultForbidden).Inc()
			a.logger.Debug("request denied", "user", user.Username, "verb", verb, "path", path, "reason", d.reason)
			http.Error(w, fmt.Sprintf("Forbidden: user %q may not %s %s", user.Username, verb, path), http.StatusForbidden)
			return
		}
		a.metrics.requests.WithLabelValues(resultAllowed).Inc()
		// The token is the caller's credential: nothing behind needs it.
		r.Header.Del("Authorization")
		r.Header.Del(TokenHeader)
		next.ServeHTTP(w, r)
	})
}

// bearerToken reads "Authorization: Bearer <token>" as the API server does, or else
// TokenHeader.
func bearerToken(r *http.Request) (string, bool) {
	scheme, token, ok := strings.Cut(strings.TrimSpace(r.Header.Get("Authorization")), " ")
	if ok && strings.EqualFold(scheme, "bearer") {
		if token = strings.TrimSpace(token); token != "" {
			return token, true
		}
	}
	token = strings.TrimSpace(r.Header.Get(TokenHeader))
	return token, token != ""
}

func (a *Auth) unauthorized(w http.ResponseWriter, bearerError string) {
	challenge := "Bearer"
	if a.cfg.Realm != "" {
		challenge += fmt.Sprintf(" realm=%q", a.cfg.Realm)
	}
	if bearerError != "" {
		// RFC 6750 3.1: the token was given but is not valid.
		sep := " "
		if a.cfg.Realm != "" {
			sep = ", "
		}
		challenge += sep + fmt.Sprintf("error=%q", bearerError)
	}
	w.Header().Set("WWW-Authenticate", challenge)
	http.Error(w, "Unauthorized: a Kubernetes bearer token is required", http.StatusUnauthorized)
}

// failed answers a request whose review failed: refused by the exporter's own queue (429), or
// not answered by the API server (503). A caller that went away meanwhile is neither.
func (a *Auth) failed(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() != nil {
		return
	}
	if errors.Is(err, errThrottled) {
		a.throttled(w, err)
		return
	}
	a.metrics.requests.WithLabelValues(resultUnavailable).Inc()
	if a.failing.CompareAndSwap(false, true) {
		a.logger.Error("the Kubernetes API server does not answer authentication or authorization reviews: every request that needs one is refused with 503 until it does", "err", err)
	} else {
		a.logger.Debug("review failed", "err", err)
	}
	http.Error(w, "Service Unavailable: the Kubernetes API server could not review this request", http.StatusServiceUnavailable)
}

// throttled answers a request whose credential the exporter did not send for review: too many
// new ones wait already. Nothing here is the API server's doing, and the log says so.
func (a *Auth) throttled(w http.ResponseWriter, err error) {
	a.metrics.requests.WithLabelValues(resultThrottled).Inc()
	if a.throttling.CompareAndSwap(false, true) {
		a.logger.Warn("throttled: requests with new credentials are refused with 429 while the exporter's queue of reviews is full; callers with credentials reviewed before are still served (not an API server failure)",
			"reviewing", a.cfg.MaxReviewing, "waiting", a.cfg.MaxWaiting, "reviews_per_second", a.cfg.ReviewQPS, "err", err)
	} else {
		a.logger.Debug("throttled", "err", err)
	}
	w.Header().Set("Retry-After", "1")
	http.Error(w, "Too Many Requests: throttled: too many new credentials are waiting for review by this exporter; retry shortly", http.StatusTooManyRequests)
}

// answered notes that the API server answered a review.
func (a *Auth) answered() {
	if a.failing.CompareAndSwap(true, false) {
		a.logger.Info("the Kubernetes API server answers reviews again")
	}
}

// authenticate returns the token's user from the caches, or asks the API server.
func (a *Auth) authenticate(ctx context.Context, token string) (authenticationv1.UserInfo, bool, error) {
	key := sha256.Sum256([]byte(token))
	if v, ok := a.acceptedTokens.Get(key); ok {
		a.metrics.cacheHits.WithLabelValues(reviewToken).Inc()
		return v.(authenticationv1.UserInfo), true, nil
	}
	if _, ok := a.rejectedTokens.Get(key); ok {
		a.metrics.cacheHits.WithLabelValues(reviewToken).Inc()
		return authenticationv1.UserInfo{}, false, nil
	}
	v, err := a.shared(ctx, "token\x00"+string(key[:]), a.knownTokens, func(ctx context.Context, flightKey string) (any, error) {
		user, ok, err := a.reviewer.ReviewToken(ctx, token)
		switch {
		case err != nil:
			a.metrics.reviews.WithLabelValues(reviewToken, resultError).Inc()
			return nil, err
		case ok:
			a.metrics.reviews.WithLabelValues(reviewToken, resultAuthenticated).Inc()
			// Neither the acceptance nor the token's standing as known outlive the token.
			ttl, known := a.cfg.AllowTTL, a.cfg.KnownTTL
			if exp, ok := tokenExpiry(token); ok {
				left := exp.Sub(a.cfg.Clock.Now())
				ttl, known = min(ttl, left), min(known, left)
			}
			if ttl > 0 {
				a.acceptedTokens.Add(key, user, ttl)
			}
			if known > 0 {
				a.knownTokens.Add(flightKey, struct{}{}, known)
			}
		default:
			a.metrics.reviews.WithLabelValues(reviewToken, resultUnauthenticated).Inc()
			a.rejectedTokens.Add(key, struct{}{}, a.cfg.DenyTTL)
		}
		a.answered()
		return tokenAnswer{user, ok}, nil
	})
	if err != nil {
		return authenticationv1.UserInfo{}, false, err
	}
	t := v.(tokenAnswer)
	return t.user, t.authenticated, nil
}

type tokenAnswer struct {
	user          authenticationv1.UserInfo
	authenticated bool
}

// authorize returns whether user may use verb on path, from the cache or the API server.
func (a *Auth) authorize(ctx context.Context, user authenticationv1.UserInfo, verb, path string) (decision, error) {
	key := accessKey(user, verb, path)
	if v, ok := a.access.Get(key); ok {
		a.metrics.cacheHits.WithLabelValues(reviewAccess).Inc()
		return v.(decision), nil
	}
	v, err := a.shared(ctx, "access\x00"+string(key[:]), a.knownAccesses, func(ctx context.Context, flightKey string) (any, error) {
		allowed, reason, err := a.reviewer.ReviewAccess(ctx, user, verb, path)
		if err != nil {
			a.metrics.reviews.WithLabelValues(reviewAccess, resultError).Inc()
			return nil, err
		}
		d := decision{allowed: allowed, reason: reason}
		if allowed {
			a.metrics.reviews.WithLabelValues(reviewAccess, resultAllowed).Inc()
			a.access.Add(key, d, a.cfg.AllowTTL)
			// Only an allowed access is known: a caller free to invent paths, each denied,
			// would otherwise make as many known ones as it liked.
			a.knownAccesses.Add(flightKey, struct{}{}, a.cfg.KnownTTL)
		} else {
			a.metrics.reviews.WithLabelValues(reviewAccess, resultDenied).Inc()
			a.access.Add(key, d, a.cfg.DenyTTL)
		}
		a.answered()
		return d, nil
	})
	if err != nil {
		return decision{}, err
	}
	return v.(decision), nil
}

// shared runs review once for every concurrent caller with the same key, ahead of the queue for
// a key in known and in it for a new one. The review has its own deadline, not the first
// caller's: a scrape that gives up must not fail the others waiting on the same answer. Each
// caller still stops waiting when its own request ends.
func (a *Auth) shared(ctx context.Context, key string, known *cache.LRUExpireCache, review func(ctx context.Context, key string) (any, error)) (any, error) {
	ch := a.flight.DoChan(key, func() (any, error) {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), a.cfg.ReviewTimeout)
		defer cancel()
		var v any
		run := func() error {
			var err error
			v, err = review(rctx, key)
			return err
		}
		var err error
		if _, ok := known.Get(key); ok {
			err = a.queue.known(rctx, run)
		} else {
			err = a.queue.unknown(rctx, run)
		}
		if !errors.Is(err, errThrottled) && a.queue.waiting() == 0 {
			a.throttling.Store(false)
		}
		return v, err
	})
	a.sharing.Add(1)
	defer a.sharing.Add(-1)
	select {
	case res := <-ch:
		return res.Val, res.Err
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting for a review: %w", ctx.Err())
	}
}

// accessKey identifies a user (every field a SubjectAccessReview sends) and a request. Each
// field is length-prefixed, so that no two different requests share a key whatever their
// strings hold.
func accessKey(u authenticationv1.UserInfo, verb, path string) [sha256.Size]byte {
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	write := func(s string) {
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(s)))])
		h.Write([]byte(s))
	}
	write(u.Username)
	write(u.UID)
	h.Write(n[:binary.PutUvarint(n[:], uint64(len(u.Groups)))])
	for _, g := range u.Groups {
		write(g)
	}
	keys := make([]string, 0, len(u.Extra))
	for k := range u.Extra {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	h.Write(n[:binary.PutUvarint(n[:], uint64(len(keys)))])
	for _, k := range keys {
		write(k)
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(u.Extra[k])))])
		for _, v := range u.Extra[k] {
			write(v)
		}
	}
	write(verb)
	write(path)
	var key [sha256.Size]byte
	h.Sum(key[:0])
	return key
}
