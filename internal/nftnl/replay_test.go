package nftnl

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// The kernel tests record every request and reply of their reads into testdata/*.replay.json
// when run with -update; the plain tests replay them, so the decoding of real kernel messages
// is tested without root.
var update = flag.Bool("update", false, "rewrite testdata/*.replay.json from the kernel tests")

// recorder passes requests to the kernel and keeps the replies.
type recorder struct {
	q   querier
	rec recording
}

func (r *recorder) query(ctx context.Context, req request, fn func(m message) error) error {
	var reply recordedReply
	err := r.q.query(ctx, req, func(m message) error {
		reply.Msgs = append(reply.Msgs, recordedMsg{m.typ, m.family, bytes.Clone(m.attrs)})
		return fn(m)
	})
	var errno unix.Errno
	if errors.As(err, &errno) {
		reply.Errno = int(errno)
	}
	r.rec[requestKey(req)] = reply
	return err
}

func (r *recorder) save(t *testing.T, path string) {
	t.Helper()
	b, err := json.MarshalIndent(r.rec, "", " ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func loadReplay(t testing.TB, path string) *replayer {
	t.Helper()
	r, err := NewReplay(readFile(t, path))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return &r.r
}

// kernelQuerier returns a socket querier that records into rec when -update is set.
func kernelQuerier(t *testing.T) (querier, func(path string)) {
	t.Helper()
	s, err := dial(Limits{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if !*update {
		return s, func(string) {}
	}
	r := &recorder{q: s, rec: recording{}}
	return r, func(path string) { r.save(t, path) }
}
