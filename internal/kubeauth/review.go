package kubeauth

import (
	"context"
	"fmt"
	"slices"
	"strings"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"
)

// Reviewer asks the API server who a token belongs to, and whether that user may do
// something. The API server's TokenReview and SubjectAccessReview are the only
// implementation outside tests.
type Reviewer interface {
	// ReviewToken returns the token's user, or authenticated false for a token the API
	// server does not accept. err is for a review that got no answer.
	ReviewToken(ctx context.Context, token string) (user authenticationv1.UserInfo, authenticated bool, err error)
	// ReviewAccess says whether user may use verb on the non-resource URL path, and the
	// authorizer's reason when it may not.
	ReviewAccess(ctx context.Context, user authenticationv1.UserInfo, verb, path string) (allowed bool, reason string, err error)
}

// The reviews' REST clients, decoding with a scheme that holds only the two review types.
// The generated typed clients (k8s.io/client-go/kubernetes/typed/authentication/v1 and
// authorization/v1) link client-go's whole kubernetes/scheme, every API group: measured,
// they made the stripped exporter 15 MB larger (24.0 to 39.0 MB); these clients, 0.4 MB.
// internal/cluster builds its watches the same way for the same reason.

// apiReviewer reviews with the API server.
type apiReviewer struct {
	tokens, access *rest.RESTClient
	audiences      []string
}

// NewAPIReviewer returns a Reviewer that sends TokenReviews and SubjectAccessReviews to the API
// server cfg points at, with cfg's credentials (the exporter's ServiceAccount, which needs
// create on both: the ClusterRole system:auth-delegator grants it). A token is accepted when
// it is for one of audiences; none is the API server's own.
func NewAPIReviewer(cfg *rest.Config, audiences []string) (Reviewer, error) {
	scheme := runtime.NewScheme()
	if err := authenticationv1.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("registering authentication/v1: %w", err)
	}
	if err := authorizationv1.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("registering authorization/v1: %w", err)
	}
	codecs := serializer.NewCodecFactory(scheme)
	base := rest.CopyConfig(cfg)
	// Reviews are small; JSON is what every API server and proxy in between speaks.
	base.ContentType, base.AcceptContentTypes = runtime.ContentTypeJSON, runtime.ContentTypeJSON
	// No client-side rate limiter: Auth's queue bounds the reviews, known callers first, and
	// tells its throttling apart from the API server's failures.
	base.QPS, base.Burst, base.RateLimiter = -1, 0, nil
	if base.UserAgent == "" {
		base.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	httpClient, err := rest.HTTPClientFor(base)
	if err != nil {
		return nil, fmt.Errorf("building the HTTP client for %s: %w", cfg.Host, err)
	}
	clientFor := func(gv schema.GroupVersion) (*rest.RESTClient, error) {
		c := rest.CopyConfig(base)
		c.GroupVersion = &gv
		c.APIPath = "/apis"
		c.NegotiatedSerializer = codecs.WithoutConversion()
		rc, err := rest.RESTClientForConfigAndClient(c, httpClient)
		if err != nil {
			return nil, fmt.Errorf("building the %s client for %s: %w", gv, cfg.Host, err)
		}
		return rc, nil
	}
	tokens, err := clientFor(authenticationv1.SchemeGroupVersion)
	if err != nil {
		return nil, err
	}
	access, err := clientFor(authorizationv1.SchemeGroupVersion)
	if err != nil {
		return nil, err
	}
	return &apiReviewer{tokens: tokens, access: access, audiences: slices.Clone(audiences)}, nil
}

func (r *apiReviewer) ReviewToken(ctx context.Context, token string) (authenticationv1.UserInfo, bool, error) {
	// No audiences is the API server's own, which a ServiceAccount token from the TokenRequest
	// API or a projected volume carries unless asked otherwise.
	review := &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: token, Audiences: r.audiences}}
	out := &authenticationv1.TokenReview{}
	err := r.tokens.Post().Resource("tokenreviews").
		Body(review).Do(ctx).Into(out)
	if err != nil {
		return authenticationv1.UserInfo{}, false, fmt.Errorf("TokenReview: %w", err)
	}
	// Not authenticated is an answer (Status.Error says why: an expired or unknown token),
	// not a failure to review.
	if !out.Status.Authenticated {
		return authenticationv1.UserInfo{}, false, nil
	}
	// An authenticator that ignores audiences answers with none: the token may be for anyone,
	// so it is not accepted (the TokenReview API's advice to clients that set audiences).
	if len(r.audiences) > 0 && !slices.ContainsFunc(out.Status.Audiences, func(a string) bool { return slices.Contains(r.audiences, a) }) {
		return authenticationv1.UserInfo{}, false, nil
	}
	return out.Status.User, true, nil
}

func (r *apiReviewer) ReviewAccess(ctx context.Context, user authenticationv1.UserInfo, verb, path string) (bool, string, error) {
	review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User:   user.Username,
		UID:    user.UID,
		Groups: user.Groups,
		NonResourceAttributes: &authorizationv1.NonResourceAttributes{
			Path: path,
			Verb: verb,
		},
	}}
	if len(user.Extra) > 0 {
		review.Spec.Extra = make(map[string]authorizationv1.ExtraValue, len(user.Extra))
		for k, v := range user.Extra {
			review.Spec.Extra[k] = authorizationv1.ExtraValue(v)
		}
	}
	out := &authorizationv1.SubjectAccessReview{}
	err := r.access.Post().Resource("subjectaccessreviews").
		Body(review).Do(ctx).Into(out)
	if err != nil {
		return false, "", fmt.Errorf("SubjectAccessReview: %w", err)
	}
	// Anything but allowed is a denial, as in the API server's own webhook authorizer: an
	// EvaluationError (RBAC reports a binding to a missing role this way) comes with a
	// decision already made, usually no opinion.
	reason := out.Status.Reason
	if e := out.Status.EvaluationError; e != "" && !out.Status.Allowed {
		reason = strings.TrimPrefix(reason+"; "+e, "; ")
	}
	return out.Status.Allowed, reason, nil
}
