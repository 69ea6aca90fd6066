package cluster

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// countingLimiter is a client-side rate limiter that lets every request through at once and
// counts those that asked.
type countingLimiter struct{ waits atomic.Int32 }

func (l *countingLimiter) TryAccept() bool { l.waits.Add(1); return true }
func (l *countingLimiter) Accept()         { l.waits.Add(1) }
func (l *countingLimiter) Stop()           {}
func (l *countingLimiter) QPS() float32    { return 5 }
func (l *countingLimiter) Wait(context.Context) error {
	l.waits.Add(1)
	return nil
}

// A paged list through the view's real REST client asks the client-side rate limiter for its
// first page only: client-go's limiter would make each continuation wait too.
func TestPagedListLimitsOnlyTheFirstPage(t *testing.T) {
	const pages = 4
	var continues []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/apis/discovery.k8s.io/v1/endpointslices" {
			http.Error(w, "unexpected path "+r.URL.Path, http.StatusNotFound)
			return
		}
		q := r.URL.Query()
		continues = append(continues, q.Get("continue"))
		page := 0
		if c := q.Get("continue"); c != "" {
			page, _ = strconv.Atoi(c)
		}
		list := discoveryv1.EndpointSliceList{
			TypeMeta: metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSliceList"},
			ListMeta: metav1.ListMeta{ResourceVersion: "42"},
			Items:    []discoveryv1.EndpointSlice{*epSlice("s"+strconv.Itoa(page), "svc", ipv4, httpPort, apiEP("10.0.0."+strconv.Itoa(page+1), ""))},
		}
		if page < pages-1 {
			list.Continue = strconv.Itoa(page + 1)
		}
		if got := q.Get("limit"); got != strconv.Itoa(listPageSize) {
			http.Error(w, "limit "+got, http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if err := json.NewEncoder(w).Encode(&list); err != nil {
			t.Error(err)
		}
	}))
	defer srv.Close()

	limiter := &countingLimiter{}
	api, err := newRESTSource(&rest.Config{Host: srv.URL, RateLimiter: limiter})
	if err != nil {
		t.Fatal(err)
	}
	lw := newListWatch(api.endpointSlices, kindSlice, "node-a", false, kindStore{newState("node-a"), kindSlice}.Transformer(), nil)
	obj, err := lw.(cache.ListerWatcherWithContext).ListWithContext(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(obj.(*compactList).Items); n != pages {
		t.Errorf("%d slices listed, want %d", n, pages)
	}
	if len(continues) != pages || continues[0] != "" || continues[pages-1] != strconv.Itoa(pages-1) {
		t.Errorf("continue tokens asked %q, want none, then 1 to %d", continues, pages-1)
	}
	if n := limiter.waits.Load(); n != 1 {
		t.Errorf("the rate limiter was asked %d times for a list of %d pages, want once", n, pages)
	}
	if err := api.probe(context.Background()); err == nil {
		t.Error("probe of a server without /version succeeded")
	}
	if n := limiter.waits.Load(); n != 1 {
		t.Errorf("the probe asked the rate limiter (%d asks in all, want 1)", n)
	}
}

// The view's transport is its own, with the HTTP/2 stream limit set: a client built from the
// same configuration afterwards (the exporter's other API clients) gets client-go's shared
// transport, untouched, and never the view's.
func TestViewTransportIsItsOwn(t *testing.T) {
	cfg := &rest.Config{Host: "https://127.0.0.1:1", BearerToken: "t", TLSClientConfig: rest.TLSClientConfig{Insecure: true}}
	_, view, err := newViewHTTPClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	viewTransport := innerTransport(view.Transport)
	if viewTransport == nil || viewTransport.HTTP2 == nil || viewTransport.HTTP2.MaxReceiveBufferPerStream != http2StreamBuffer {
		t.Fatalf("view's transport %#v, want one with %d bytes per HTTP/2 stream", viewTransport, http2StreamBuffer)
	}
	if cfg.Proxy != nil || cfg.WrapTransport != nil {
		t.Error("building the view's client changed the configuration it was given")
	}
	other, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	otherTransport := innerTransport(other.Transport)
	switch {
	case otherTransport == nil:
		t.Fatalf("no http.Transport under %T", other.Transport)
	case otherTransport == viewTransport:
		t.Error("a client built from the same configuration shares the view's transport")
	case otherTransport.HTTP2 != nil:
		t.Errorf("a client built from the same configuration has HTTP/2 settings %+v", otherTransport.HTTP2)
	}
}
