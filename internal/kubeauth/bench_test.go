package kubeauth

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
)

// countingReviewer allows one token to get one path, and counts what it was asked.
type countingReviewer struct{ asked int }

func (r *countingReviewer) ReviewToken(_ context.Context, token string) (authenticationv1.UserInfo, bool, error) {
	r.asked++
	return authenticationv1.UserInfo{
		Username: "system:serviceaccount:monitoring:prometheus-k8s",
		UID:      "3f0e1c9a-4a51-4d38-9d5e-2b1f0c4f6a11",
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:monitoring", "system:authenticated"},
		Extra: map[string]authenticationv1.ExtraValue{
			"authentication.kubernetes.io/pod-name": {"prometheus-k8s-0"},
			"authentication.kubernetes.io/pod-uid":  {"0b9b1f1e-8f57-4d0b-a6f3-0d9f3c4d1e22"},
		},
	}, true, nil
}

func (r *countingReviewer) ReviewAccess(context.Context, authenticationv1.UserInfo, string, string) (bool, string, error) {
	r.asked++
	return true, "", nil
}

// BenchmarkWarmCache is what the check adds to a request once both answers are cached (a
// Prometheus scraping within the allow TTL): the handler alone, then behind the check. The
// token is a ServiceAccount token's size.
func BenchmarkWarmCache(b *testing.B) {
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	token := string(make([]byte, 900))
	run := func(b *testing.B, h http.Handler) {
		r := httptest.NewRequest(http.MethodGet, "/metrics", nil)
		b.ReportAllocs()
		for b.Loop() {
			r.Header.Set("Authorization", "Bearer x"+token)
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != http.StatusOK {
				b.Fatalf("status %d", w.Code)
			}
		}
	}
	b.Run("handler", func(b *testing.B) { run(b, next) })
	b.Run("behind_check", func(b *testing.B) {
		reviewer := &countingReviewer{}
		a, err := New(Config{}, reviewer, slog.New(slog.DiscardHandler))
		if err != nil {
			b.Fatal(err)
		}
		run(b, a.Wrap(next))
		if reviewer.asked != 2 {
			b.Fatalf("the reviewer was asked %d times, want 2 (one token, one access)", reviewer.asked)
		}
	})
}
