package kubeauth

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
)

// apiAudience is the fake API server's own audience: its default for a TokenReview without
// audiences, and that of the tokens added without any.
const apiAudience = "https://kubernetes.default.svc.cluster.local"

// fakeAPIServer answers TokenReviews and SubjectAccessReviews over HTTP as the API server
// does, from a table of tokens (and the audiences each is for) and of the non-resource URLs
// each user may get.
type fakeAPIServer struct {
	srv *httptest.Server

	mu             sync.Mutex
	users          map[string]authenticationv1.UserInfo // by token
	tokenAudiences map[string][]string                  // by token; none is apiAudience
	allowed        map[string][]string                  // user -> "verb path" it may use
	down           bool                                 // answer 500 to everything
	hold           chan struct{}                        // when set, reviews wait for it to close
	holdUnknown    chan struct{}                        // when set, TokenReviews of unknown tokens wait for it to close
	delay          time.Duration                        // each review takes this long
	// ignoreAudiences answers as an authenticator that knows nothing of audiences: no
	// status.audiences, whatever was asked.
	ignoreAudiences bool
	// What was asked.
	tokenReviews, accessReviews int
	lastAccess                  authorizationv1.SubjectAccessReviewSpec
	lastTokenAudiences          []string
}

func newFakeAPIServer(t *testing.T) *fakeAPIServer {
	f := &fakeAPIServer{users: map[string]authenticationv1.UserInfo{}, tokenAudiences: map[string][]string{}, allowed: map[string][]string{}}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

// reviewer is a Reviewer talking to f through the real REST clients, accepting tokens for
// audiences (none: the API server's own).
func (f *fakeAPIServer) reviewer(t *testing.T, audiences ...string) Reviewer {
	t.Helper()
	r, err := NewAPIReviewer(&rest.Config{Host: f.srv.URL, BearerToken: "exporter-token"}, audiences)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// addUser makes token u's, for audiences (none: the API server's).
func (f *fakeAPIServer) addUser(token string, u authenticationv1.UserInfo, audiences ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.users[token] = u
	f.tokenAudiences[token] = audiences
}

func (f *fakeAPIServer) removeUser(token string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.users, token)
}

func (f *fakeAPIServer) allow(user, verb, path string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.allowed[user] = append(f.allowed[user], verb+" "+path)
}

func (f *fakeAPIServer) setDown(down bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.down = down
}

func (f *fakeAPIServer) counts() (tokenReviews, accessReviews int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.tokenReviews, f.accessReviews
}

func (f *fakeAPIServer) serve(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	hold, holdUnknown, down, delay := f.hold, f.holdUnknown, f.down, f.delay
	f.mu.Unlock()
	if hold != nil {
		<-hold
	}
	time.Sleep(delay)
	if r.Header.Get("Authorization") != "Bearer exporter-token" {
		http.Error(w, "the exporter's own credentials are missing", http.StatusUnauthorized)
		return
	}
	if down {
		http.Error(w, "etcdserver: request timed out", http.StatusInternalServerError)
		return
	}
	if r.Method != http.MethodPost {
		http.Error(w, "method", http.StatusMethodNotAllowed)
		return
	}
	switch r.URL.Path {
	case "/apis/authentication.k8s.io/v1/tokenreviews":
		var review authenticationv1.TokenReview
		if err := json.NewDecoder(r.Body).Decode(&review); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		f.mu.Lock()
		_, known := f.users[review.Spec.Token]
		f.mu.Unlock()
		if holdUnknown != nil && !known {
			<-holdUnknown
		}
		f.mu.Lock()
		f.tokenReviews++
		f.lastTokenAudiences = review.Spec.Audiences
		u, ok := f.users[review.Spec.Token]
		tokenAuds, ignore := f.tokenAudiences[review.Spec.Token], f.ignoreAudiences
		f.mu.Unlock()
		// As the API server: the audiences asked for, or its own; the token must be for one.
		wanted := review.Spec.Audiences
		if len(wanted) == 0 {
			wanted = []string{apiAudience}
		}
		if len(tokenAuds) == 0 {
			tokenAuds = []string{apiAudience}
		}
		var both []string
		for _, a := range wanted {
			if slices.Contains(tokenAuds, a) {
				both = append(both, a)
			}
		}
		switch {
		case ignore && ok:
			review.Status = authenticationv1.TokenReviewStatus{Authenticated: true, User: u}
		case ok && len(both) > 0:
			review.Status = authenticationv1.TokenReviewStatus{Authenticated: true, User: u, Audiences: both}
		case ok:
			review.Status.Error = "token audiences are invalid for the target audiences"
		default:
			review.Status.Error = "invalid bearer token"
		}
		writeObject(w, &review.TypeMeta, &review)
	case "/apis/authorization.k8s.io/v1/subjectaccessreviews":
		var review authorizationv1.SubjectAccessReview
		if err := json.NewDecoder(r.Body).Decode(&review); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		f.mu.Lock()
		f.accessReviews++
		f.lastAccess = review.Spec
		attrs := review.Spec.NonResourceAttributes
		allowed := attrs != nil && review.Spec.ResourceAttributes == nil &&
			slices.Contains(f.allowed[review.Spec.User], attrs.Verb+" "+attrs.Path)
		f.mu.Unlock()
		review.Status = authorizationv1.SubjectAccessReviewStatus{Allowed: allowed}
		if allowed {
			review.Status.Reason = "allowed by the test"
		}
		writeObject(w, &review.TypeMeta, &review)
	default:
		http.NotFound(w, r)
	}
}

func writeObject(w http.ResponseWriter, tm *metav1.TypeMeta, obj any) {
	// The API server answers with the object's kind and version set.
	switch {
	case strings.Contains(tm.Kind, "Token"):
		tm.APIVersion = authenticationv1.SchemeGroupVersion.String()
	default:
		tm.APIVersion = authorizationv1.SchemeGroupVersion.String()
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(obj)
}
