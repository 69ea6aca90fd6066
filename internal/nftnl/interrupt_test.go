package nftnl

import (
	"context"
	"encoding/binary"
	"errors"
	"reflect"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/proxyhealth/proxyhealth/internal/ruleset"
)

// interruptingQuerier answers from a recording, but cuts short the dumps interrupt picks as
// the socket cuts a dump the kernel flagged NLM_F_DUMP_INTR because a commit came during it:
// the reply's first message is handed on, the second carries the flag, and the query ends
// with errInterrupted.
type interruptingQuerier struct {
	q         querier
	interrupt func(iq *interruptingQuerier) bool
	// dump is the index of the dump being asked among all so far, inAttempt among those since
	// the last generation request (a read attempt starts with one); interrupted counts the
	// dumps cut before it.
	dump, inAttempt, interrupted int
	dumps                        int // dumps asked
}

func (iq *interruptingQuerier) query(ctx context.Context, req request, fn func(message) error) error {
	if req.typ == unix.NFT_MSG_GETGEN {
		iq.inAttempt = 0
	}
	if !req.dump {
		return iq.q.query(ctx, req, fn)
	}
	iq.dump = iq.dumps
	iq.dumps++
	defer func() { iq.inAttempt++ }()
	if iq.interrupt == nil || !iq.interrupt(iq) {
		return iq.q.query(ctx, req, fn)
	}
	iq.interrupted++
	flagged := errors.New("the flagged message")
	sent := 0
	err := iq.q.query(ctx, req, func(m message) error {
		if sent == 1 {
			return flagged
		}
		sent++
		return fn(m)
	})
	if err != nil && !errors.Is(err, flagged) {
		return err
	}
	return errInterrupted
}

// countDumps is how many dumps one uninterrupted read of the recording asks for.
func countDumps(t *testing.T, path string) int {
	t.Helper()
	iq := &interruptingQuerier{q: loadReplay(t, path)}
	if _, err := readWithin(t, &ForwardReader{}, iq, nil); err != nil {
		t.Fatal(err)
	}
	return iq.dumps
}

// uninterrupted is what a ForwardReader's first read returns from a recording.
func uninterrupted(t *testing.T, path string) []*ruleset.Graph {
	t.Helper()
	var r ForwardReader
	graphs, err := readWithin(t, &r, loadReplay(t, path), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(graphs) == 0 {
		t.Fatalf("%s: no forward graph to compare", path)
	}
	return graphs
}

// Recordings of forward paths with several chains to read: jumps, a verdict map's elements,
// iptables-nft's filter table behind kube-proxy's chains, and two native tables.
var interruptedRecordings = []string{
	"testdata/graph-nft-kube-proxy-v1.36.3.replay.json",
	"testdata/graph-iptables-kube-proxy.replay.json",
	"testdata/graph-nft-mixed.replay.json",
	"testdata/graph-nft-jump.replay.json",
}

// A read whose dumps a commit interrupted (up to maxAttempts-1 times, anywhere in the read)
// starts again and returns the same graphs as a read nothing interrupted: nothing of the cut
// replies is kept.
func TestForwardReaderRetriesInterruptedDumps(t *testing.T) {
	for _, path := range interruptedRecordings {
		want := uninterrupted(t, path)
		perRead := countDumps(t, path)
		for _, tc := range []struct {
			name      string
			interrupt func(iq *interruptingQuerier) bool
			times     int
		}{
			{"the chain listing", func(iq *interruptingQuerier) bool { return iq.dump == 0 }, 1},
			{"the last dump of the first attempt", func(iq *interruptingQuerier) bool { return iq.dump == perRead-1 }, 1},
			{"the first dumps, one short of the bound", func(iq *interruptingQuerier) bool { return iq.dump < maxAttempts-1 }, maxAttempts - 1},
			{"the last dump of every attempt but the last", func(iq *interruptingQuerier) bool {
				return iq.inAttempt == perRead-1 && iq.interrupted < maxAttempts-1
			}, maxAttempts - 1},
		} {
			t.Run(strings.TrimSuffix(strings.TrimPrefix(path, "testdata/graph-"), ".replay.json")+"/"+tc.name, func(t *testing.T) {
				iq := &interruptingQuerier{q: loadReplay(t, path), interrupt: tc.interrupt}
				var r ForwardReader
				got, err := readWithin(t, &r, iq, nil)
				if err != nil {
					t.Fatalf("after %d interruptions: %v", iq.interrupted, err)
				}
				if iq.interrupted != tc.times {
					t.Errorf("%d dumps interrupted, want %d", iq.interrupted, tc.times)
				}
				if !reflect.DeepEqual(got, want) {
					t.Errorf("graphs after interruptions differ from an uninterrupted read:\n got %s\nwant %s", describeGraphs(got), describeGraphs(want))
				}
			})
		}
	}
}

// A table read again for a change (not the whole listing) retries its interrupted dumps too,
// and comes back the same.
func TestForwardReaderRetriesInterruptedTableRead(t *testing.T) {
	const path = "testdata/graph-nft-mixed.replay.json"
	want := uninterrupted(t, path)
	iq := &interruptingQuerier{q: loadReplay(t, path)}
	var r ForwardReader
	if _, err := readWithin(t, &r, iq, nil); err != nil {
		t.Fatal(err)
	}
	for _, tb := range r.tables {
		table := Table{Family: tb.family, Name: tb.name}
		t.Run(table.String(), func(t *testing.T) {
			iq.dumps, iq.interrupted = 0, 0
			iq.interrupt = func(iq *interruptingQuerier) bool { return iq.dump < maxAttempts-1 }
			change := []Change{{Tables: []Table{table}, Details: []TableChange{{Table: table, Chains: []string{tb.base[0].name}}}}}
			got, err := readWithin(t, &r, iq, change)
			if err != nil {
				t.Fatal(err)
			}
			if iq.interrupted != maxAttempts-1 {
				t.Errorf("%d dumps interrupted, want %d", iq.interrupted, maxAttempts-1)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("graphs after an interrupted table read:\n got %s\nwant %s", describeGraphs(got), describeGraphs(want))
			}
		})
	}
}

// generationMoving answers from q, but every generation asked is one more than the last: a
// commit between each request of a read.
type generationMoving struct {
	q   querier
	gen uint32
}

func (g *generationMoving) query(ctx context.Context, req request, fn func(message) error) error {
	if req.typ != unix.NFT_MSG_GETGEN {
		return g.q.query(ctx, req, fn)
	}
	g.gen++
	return fn(message{typ: unix.NFT_MSG_NEWGEN, attrs: appendAttr(nil, unix.NFTA_GEN_ID, binary.BigEndian.AppendUint32(nil, g.gen))})
}

// Under commits that never stop, a read gives up after maxAttempts with the reason, rather
// than loop; the reader is left to start over, and reads again once the commits stop.
func TestForwardReaderGivesUpUnderEndlessCommits(t *testing.T) {
	const path = "testdata/graph-nft-mixed.replay.json"
	want := uninterrupted(t, path)
	always := func(*interruptingQuerier) bool { return true }
	for _, tc := range []struct {
		name            string
		q               func() querier
		reason          string
		wantInterrupted bool
	}{
		{"every dump interrupted", func() querier { return &interruptingQuerier{q: loadReplay(t, path), interrupt: always} },
			errInterrupted.Error(), true},
		{"the generation moves during every read", func() querier { return &generationMoving{q: loadReplay(t, path)} },
			"ruleset generation moved", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r ForwardReader
			counted := &interruptingQuerier{q: tc.q()}
			graphs, err := readWithin(t, &r, counted, nil)
			if err == nil {
				t.Fatalf("read succeeded (%d graphs) though no attempt was consistent", len(graphs))
			}
			if msg := err.Error(); !strings.Contains(msg, "no consistent read in 5 attempts") || !strings.Contains(msg, tc.reason) {
				t.Errorf("error %q: want the bound and %q", msg, tc.reason)
			}
			if errors.Is(err, errInterrupted) != tc.wantInterrupted {
				t.Errorf("error %v: errors.Is(errInterrupted) = %v, want %v", err, !tc.wantInterrupted, tc.wantInterrupted)
			}
			// Each attempt starts with the chain listing: cut, it ends the attempt.
			if tc.wantInterrupted && counted.dumps != maxAttempts {
				t.Errorf("%d dumps, want %d: one per attempt", counted.dumps, maxAttempts)
			}
			// The commits stop: the next read, whatever its changes name, reads everything.
			unrelated := Table{Family: unix.NFPROTO_IPV4, Name: "unrelated"}
			got, err := readWithin(t, &r, loadReplay(t, path), []Change{{Tables: []Table{unrelated}}})
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("graphs after the commits stopped:\n got %s\nwant %s", describeGraphs(got), describeGraphs(want))
			}
		})
	}

	// A table read again for a change gives up the same way.
	var r ForwardReader
	if _, err := readWithin(t, &r, loadReplay(t, path), nil); err != nil {
		t.Fatal(err)
	}
	tb := r.tables[0]
	table := Table{Family: tb.family, Name: tb.name}
	iq := &interruptingQuerier{q: loadReplay(t, path), interrupt: always}
	if _, err := readWithin(t, &r, iq, []Change{{Tables: []Table{table}}}); !errors.Is(err, errInterrupted) || !strings.Contains(err.Error(), table.String()) {
		t.Errorf("table read under endless commits: %v, want the interruption, naming %s", err, table)
	}
	if iq.dumps != maxAttempts {
		t.Errorf("table read under endless commits: %d dumps, want %d", iq.dumps, maxAttempts)
	}
}

func describeGraphs(gs []*ruleset.Graph) string {
	var b strings.Builder
	for _, g := range gs {
		b.WriteString("[" + g.Name + " entries " + strings.Join(g.Entries, ",") + ":")
		for name, c := range g.Chains {
			b.WriteString(" " + name + "(")
			for _, r := range c.Rules {
				b.WriteString(r.Desc + ";")
			}
			b.WriteString(")")
		}
		b.WriteString("]")
	}
	return b.String()
}
