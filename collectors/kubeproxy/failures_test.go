package kubeproxy

import (
	"testing"
	"time"
)

// failurePoll is one poll of kube-proxy: its failure counter and newest applied sync, in
// seconds after t0 (-1: none).
type failurePoll struct {
	failures float64
	applied  int
	up       bool
}

func TestFailureWatch(t *testing.T) {
	t0 := time.Date(2026, 11, 28, 9, 0, 0, 0, time.UTC)
	started := t0.Add(-time.Minute)
	at := func(s int) time.Time {
		if s < 0 {
			return time.Time{}
		}
		return t0.Add(time.Duration(s) * time.Second)
	}
	type want struct {
		ok           bool
		failures     uint64
		since        time.Time
		neverApplied bool
	}
	for _, c := range []struct {
		name  string
		polls []failurePoll
		want  want
	}{
		{"healthy", []failurePoll{{0, 1, true}, {0, 1, true}, {0, 40, true}}, want{}},
		{"a new node: failing from the start", []failurePoll{{3, -1, true}, {4, -1, true}},
			want{true, 4, started, true}},
		{"a new node seen before its first sync", []failurePoll{{0, -1, true}, {1, -1, true}},
			want{true, 1, started, true}},
		{"mid-life: failing after a sync applied", []failurePoll{{0, 1, true}, {1, 1, true}, {3, 1, true}},
			want{true, 3, at(5), false}},
		{"mended by the retry", []failurePoll{{0, 1, true}, {1, 1, true}, {1, 12, true}}, want{}},
		{"mended, then failing again", []failurePoll{{0, 1, true}, {1, 1, true}, {1, 12, true}, {2, 12, true}},
			want{true, 1, at(15), false}},
		{"failures before the exporter started, mended since: not known failing", []failurePoll{{5, 1, true}, {5, 1, true}}, want{}},
		{"kube-proxy down in between changes nothing", []failurePoll{{0, 1, true}, {1, 1, true}, {0, 0, false}, {2, 1, true}},
			want{true, 2, at(5), false}},
		{"kube-proxy restarted (its counter went back)", []failurePoll{{0, 1, true}, {3, 1, true}, {1, -1, true}},
			want{true, 1, started, true}},
	} {
		var w failureWatch
		for i, p := range c.polls {
			res := &probeResult{at: at(5 * i), up: p.up, restoreFailures: p.failures, newestSync: at(p.applied), started: started}
			if i == len(c.polls)-1 && c.name == "kube-proxy restarted (its counter went back)" {
				res.started = started.Add(time.Hour) // the restarted process
				c.want.since = res.started
			}
			w.observe(res)
		}
		n, since, never, ok := w.failing()
		if got := (want{ok, n, since, never}); got != c.want {
			t.Errorf("%s: got %+v, want %+v", c.name, got, c.want)
		}
	}
}
