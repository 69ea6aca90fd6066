package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
)

// viewerTokenSeconds is the lifetime of the viewer tokens the plugin asks for: the shortest the
// TokenRequest API issues. A token lives beyond the run, but only for this long, and only for
// the exporters' audience.
const viewerTokenSeconds = 600

// viewerTokens gets, once per namespace, a short-lived token of the viewer ServiceAccount in the
// exporters' namespace (TokenRequest: create on serviceaccounts/token). Whether the plugin's
// user may create it is the cluster's RBAC; what the token may read, the viewer's.
type viewerTokens struct {
	core     corev1client.CoreV1Interface
	name     string // the ServiceAccount; "" asks for none
	audience string
	// timeout bounds the TokenRequest: the client has none of its own (kubectl's
	// --request-timeout is 0 unless set), and every read of the namespace waits for it.
	timeout time.Duration

	mu   sync.Mutex
	byNS map[string]*viewerToken
}

type viewerToken struct {
	once  sync.Once
	token string
	err   error
	done  bool // token and err are set; under viewerTokens.mu, for cached
}

func newViewerTokens(core corev1client.CoreV1Interface, name, audience string, timeout time.Duration) *viewerTokens {
	return &viewerTokens{core: core, name: name, audience: audience, timeout: timeout, byNS: map[string]*viewerToken{}}
}

// cached is namespace's token, or why there is none, once it has been asked for and answered;
// ok is false before. It does not wait for a TokenRequest under way.
func (v *viewerTokens) cached(namespace string) (token string, ok bool, err error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	t := v.byNS[namespace]
	if t == nil || !t.done {
		return "", false, nil
	}
	return t.token, true, t.err
}

// get returns namespace's viewer token, asking for it the first time; "" and no error when
// the plugin is to send none.
func (v *viewerTokens) get(ctx context.Context, namespace string) (string, error) {
	if v.name == "" {
		return "", nil
	}
	v.mu.Lock()
	t, ok := v.byNS[namespace]
	if !ok {
		t = &viewerToken{}
		v.byNS[namespace] = t
	}
	v.mu.Unlock()
	t.once.Do(func() {
		req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptrTo(int64(viewerTokenSeconds))}}
		if v.audience != "" {
			req.Spec.Audiences = []string{v.audience}
		}
		// Not the caller's ctx: the first node's read may end early, the others still need it.
		// Its own limit, so that none of them waits for ever.
		tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), v.timeout)
		defer cancel()
		resp, err := v.core.ServiceAccounts(namespace).CreateToken(tctx, v.name, req, metav1.CreateOptions{})
		v.mu.Lock()
		defer v.mu.Unlock()
		t.done = true
		if err != nil {
			if tctx.Err() != nil {
				// Said short: the node's row has room for little beyond the request's URL.
				err = fmt.Errorf("the API server did not answer the TokenRequest within %v (--timeout)", v.timeout)
			}
			t.err = fmt.Errorf("no token of ServiceAccount %s/%s to send (--viewer-serviceaccount): %w", namespace, v.name, err)
			return
		}
		t.token = resp.Status.Token
	})
	return t.token, t.err
}

func ptrTo[T any](v T) *T { return &v }
