package kubeproxy

import "time"

// kube-proxy counts the rule syncs it fails to apply (iptables-restore in iptables and IPVS
// mode, the nftables transaction in nftables mode) and retries a failed one every sync period,
// while its health check stays green. One failure that the retry mends is noise; syncs that
// keep failing are a node whose rules no change reaches, which a restart does not mend when
// the cause is the node's (a kernel module it lacks). The counter alone cannot tell the two
// apart, so the poller follows runs: failures counted with no sync applied since the first.
//
// A dual-stack kube-proxy runs one proxier per IP family, each with its own failure counter
// and last applied sync (the ip_family label). Runs are followed per family: the IPv6
// proxier's syncs keep applying while every IPv4 restore fails (a match module the IPv4 rules
// need and the node lacks), and those applied syncs mend nothing of the IPv4 rules.

// failureRun is one IP family's current run of failed syncs.
type failureRun struct {
	// since is when the run began as far as is known: the poll that first saw it, or
	// kube-proxy's start when it has applied no sync since (neverApplied).
	since        time.Time
	neverApplied bool
	// base is the family's failure counter before the run's first failure.
	base float64
}

// familyWatch follows one IP family's failure counter and applied syncs.
type familyWatch struct {
	name    string
	count   float64   // the counter at the last poll that answered
	applied time.Time // the last applied sync then
	run     *failureRun
}

// failureWatch follows kube-proxy's failure counters and applied syncs across the polls that
// answered. It is the poller's own.
type failureWatch struct {
	seen        bool
	total       float64   // the counters' sum at the last poll that answered
	started     time.Time // kube-proxy's start then
	families    [maxIPFamilies]familyWatch
	numFamilies int
}

// observe takes one poll.
func (w *failureWatch) observe(res *probeResult) {
	if !res.up {
		return
	}
	restarted := res.restoreFailures < w.total || !res.started.Equal(w.started)
	first := !w.seen || restarted
	if first {
		// The first answer, or kube-proxy restarted (its counters start again): what went
		// before tells nothing of the process that answers now.
		w.numFamilies = 0
	}
	w.seen, w.total, w.started = true, res.restoreFailures, res.started
	for _, f := range res.families[:res.numFamilies] {
		applied := f.last
		if f.name == "" {
			// Failures counted with no ip_family (a kube-proxy that labels none, or an odd
			// one that labels only its timestamps): any family's sync is the best evidence of
			// a sync applied, as before families were told apart.
			applied = res.newestSync
		}
		fw := w.family(f.name)
		if fw == nil {
			continue // past maxIPFamilies, which kube-proxy never reaches
		}
		fw.observe(f.failures, applied, res, first)
	}
}

// family returns the watch of the IP family name, added when new; nil when the watch is full.
func (w *failureWatch) family(name string) *familyWatch {
	for i := range w.families[:w.numFamilies] {
		if w.families[i].name == name {
			return &w.families[i]
		}
	}
	if w.numFamilies == maxIPFamilies {
		return nil
	}
	fw := &w.families[w.numFamilies]
	w.numFamilies++
	*fw = familyWatch{name: name}
	return fw
}

// observe takes one poll of the family: its failure counter and last applied sync. first says
// that the poll is the first of this kube-proxy process. A family not seen before in the same
// process starts from zero, as kube-proxy's labelled counter has no series before its first
// failure.
func (fw *familyWatch) observe(count float64, applied time.Time, res *probeResult, first bool) {
	neverAppliedSince := func() time.Time {
		if !res.started.IsZero() {
			return res.started
		}
		return res.at
	}
	if first {
		if count > 0 && applied.IsZero() {
			// It has failed and applied nothing since it started: every sync it tried failed.
			fw.run = &failureRun{since: neverAppliedSince(), neverApplied: true}
		}
		fw.count, fw.applied = count, applied
		return
	}
	if applied.After(fw.applied) {
		fw.run = nil // a sync applied: whatever failed before it was mended
	}
	if count > fw.count && fw.run == nil {
		fw.run = &failureRun{since: res.at, base: fw.count}
		if applied.IsZero() {
			// None applied since it started: every failure since then is in the run.
			fw.run = &failureRun{since: neverAppliedSince(), neverApplied: true}
		}
	}
	fw.count, fw.applied = count, applied
}

// failingSyncs is kube-proxy's current runs of failed syncs, over IP families.
type failingSyncs struct {
	failures     uint64    // the failures in the runs
	since        time.Time // the earliest run's start
	neverApplied bool      // a family has applied no sync since kube-proxy started
	partial      bool      // another family's syncs are not failing
}

// failing reports the current runs; ok is false when no family's syncs are failing. It
// allocates nothing: every scrape asks.
func (w *failureWatch) failing() (f failingSyncs, ok bool) {
	for _, fw := range w.families[:w.numFamilies] {
		if fw.run == nil {
			f.partial = true
			continue
		}
		f.failures += uint64(fw.count - fw.run.base)
		if !ok || fw.run.since.Before(f.since) {
			f.since = fw.run.since
		}
		f.neverApplied = f.neverApplied || fw.run.neverApplied
		ok = true
	}
	return f, ok
}

// failingFamilies names the IP families failing while another family's syncs are not (one
// proxier of a dual-stack kube-proxy); nil when every family known fails, or none does.
func (w *failureWatch) failingFamilies() []string {
	if f, ok := w.failing(); !ok || !f.partial {
		return nil
	}
	var names []string
	for _, fw := range w.families[:w.numFamilies] {
		if fw.run != nil && fw.name != "" {
			names = append(names, fw.name)
		}
	}
	return names
}
