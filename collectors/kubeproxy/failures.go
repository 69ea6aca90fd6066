package kubeproxy

import "time"

// kube-proxy counts the rule syncs it fails to apply (iptables-restore in iptables and IPVS
// mode, the nftables transaction in nftables mode) and retries a failed one every sync period,
// while its health check stays green. One failure that the retry mends is noise; syncs that
// keep failing are a node whose rules no change reaches, which a restart does not mend when
// the cause is the node's (a kernel module it lacks). The counter alone cannot tell the two
// apart, so the poller follows runs: failures counted with no sync applied since the first.

// failureRun is kube-proxy's current run of failed syncs.
type failureRun struct {
	// since is when the run began as far as is known: the poll that first saw it, or
	// kube-proxy's start when it has applied no sync since (neverApplied).
	since        time.Time
	neverApplied bool
	// base is kube-proxy's failure counter before the run's first failure.
	base float64
}

// failureWatch follows kube-proxy's failure counter and applied syncs across the polls that
// answered. It is the poller's own.
type failureWatch struct {
	seen       bool
	count      float64   // the counter at the last poll that answered
	newestSync time.Time // the newest applied sync then
	started    time.Time // kube-proxy's start then
	run        *failureRun
}

// observe takes one poll.
func (w *failureWatch) observe(res *probeResult) {
	if !res.up {
		return
	}
	count, applied := res.restoreFailures, res.newestSync
	restarted := count < w.count || !res.started.Equal(w.started)
	if !w.seen || restarted {
		// The first answer, or kube-proxy restarted (its counters start again): what went
		// before tells nothing of the process that answers now.
		w.run = nil
		if count > 0 && applied.IsZero() {
			// It has failed and applied nothing since it started: every sync it tried failed.
			since := res.started
			if since.IsZero() {
				since = res.at
			}
			w.run = &failureRun{since: since, neverApplied: true}
		}
		w.seen, w.count, w.newestSync, w.started = true, count, applied, res.started
		return
	}
	if applied.After(w.newestSync) {
		w.run = nil // a sync applied: whatever failed before it was mended
	}
	if count > w.count && w.run == nil {
		w.run = &failureRun{since: res.at, base: w.count}
		if applied.IsZero() {
			// None applied since it started: every failure since then is in the run.
			w.run = &failureRun{since: res.at, neverApplied: true}
			if !res.started.IsZero() {
				w.run.since = res.started
			}
		}
	}
	w.count, w.newestSync = count, applied
}

// failing reports the current run: the failures in it and since when; ok is false when
// kube-proxy's syncs are not failing.
func (w *failureWatch) failing() (failures uint64, since time.Time, neverApplied, ok bool) {
	if w.run == nil {
		return 0, time.Time{}, false, false
	}
	return uint64(w.count - w.run.base), w.run.since, w.run.neverApplied, true
}
