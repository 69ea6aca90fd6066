package main

import (
	"fmt"
	"io"
	"net/http"
)

// defaultMaxStatusBytes bounds one node's report: the exporters write at most
// nodereport.MaxBytes (32 KiB); one much larger is not an exporter's, and reading thousands of
// them whole could exhaust the engineer's machine. Each list response is bounded by a page of
// reports at twice this (JSON escaping) and their objects' metadata.
const defaultMaxStatusBytes = 64 << 10

// answerTooLargeError is a response body cut at its limit.
type answerTooLargeError struct{ limit int64 }

func (e *answerTooLargeError) Error() string {
	return fmt.Sprintf("the API server's answer is larger than %d bytes (a page of reports at --max-status-bytes); not read further", e.limit)
}

// boundBodies wraps a transport so that reading a response body fails with
// *answerTooLargeError past limit bytes.
func boundBodies(limit int64) func(http.RoundTripper) http.RoundTripper {
	return func(next http.RoundTripper) http.RoundTripper {
		return roundTripperFunc(func(req *http.Request) (*http.Response, error) {
			resp, err := next.RoundTrip(req)
			if err != nil || resp.Body == nil {
				return resp, err
			}
			resp.Body = &boundedBody{rc: resp.Body, left: limit, limit: limit}
			return resp, nil
		})
	}
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// boundedBody reads at most limit bytes of rc, then fails if there is more.
type boundedBody struct {
	rc          io.ReadCloser
	left, limit int64
}

func (b *boundedBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		// One byte more tells a body of exactly limit bytes from a longer one.
		var one [1]byte
		n, err := b.rc.Read(one[:])
		if n > 0 {
			return 0, &answerTooLargeError{limit: b.limit}
		}
		return 0, err
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.rc.Read(p)
	b.left -= int64(n)
	return n, err
}

func (b *boundedBody) Close() error { return b.rc.Close() }
