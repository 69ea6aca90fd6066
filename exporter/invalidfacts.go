package exporter

import (
	"errors"

	"github.com/proxyhealth/proxyhealth/collectors/conntrack"
	"github.com/proxyhealth/proxyhealth/internal/verdict"
)

// invalidReasonsInput is the window's INVALID packets by Service and reason, from conntrack's
// INVALID log as the samples (oldest first) read it; nil when the log is not read.
func invalidReasonsInput(samples []factSample) *verdict.InvalidReasonFacts {
	first, last := samples[0].invalid, samples[len(samples)-1].invalid
	if !last.Enabled {
		return nil
	}
	out := &verdict.InvalidReasonFacts{}
	// Counted only when the log was read throughout: one that failed in the window may have
	// missed packets. One that had not started yet had counted nothing, so only the last
	// sample's says it is not read.
	for i, sm := range samples {
		if err := sm.invalid.Err; err != nil && (i == len(samples)-1 || !errors.Is(err, conntrack.ErrInvalidLogNotStarted)) {
			out.Err = err.Error()
		}
	}
	if out.Err != "" {
		return out
	}
	type key struct{ namespace, name, reason string }
	before := make(map[key]uint64, len(first.Series))
	for _, s := range first.Series {
		before[key{s.Namespace, s.Name, s.Reason}] = s.Packets
	}
	for _, s := range last.Series {
		if n := delta(before[key{s.Namespace, s.Name, s.Reason}], s.Packets); n > 0 {
			out.Counts = append(out.Counts, verdict.InvalidReasonCount{Namespace: s.Namespace, Name: s.Name, Reason: s.Reason, Packets: n})
		}
	}
	out.Unlisted = delta(first.Unlisted, last.Unlisted)
	out.Lost = delta(first.Lost, last.Lost)
	// Read in windows at some point of the window (above --conntrack.invalid-reasons.max-rate):
	// the share of it the counts cover.
	sampled := false
	for _, sm := range samples {
		sampled = sampled || sm.invalid.Sampling
	}
	if elapsed := samples[len(samples)-1].at.Sub(samples[0].at); sampled && elapsed > 0 {
		out.SampledShare = min(1, max(0, (last.Listened-first.Listened).Seconds()/elapsed.Seconds()))
	}
	return out
}
