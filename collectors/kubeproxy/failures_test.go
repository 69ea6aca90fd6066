package kubeproxy

import (
	"strings"
	"testing"
	"time"
)

// familyPoll is one IP family in one poll of kube-proxy: its failure counter and last applied
// sync, in seconds after t0 (-1: none).
type familyPoll struct {
	name     string
	failures float64
	applied  int
}

// failurePoll is one poll of kube-proxy; down when it did not answer.
type failurePoll struct {
	families []familyPoll
	down     bool
}

// v4 is a single-stack poll.
func v4(failures float64, applied int) failurePoll {
	return failurePoll{families: []familyPoll{{"IPv4", failures, applied}}}
}

// dual is a dual-stack poll.
func dual(v4Failures float64, v4Applied int, v6Failures float64, v6Applied int) failurePoll {
	return failurePoll{families: []familyPoll{{"IPv4", v4Failures, v4Applied}, {"IPv6", v6Failures, v6Applied}}}
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
		families     string // the failing families named, comma-separated
	}
	down := failurePoll{down: true}
	for _, c := range []struct {
		name  string
		polls []failurePoll
		want  want
	}{
		{"healthy", []failurePoll{v4(0, 1), v4(0, 1), v4(0, 40)}, want{}},
		{"a new node: failing from the start", []failurePoll{v4(3, -1), v4(4, -1)},
			want{true, 4, started, true, ""}},
		{"a new node seen before its first sync", []failurePoll{v4(0, -1), v4(1, -1)},
			want{true, 1, started, true, ""}},
		{"mid-life: failing after a sync applied", []failurePoll{v4(0, 1), v4(1, 1), v4(3, 1)},
			want{true, 3, at(5), false, ""}},
		{"mended by the retry", []failurePoll{v4(0, 1), v4(1, 1), v4(1, 12)}, want{}},
		{"mended, then failing again", []failurePoll{v4(0, 1), v4(1, 1), v4(1, 12), v4(2, 12)},
			want{true, 1, at(15), false, ""}},
		{"failures before the exporter started, mended since: not known failing", []failurePoll{v4(5, 1), v4(5, 1)}, want{}},
		{"kube-proxy down in between changes nothing", []failurePoll{v4(0, 1), v4(1, 1), down, v4(2, 1)},
			want{true, 2, at(5), false, ""}},
		{"kube-proxy restarted (its counter went back)", []failurePoll{v4(0, 1), v4(3, 1), v4(1, -1)},
			want{true, 1, started.Add(time.Hour), true, ""}},

		// Dual-stack: one proxier per family, each with its own counter and last sync.
		{"dual-stack mid-life: IPv4 restores fail while IPv6 syncs apply",
			[]failurePoll{dual(0, 1, 0, 1), dual(1, 1, 0, 6), dual(2, 1, 0, 11), dual(3, 1, 0, 16)},
			want{true, 3, at(5), false, "IPv4"}},
		{"dual-stack new node: IPv4 never applied while IPv6 applies",
			[]failurePoll{dual(2, -1, 0, 1), dual(3, -1, 0, 6)},
			want{true, 3, started, true, "IPv4"}},
		{"dual-stack: the IPv4 retry mends its run", []failurePoll{dual(0, 1, 0, 1), dual(1, 1, 0, 6), dual(1, 11, 0, 11)}, want{}},
		{"dual-stack: both failing, the runs summed from the earliest",
			[]failurePoll{dual(0, 1, 0, 1), dual(1, 1, 0, 1), dual(2, 1, 1, 1), dual(3, 1, 2, 1)},
			want{true, 5, at(5), false, ""}},
		{"dual-stack: a family's first failure series appears mid-life",
			[]failurePoll{{families: []familyPoll{{"IPv4", 0, 1}}}, dual(0, 1, 2, 1)},
			want{true, 2, at(5), false, "IPv6"}},

		// Failures with no ip_family beside labelled timestamps: any family's sync mends, as a
		// single counter cannot say whose sync failed.
		{"unlabelled failures, mended by a labelled sync",
			[]failurePoll{{families: []familyPoll{{"", 0, -1}, {"IPv4", 0, 1}}}, {families: []familyPoll{{"", 1, -1}, {"IPv4", 0, 1}}},
				{families: []familyPoll{{"", 1, -1}, {"IPv4", 0, 12}}}},
			want{}},
		{"unlabelled failures, none applied since",
			[]failurePoll{{families: []familyPoll{{"", 0, -1}, {"IPv4", 0, 1}}}, {families: []familyPoll{{"", 2, -1}, {"IPv4", 0, 1}}}},
			want{true, 2, at(5), false, ""}},
	} {
		var w failureWatch
		for i, p := range c.polls {
			res := &probeResult{at: at(5 * i), up: !p.down, started: started}
			if c.name == "kube-proxy restarted (its counter went back)" && i == len(c.polls)-1 {
				res.started = started.Add(time.Hour) // the restarted process
			}
			for _, f := range p.families {
				res.families[res.numFamilies] = familySyncs{name: f.name, last: at(f.applied), failures: f.failures}
				res.numFamilies++
				res.restoreFailures += f.failures
				if at(f.applied).After(res.newestSync) {
					res.newestSync = at(f.applied)
				}
			}
			w.observe(res)
		}
		f, ok := w.failing()
		if got := (want{ok, f.failures, f.since, f.neverApplied, strings.Join(w.failingFamilies(), ",")}); got != c.want {
			t.Errorf("%s: got %+v, want %+v", c.name, got, c.want)
		}
	}
}
