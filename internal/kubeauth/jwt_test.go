package kubeauth

import (
	"encoding/base64"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"k8s.io/client-go/rest"
)

// fakeJWT is a compact JWS with claims as its payload and no valid signature: enough for what
// is read of it unverified.
func fakeJWT(claims string) string {
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(`{"alg":"RS256","kid":"test"}`)) + "." + enc([]byte(claims)) + "." + enc([]byte("not a signature"))
}

func TestTokenExpiry(t *testing.T) {
	for _, tc := range []struct {
		name, token string
		want        time.Time
		ok          bool
	}{
		{"ServiceAccount token", fakeJWT(`{"aud":["https://kubernetes.default.svc"],"exp":1700000030,"iat":1700000000,"sub":"system:serviceaccount:monitoring:prometheus"}`), time.Unix(1_700_000_030, 0), true},
		{"fractional exp", fakeJWT(`{"exp":1700000030.5}`), time.Unix(1_700_000_030, 500_000_000), true},
		{"padded payload", "e30." + base64.URLEncoding.EncodeToString([]byte(`{"exp":1700000030}`)) + ".sig", time.Unix(1_700_000_030, 0), true},
		{"no exp", fakeJWT(`{"sub":"x"}`), time.Time{}, false},
		{"exp not a number", fakeJWT(`{"exp":"soon"}`), time.Time{}, false},
		{"negative exp", fakeJWT(`{"exp":-5}`), time.Time{}, false},
		{"huge exp", fakeJWT(`{"exp":1e300}`), time.Time{}, false},
		{"opaque token", "abcdef0123456789", time.Time{}, false},
		{"two parts", "a.b", time.Time{}, false},
		{"payload not base64", "a.!!!.c", time.Time{}, false},
		{"payload not JSON", "a." + base64.RawURLEncoding.EncodeToString([]byte("exp=5")) + ".c", time.Time{}, false},
	} {
		got, ok := tokenExpiry(tc.token)
		if ok != tc.ok || !got.Equal(tc.want) {
			t.Errorf("%s: %v %v, want %v %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
}

func TestAPIServerAudiences(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "token")
	if err := os.WriteFile(file, []byte(fakeJWT(`{"aud":["https://kubernetes.default.svc","k3s"],"exp":1}`)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := APIServerAudiences(&rest.Config{BearerTokenFile: file})
	if err != nil || !slices.Equal(got, []string{"https://kubernetes.default.svc", "k3s"}) {
		t.Errorf("from the token file: %v %v", got, err)
	}
	got, err = APIServerAudiences(&rest.Config{BearerToken: fakeJWT(`{"aud":"https://kubernetes.default.svc.cluster.local"}`)})
	if err != nil || !slices.Equal(got, []string{"https://kubernetes.default.svc.cluster.local"}) {
		t.Errorf("a single audience: %v %v", got, err)
	}
	for name, cfg := range map[string]*rest.Config{
		"no token":          {TLSClientConfig: rest.TLSClientConfig{CertFile: "client.crt"}},
		"missing file":      {BearerTokenFile: filepath.Join(dir, "none")},
		"opaque token":      {BearerToken: "static-token"},
		"token without aud": {BearerToken: fakeJWT(`{"exp":1}`)},
		"aud of numbers":    {BearerToken: fakeJWT(`{"aud":[1,2]}`)},
	} {
		if got, err := APIServerAudiences(cfg); err == nil {
			t.Errorf("%s: %v, want an error", name, got)
		}
	}
}

// FuzzReadJWTClaims: whatever a caller sends as its token, reading it neither panics nor
// yields an expiry from something that is not a JWT's exp.
func FuzzReadJWTClaims(f *testing.F) {
	f.Add(fakeJWT(`{"aud":["a"],"exp":1700000030}`))
	f.Add(fakeJWT(`{"aud":"a","exp":1.5e9}`))
	f.Add("a.b.c")
	f.Add("..")
	f.Add("opaque")
	f.Fuzz(func(t *testing.T, token string) {
		c, err := readJWTClaims(token)
		if err != nil && (c.Exp != 0 || c.Aud != nil) {
			t.Fatalf("error %v with claims %+v", err, c)
		}
		if exp, ok := tokenExpiry(token); ok && (err != nil || exp.IsZero()) {
			t.Fatalf("expiry %v from %q", exp, token)
		}
	})
}
