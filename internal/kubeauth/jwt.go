package kubeauth

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"time"

	"k8s.io/client-go/rest"
)

// jwtClaims are the claims read from a JWT's payload without verifying its signature. They
// are used only to make things stricter (a cached answer ends at exp) or to learn what the API
// server itself issued (the exporter's own token's aud), never to let a caller in: the API
// server's TokenReview decides that.
type jwtClaims struct {
	// Exp is the expiry, seconds since the epoch (RFC 7519 4.1.4), 0 when absent.
	Exp float64 `json:"exp"`
	// Aud is a string or an array of strings (RFC 7519 4.1.3).
	Aud audiences `json:"aud"`
}

type audiences []string

func (a *audiences) UnmarshalJSON(b []byte) error {
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*a = audiences{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return errors.New("aud is neither a string nor an array of strings")
	}
	*a = many
	return nil
}

// maxJWTPayload bounds what is decoded of a token: a ServiceAccount token's payload is under
// 1 KiB, and a request's headers are bounded anyway (the server's MaxHeaderBytes).
const maxJWTPayload = 16 << 10

// readJWTClaims decodes the payload of a compact JWS (header.payload.signature) without
// verifying it. Anything else (an opaque token, a malformed one) is an error.
func readJWTClaims(token string) (jwtClaims, error) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return jwtClaims{}, errors.New("not a JWT: want three dot-separated parts")
	}
	payload := parts[1]
	if len(payload) > base64.RawURLEncoding.EncodedLen(maxJWTPayload) {
		return jwtClaims{}, fmt.Errorf("JWT payload of %d bytes is too large", len(payload))
	}
	b, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(payload, "="))
	if err != nil {
		return jwtClaims{}, fmt.Errorf("JWT payload: %w", err)
	}
	var c jwtClaims
	if err := json.Unmarshal(b, &c); err != nil {
		return jwtClaims{}, fmt.Errorf("JWT claims: %w", err)
	}
	return c, nil
}

// tokenExpiry is the expiry a JWT names, and false for a token that names none (or is no JWT):
// an opaque token's lifetime is the API server's to know.
func tokenExpiry(token string) (time.Time, bool) {
	c, err := readJWTClaims(token)
	if err != nil || c.Exp <= 0 || math.IsInf(c.Exp, 0) || math.IsNaN(c.Exp) || c.Exp > math.MaxInt64/2 {
		return time.Time{}, false
	}
	sec, frac := math.Modf(c.Exp)
	return time.Unix(int64(sec), int64(frac*1e9)), true
}

// APIServerAudiences returns the audiences of the exporter's own bearer token (cfg's token, or
// its token file: in a pod, the projected ServiceAccount token). The kubelet asks for that token
// with no audience, so the API server issues it for its own audiences: the ones a Prometheus's
// ServiceAccount token carries, too.
func APIServerAudiences(cfg *rest.Config) ([]string, error) {
	token := cfg.BearerToken
	if token == "" && cfg.BearerTokenFile != "" {
		b, err := os.ReadFile(cfg.BearerTokenFile)
		if err != nil {
			return nil, fmt.Errorf("reading the exporter's own token: %w", err)
		}
		token = strings.TrimSpace(string(b))
	}
	if token == "" {
		return nil, errors.New("the exporter's credentials for the API server hold no bearer token to read them from")
	}
	c, err := readJWTClaims(token)
	if err != nil {
		return nil, fmt.Errorf("the exporter's own token: %w", err)
	}
	if len(c.Aud) == 0 {
		return nil, errors.New("the exporter's own token names no audience")
	}
	return c.Aud, nil
}
