package exporter

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/proxyhealth/proxyhealth/collectors/conntrack"
	"github.com/proxyhealth/proxyhealth/internal/verdict"
)

// Incident 2 with conntrack's INVALID log read: the verdict (/status, the landing page) names the Services and reasons of the
// packets logged within --status.window, not of those before it.
func TestStatusInvalidReasonsOverTheWindow(t *testing.T) {
	h := newHealthyNode()
	h.set.s.InvalidDrop = boolp(false)
	st := newStatus(h.sources(), 10*time.Minute)
	web := func(reason string, n uint64) conntrack.InvalidReasonSeries {
		return conntrack.InvalidReasonSeries{Namespace: "lab", Name: "web", Reason: reason, Packets: n}
	}
	// Five minutes before the window: lab/web's checksum packets, counted then.
	h.now = t0.Add(-15 * time.Minute)
	h.ct.invalid = conntrack.InvalidReasons{Enabled: true, Series: []conntrack.InvalidReasonSeries{web("checksum", 5000)}}
	st.record(st.src.sample())
	// The window's base.
	h.now = t0.Add(-10 * time.Minute)
	st.record(st.src.sample())
	// Within it: 1200 INVALID packets, logged as seq_over_window of lab/web and checksum of
	// lab/api, and some of Services beyond the cap.
	h.now = t0
	h.ct.stats.Invalid += 1200
	h.ct.invalid = conntrack.InvalidReasons{Enabled: true, Unlisted: 3, Lost: 2, Series: []conntrack.InvalidReasonSeries{
		{Namespace: "lab", Name: "api", Reason: "checksum", Packets: 40},
		web("checksum", 5000),
		web("seq_over_window", 1100),
	}}
	st.record(st.src.sample())
	rep := st.Report()
	i := slices.IndexFunc(rep.Findings, func(f verdict.Finding) bool { return f.Cause == verdict.InvalidNotDropped })
	if i < 0 {
		t.Fatalf("no invalid_not_dropped: %+v", rep)
	}
	f := rep.Findings[i]
	if !strings.Contains(f.Summary, "Conntrack marked 1200 packets INVALID in the last 10m (2/s), mostly for lab/web: 1100 seq_over_window packets, with") {
		t.Errorf("summary %q", f.Summary)
	}
	var fields []string
	for _, fl := range verdict.EvidenceFields(f.Evidence) {
		fields = append(fields, fl.Key+": "+fl.Value)
	}
	for _, want := range []string{
		"by_service_reason: service_namespace=lab service_name=web reason=seq_over_window packets=1100; service_namespace=lab service_name=api reason=checksum packets=40",
		"other_logged_packets: 3", "lost_logged_packets: 2",
	} {
		if !slices.Contains(fields, want) {
			t.Errorf("evidence has no %q:\n%s", want, strings.Join(fields, "\n"))
		}
	}
}

// The log's counts are judged only when it was read throughout the window; before it first
// started it had counted nothing.
func TestFactsInvalidReasons(t *testing.T) {
	notStarted := conntrack.InvalidReasons{Enabled: true, Err: conntrack.ErrInvalidLogNotStarted}
	reading := conntrack.InvalidReasons{Enabled: true, Series: []conntrack.InvalidReasonSeries{{Reason: "tcp_flags", Packets: 4}}}
	failed := conntrack.InvalidReasons{Enabled: true, Err: errors.New("reading NFLOG group 0: no buffer space available")}
	for _, tc := range []struct {
		name    string
		samples []conntrack.InvalidReasons
		want    *verdict.InvalidReasonFacts
	}{
		{"flag off", []conntrack.InvalidReasons{{}, {}}, nil},
		{"started in the window", []conntrack.InvalidReasons{notStarted, reading},
			&verdict.InvalidReasonFacts{Counts: []verdict.InvalidReasonCount{{Reason: "tcp_flags", Packets: 4}}}},
		{"nothing new", []conntrack.InvalidReasons{reading, reading}, &verdict.InvalidReasonFacts{}},
		{"not started at the end", []conntrack.InvalidReasons{notStarted, notStarted}, &verdict.InvalidReasonFacts{Err: conntrack.ErrInvalidLogNotStarted.Error()}},
		{"failed in the window", []conntrack.InvalidReasons{reading, failed, reading}, &verdict.InvalidReasonFacts{Err: failed.Err.Error()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			samples := make([]factSample, len(tc.samples))
			for i, r := range tc.samples {
				samples[i] = factSample{at: t0.Add(time.Duration(i) * time.Minute), invalid: r}
			}
			got := invalidReasonsInput(samples)
			if (got == nil) != (tc.want == nil) || got != nil && (got.Err != tc.want.Err || !slices.Equal(got.Counts, tc.want.Counts)) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// Under a flood the log is read in windows: the verdict's input says over what share of the
// window its counts were taken, from the time the reader listened.
func TestFactsInvalidReasonsSampled(t *testing.T) {
	series := func(n uint64) []conntrack.InvalidReasonSeries {
		return []conntrack.InvalidReasonSeries{{Namespace: "lab", Name: "web", Reason: "tcp_flags", Packets: n}}
	}
	samples := []factSample{
		{at: t0, invalid: conntrack.InvalidReasons{Enabled: true, Series: series(100), Listened: 50 * time.Second}},
		{at: t0.Add(5 * time.Minute), invalid: conntrack.InvalidReasons{Enabled: true, Series: series(20100), Listened: 80 * time.Second, Sampling: true}},
		{at: t0.Add(10 * time.Minute), invalid: conntrack.InvalidReasons{Enabled: true, Series: series(40100), Listened: 110 * time.Second, Sampling: true}},
	}
	got := invalidReasonsInput(samples)
	if got == nil || got.SampledShare != 0.1 || !slices.Equal(got.Counts, []verdict.InvalidReasonCount{{Namespace: "lab", Name: "web", Reason: "tcp_flags", Packets: 40000}}) {
		t.Errorf("got %+v, want 40000 tcp_flags packets of lab/web sampled over 0.1 of the window", got)
	}
	// Read throughout: no share, whatever the clocks say.
	for i := range samples {
		samples[i].invalid.Sampling = false
	}
	if got := invalidReasonsInput(samples); got.SampledShare != 0 {
		t.Errorf("read throughout: sampled share %v", got.SampledShare)
	}
}
