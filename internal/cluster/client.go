package cluster

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/transport"
)

// The view's own API client: REST clients for the two API groups it reads, decoding with a
// scheme that knows only theirs. client-go's clientset links and registers every API group:
// a program that runs only the view is two and a half times the size with it and, before its
// first request, holds about 15 MiB more resident memory (mostly the binary's pages that
// package initialisation touches; bench/apiview's floor). The view needs three resources.

// resourceClient lists and watches one resource across all namespaces.
type resourceClient struct {
	list  func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error)
	watch func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
}

// apiSource is everything the view asks the API server.
type apiSource struct {
	services, endpointSlices, nodes resourceClient
	// probe asks for /version on the watches' own HTTP client; nil when there is none (a
	// fake clientset in tests).
	probe func(ctx context.Context) error
	// noWatchList is set for clients that cannot stream a list (a fake clientset): the
	// reflectors then list and watch.
	noWatchList bool
}

// viewScheme is the scheme of the view's client: metav1's list and watch types, core/v1
// and discovery/v1, as client-go's kubernetes/scheme registers them.
var viewScheme = sync.OnceValues(func() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	metav1.AddToGroupVersion(s, schema.GroupVersion{Version: "v1"})
	if err := corev1.AddToScheme(s); err != nil {
		return nil, fmt.Errorf("registering core/v1: %w", err)
	}
	if err := discoveryv1.AddToScheme(s); err != nil {
		return nil, fmt.Errorf("registering discovery/v1: %w", err)
	}
	return s, nil
})

// newRESTSource builds the view's clients for cfg. They share one http.Client, as a
// clientset's groups do, so every list, watch and probe travels on the same HTTP/2
// connection: if it dies (incident 3), the probe fails too, where a fresh connection would
// succeed and hide it.
func newRESTSource(cfg *rest.Config) (*apiSource, error) {
	scheme, err := viewScheme()
	if err != nil {
		return nil, err
	}
	codecs := serializer.NewCodecFactory(scheme)
	params := runtime.NewParameterCodec(scheme)
	base, httpClient, err := newViewHTTPClient(cfg)
	if err != nil {
		return nil, err
	}
	clientFor := func(gv schema.GroupVersion, apiPath string, rateLimited bool) (*rest.RESTClient, error) {
		c := rest.CopyConfig(base)
		c.GroupVersion = &gv
		c.APIPath = apiPath
		c.NegotiatedSerializer = codecs.WithoutConversion()
		if !rateLimited {
			c.QPS, c.RateLimiter = -1, nil
		}
		rc, err := rest.RESTClientForConfigAndClient(c, httpClient)
		if err != nil {
			return nil, fmt.Errorf("building the %s client for %s: %w", gv, cfg.Host, err)
		}
		return rc, nil
	}
	// Each group has a client behind the client-side rate limit, for what starts a list or a
	// watch, and one outside it, for the pages that continue a list (restResource) and for
	// the probe, which a burst of relists would otherwise make wait (and time out) and which
	// asks only once per probe interval.
	core, err := clientFor(corev1.SchemeGroupVersion, "/api", true)
	if err != nil {
		return nil, err
	}
	coreUnthrottled, err := clientFor(corev1.SchemeGroupVersion, "/api", false)
	if err != nil {
		return nil, err
	}
	discovery, err := clientFor(discoveryv1.SchemeGroupVersion, "/apis", true)
	if err != nil {
		return nil, err
	}
	discoveryUnthrottled, err := clientFor(discoveryv1.SchemeGroupVersion, "/apis", false)
	if err != nil {
		return nil, err
	}
	return &apiSource{
		services:       restResource(core, coreUnthrottled, params, "services", func() runtime.Object { return &corev1.ServiceList{} }),
		endpointSlices: restResource(discovery, discoveryUnthrottled, params, "endpointslices", func() runtime.Object { return &discoveryv1.EndpointSliceList{} }),
		nodes:          restResource(core, coreUnthrottled, params, "nodes", func() runtime.Object { return &corev1.NodeList{} }),
		// /version is the cheapest request the API server answers for any authenticated
		// client (no etcd read, allowed by the default system:public-info-viewer role).
		probe: func(ctx context.Context) error { return coreUnthrottled.Get().AbsPath("/version").Do(ctx).Error() },
	}, nil
}

// newViewHTTPClient returns the view's copy of cfg and the one http.Client all its requests
// use, on a transport of its own: client-go hands clients whose TLS settings are equal one
// shared transport (its TLS cache), and limitStreamBuffer changes the transport, which other
// clients built from the same configuration (Config.RESTConfig) must neither see nor race
// with. client-go never shares the transport of a configuration with a Proxy function.
func newViewHTTPClient(cfg *rest.Config) (*rest.Config, *http.Client, error) {
	base := rest.CopyConfig(cfg)
	if base.UserAgent == "" {
		base.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	if base.Proxy == nil {
		base.Proxy = http.ProxyFromEnvironment // what client-go's own transports do
	}
	base.WrapTransport = transport.Wrappers(base.WrapTransport, limitStreamBuffer)
	httpClient, err := rest.HTTPClientFor(base)
	if err != nil {
		return nil, nil, fmt.Errorf("building the HTTP client for %s: %w", cfg.Host, err)
	}
	return base, httpClient, nil
}

// http2StreamBuffer bounds what the API server may send ahead on one list or watch before
// the view reads it. With x/net/http2's default, 4 MiB per stream, the server streams a
// list of 10,000 EndpointSlices faster than the reflector converts it, and the client
// buffers megabytes of it on top of the view. 256 KiB in flight still carries over 100 MB/s
// at a millisecond's round trip, far more than the API server sends one watch.
const http2StreamBuffer = 256 << 10

// limitStreamBuffer sets http2StreamBuffer on the http.Transport client-go built for the
// view's config before the transport opens a connection (x/net/http2 reads the transport's
// HTTP2 settings for each new connection); the transport is the view's own
// (newViewHTTPClient). A transport with settings of its own, or net/http's shared default,
// is left alone.
func limitStreamBuffer(rt http.RoundTripper) http.RoundTripper {
	if t := innerTransport(rt); t != nil && t != http.DefaultTransport && t.HTTP2 == nil {
		t.HTTP2 = &http.HTTP2Config{MaxReceiveBufferPerStream: http2StreamBuffer}
	}
	return rt
}

// innerTransport is the http.Transport under rt, or nil. client-go hands over its transport
// wrapped (its TLS cache's tracking, CA file rotation, whose replacement transports are
// clones that keep the HTTP2 settings); each wrapper says what it wraps.
func innerTransport(rt http.RoundTripper) *http.Transport {
	for {
		switch t := rt.(type) {
		case *http.Transport:
			return t
		case utilnet.RoundTripperWrapper:
			rt = t.WrappedRoundTripper()
		default:
			return nil
		}
	}
}

// restResource lists and watches resource as the generated typed clients do
// (k8s.io/client-go/gentype: List and Watch), across all namespaces. A list's first page and
// every watch go through started, behind the client-side rate limit; the pages that continue
// a list go through continued, outside it. client-go's limiter (5 requests a second after a
// burst of 10 by default) makes every request wait, continuations too: it would hold a list
// of 10,000 objects in pages of listPageSize for 18 s. It is there to space out the lists
// and watches a client starts, relists above all, and a list's continuations are part of
// one; the API server's priority and fairness still weighs each page.
func restResource(started, continued rest.Interface, params runtime.ParameterCodec, resource string, newList func() runtime.Object) resourceClient {
	return resourceClient{
		list: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			c := started
			if opts.Continue != "" {
				c = continued
			}
			list := newList()
			err := c.Get().Resource(resource).VersionedParams(&opts, params).Timeout(timeoutOf(opts)).Do(ctx).Into(list)
			return list, err
		},
		watch: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			opts.Watch = true
			return started.Get().Resource(resource).VersionedParams(&opts, params).Timeout(timeoutOf(opts)).Watch(ctx)
		},
	}
}

// timeoutOf is the request timeout a list or watch asks for: a reflector's watch asks the
// server to end it after a random 5-10 minutes, so that a silently dead one is replaced.
func timeoutOf(opts metav1.ListOptions) time.Duration {
	if opts.TimeoutSeconds == nil {
		return 0
	}
	return time.Duration(*opts.TimeoutSeconds) * time.Second
}
