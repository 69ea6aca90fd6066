package nftnl

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/proxyhealth/proxyhealth/internal/ruleset"
)

// errnoQuerier answers every request as the kernel does when it refuses it outright: with a
// netlink error carrying errno, through errnoError as the socket's splitMessages does.
type errnoQuerier struct {
	errno unix.Errno
	calls int
}

func (q *errnoQuerier) query(context.Context, request, func(message) error) error {
	q.calls++
	return errnoError(q.errno)
}

// readWithin runs a ForwardReader's read on q, failing the test if it does not return within
// a few seconds (a retry loop that never ends).
func readWithin(t *testing.T, r *ForwardReader, q querier, changes []Change) ([]*ruleset.Graph, error) {
	t.Helper()
	type out struct {
		graphs []*ruleset.Graph
		err    error
	}
	done := make(chan out, 1)
	go func() {
		defer func() {
			if p := recover(); p != nil {
				t.Errorf("read panicked: %v", p)
				done <- out{}
			}
		}()
		g, err := r.read(context.Background(), q, changes)
		done <- out{g, err}
	}()
	select {
	case o := <-done:
		return o.graphs, o.err
	case <-time.After(5 * time.Second):
		t.Fatal("read did not return within 5s")
		return nil, nil
	}
}

// A kernel without nf_tables: nfnetlink finds no subsystem for the request's type and
// answers every nf_tables request with EINVAL (nfnetlink_rcv_msg, after its request_module of
// "nfnetlink-subsys-10" failed). EPROTONOSUPPORT is not a reply to a request: it is socket(2)'s
// answer where nfnetlink itself is absent (see TestDialWithoutNFNetlink). The read fails at
// once, saying nf_tables is missing, in an error callers can tell apart.
func TestForwardReaderWithoutNFTables(t *testing.T) {
	q := &errnoQuerier{errno: unix.EINVAL}
	var r ForwardReader
	graphs, err := readWithin(t, &r, q, nil)
	if err == nil {
		t.Fatalf("read succeeded with %d graphs on a kernel without nf_tables", len(graphs))
	}
	if !errors.Is(err, ErrNotSupported) {
		t.Errorf("error %q does not match ErrNotSupported", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "read forward path rules") || !strings.Contains(msg, "no nf_tables") {
		t.Errorf("error %q: want it to say what was read and that the kernel has no nf_tables", msg)
	}
	if graphs != nil {
		t.Errorf("graphs %v with the error", graphs)
	}
	// Nothing to retry: the first request's answer ends the read.
	if q.calls != 1 {
		t.Errorf("%d requests, want 1", q.calls)
	}
	// A later read (the watch's changes, which such a kernel would not send, or a poll) tries
	// again from the start and fails the same way.
	if _, err := readWithin(t, &r, q, []Change{{Resync: true}}); !errors.Is(err, ErrNotSupported) {
		t.Errorf("second read: %v, want ErrNotSupported", err)
	}

	// The Follower, which reads kube-proxy's tables on the same kind of socket, says the same.
	f := newFollower(&errnoQuerier{errno: unix.EINVAL}, nil)
	if err := f.Resync(context.Background()); !errors.Is(err, ErrNotSupported) {
		t.Errorf("Follower.Resync: %v, want ErrNotSupported", err)
	}
	if _, err := f.Generation(context.Background()); !errors.Is(err, ErrNotSupported) {
		t.Errorf("Follower.Generation: %v, want ErrNotSupported", err)
	}
}

// Refusals that are not a missing nf_tables keep their own meaning: a missing privilege is
// ErrPermission, and an unrelated EINVAL (a malformed dump request, once the generation was
// answered) is not taken for a missing nf_tables.
func TestForwardReaderOtherRefusals(t *testing.T) {
	q := &errnoQuerier{errno: unix.EPERM}
	var r ForwardReader
	_, err := readWithin(t, &r, q, nil)
	if !errors.Is(err, ErrPermission) || errors.Is(err, ErrNotSupported) {
		t.Errorf("EPERM: %v, want ErrPermission only", err)
	}

	rec := loadReplay(t, "testdata/graph-nft-vmap.replay.json")
	bad := &refuseDumps{q: rec, errno: unix.EINVAL}
	_, err = readWithin(t, &ForwardReader{}, bad, nil)
	if err == nil || errors.Is(err, ErrNotSupported) || !errors.Is(err, unix.EINVAL) {
		t.Errorf("EINVAL to a dump: %v, want the plain EINVAL", err)
	}
}

// refuseDumps answers dumps with errno and everything else from q.
type refuseDumps struct {
	q     querier
	errno unix.Errno
}

func (r *refuseDumps) query(ctx context.Context, req request, fn func(message) error) error {
	if req.dump {
		return errnoError(r.errno)
	}
	return r.q.query(ctx, req, fn)
}

// Without nfnetlink (CONFIG_NETFILTER_NETLINK off, or its module missing) socket(2) refuses
// NETLINK_NETFILTER with EPROTONOSUPPORT: that too is a kernel without nf_tables. Other
// failures to open the socket are not.
func TestDialWithoutNFNetlink(t *testing.T) {
	for errno, want := range map[unix.Errno]bool{
		unix.EPROTONOSUPPORT: true,
		unix.EMFILE:          false,
		unix.EPERM:           false,
	} {
		err := socketError(errno)
		if got := errors.Is(err, ErrNotSupported); got != want {
			t.Errorf("socket(2) failing with %v: ErrNotSupported %v, want %v (%v)", errno, got, want, err)
		}
		if !errors.Is(err, errno) {
			t.Errorf("socket(2) failing with %v: %v lost the errno", errno, err)
		}
	}
}
