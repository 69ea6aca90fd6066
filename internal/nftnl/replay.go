package nftnl

import (
	"context"
	"encoding/json"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/proxyhealth/proxyhealth/internal/ruleset"
)

// A recording is the kernel's replies to this package's requests, by request: the kernel
// tests write them (testdata/*.replay.json) with -update, and a replayer answers the same
// requests from them, so real kernel messages are decoded without root.

type recordedMsg struct {
	Type   uint16 `json:"type"`
	Family uint8  `json:"family"`
	Attrs  []byte `json:"attrs"`
}

type recordedReply struct {
	Msgs  []recordedMsg `json:"msgs"`
	Errno int           `json:"errno,omitempty"`
}

type recording map[string]recordedReply

func requestKey(req request) string {
	return fmt.Sprintf("%d/%d/%v/%x", req.typ, req.family, req.dump, req.attrs)
}

// replayer answers requests from a recording.
type replayer struct{ rec recording }

func (r *replayer) query(_ context.Context, req request, fn func(m message) error) error {
	reply, ok := r.rec[requestKey(req)]
	if !ok {
		return fmt.Errorf("replay: no recorded reply to %s", requestKey(req))
	}
	for _, m := range reply.Msgs {
		if err := fn(message{m.Type, m.Family, m.Attrs}); err != nil {
			return err
		}
	}
	if reply.Errno != 0 {
		return errnoError(unix.Errno(reply.Errno))
	}
	return nil
}

// Replay reads kube-proxy's tables and the forward path as this package reads them from the
// kernel, from a recording of the kernel's replies instead (the JSON of testdata/*.replay.json).
// It is for the tests of the packages that read through this one, so that they decode real
// kernel messages with the decoders the exporter runs, without root; the exporter never uses it
// (nor links it). It lives here, not in a test-support package, because it drives the Follower
// and ForwardReader through their unexported readers, which take the unexported querier.
type Replay struct{ r replayer }

// NewReplay parses a recording, for tests and replays (see Replay).
func NewReplay(recorded []byte) (*Replay, error) {
	var rec recording
	if err := json.Unmarshal(recorded, &rec); err != nil {
		return nil, fmt.Errorf("parse the recording: %w", err)
	}
	return &Replay{replayer{rec}}, nil
}

// ProxyTable reads t whole, as a Follower's Resync does: kube-proxy's rules in iptables-nft's
// nat table or in its nftables table (the tables Followed reports). It is nil when the
// recording says the table or, for nat, its KUBE-SERVICES chain does not exist.
func (r *Replay) ProxyTable(ctx context.Context, t Table) (*ruleset.ProxyTable, error) {
	f := newFollower(&r.r, nil)
	for _, ft := range f.tables {
		if ft.table == t {
			if err := f.full(ctx, ft); err != nil {
				return nil, err
			}
			return ft.snap, nil
		}
	}
	return nil, fmt.Errorf("%s is not a table a Follower follows", t)
}

// Forward reads the forward path's graphs, as a ForwardReader's first Read does.
func (r *Replay) Forward(ctx context.Context) ([]*ruleset.Graph, error) {
	var fr ForwardReader
	return fr.read(ctx, &r.r, nil)
}
