package nftnl

import (
	"context"
	"fmt"

	"golang.org/x/sys/unix"
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
