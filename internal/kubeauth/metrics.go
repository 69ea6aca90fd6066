package kubeauth

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/proxyhealth/proxyhealth/internal/metricdesc"
)

// Label values of the metrics.
const (
	resultAllowed         = "allowed"
	resultDenied          = "denied"
	resultForbidden       = "forbidden"
	resultAuthenticated   = "authenticated"
	resultUnauthenticated = "unauthenticated"
	resultUnavailable     = "unavailable"
	resultThrottled       = "throttled"
	resultError           = "error"

	reviewToken  = "token"
	reviewAccess = "access"
)

type metrics struct {
	requests  *prometheus.CounterVec
	reviews   *prometheus.CounterVec
	cacheHits *prometheus.CounterVec
}

func newMetrics() *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: metricdesc.Namespace, Subsystem: "kubernetes_auth", Name: "requests_total",
			Help: "HTTP requests checked with Kubernetes authentication and authorization (--web.kubernetes-auth), by result: allowed, unauthenticated (401), forbidden (403), throttled (429: too many new credentials were waiting for review, the exporter's own limit), unavailable (503: the API server did not answer a review).",
		}, []string{"result"}),
		reviews: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: metricdesc.Namespace, Subsystem: "kubernetes_auth", Name: "reviews_total",
			Help: "Reviews sent to the Kubernetes API server, by review (token: TokenReview, access: SubjectAccessReview) and result (authenticated, unauthenticated, allowed, denied, error).",
		}, []string{"review", "result"}),
		cacheHits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: metricdesc.Namespace, Subsystem: "kubernetes_auth", Name: "cache_hits_total",
			Help: "Reviews answered from the cache instead of the Kubernetes API server, by review (token, access).",
		}, []string{"review"}),
	}
	// Every series from the start, so that rate() sees the first one.
	for _, r := range []string{resultAllowed, resultUnauthenticated, resultForbidden, resultThrottled, resultUnavailable} {
		m.requests.WithLabelValues(r)
	}
	for _, r := range []string{resultAuthenticated, resultUnauthenticated, resultError} {
		m.reviews.WithLabelValues(reviewToken, r)
	}
	for _, r := range []string{resultAllowed, resultDenied, resultError} {
		m.reviews.WithLabelValues(reviewAccess, r)
	}
	m.cacheHits.WithLabelValues(reviewToken)
	m.cacheHits.WithLabelValues(reviewAccess)
	return m
}

// Describe implements prometheus.Collector.
func (a *Auth) Describe(ch chan<- *prometheus.Desc) {
	a.metrics.requests.Describe(ch)
	a.metrics.reviews.Describe(ch)
	a.metrics.cacheHits.Describe(ch)
}

// Collect implements prometheus.Collector.
func (a *Auth) Collect(ch chan<- prometheus.Metric) {
	a.metrics.requests.Collect(ch)
	a.metrics.reviews.Collect(ch)
	a.metrics.cacheHits.Collect(ch)
}
