package kubeproxy

// kube-proxy writes its rules at every sync, also when nothing changed: with the iptables
// backend its periodic sync (every --iptables-sync-period, 30 s by default) rewrites
// KUBE-SERVICES, and the legacy kernel tables announce nothing, so each sync used to make the
// exporter read kube-proxy's whole nat table again (about 0.3 s of CPU at 10,000 Services x 10
// endpoints). kube-proxy's own metrics tell whether a sync can have changed a Service's rules:
// its partial syncs write the chains of only the Services whose Service or EndpointSlice
// changes it took in, and it counts those changes as it receives them.

// changeCounts is what one poll read of kube-proxy's change counters.
type changeCounts struct {
	// received is the Service and EndpointSlice changes kube-proxy received
	// (sync_proxy_rules_{endpoint,service}_changes_total), all IP families.
	received float64
	// fullSyncs is the full syncs it made (sync_full_proxy_rules_duration_seconds_count): at
	// start, after a failed sync, and after its rules were flushed by someone else.
	fullSyncs float64
	// known says kube-proxy exported every counter read here and the pending gauges; an older
	// or other proxy that does not makes every sync count as a change.
	known bool
}

// syncWatch decides, at each poll that finds a new kube-proxy sync, whether that sync can have
// changed kube-proxy's Service rules.
//
// A sync applies the changes received before it began and not yet applied. Between the last
// poll that saw a sync and this one, such changes show as the received counter moving, or as
// changes pending at a poll in between (received before the last sync-seen poll, applied
// since). A full sync, a restore failure (the next sync is a full one) or kube-proxy
// restarting (its counters start again) counts as a change too.
type syncWatch struct {
	last        *probeResult // the poll that last saw a sync, or the first poll
	pendingSeen bool         // changes were pending at a poll since last
}

// observe takes one poll; newSync says it found a sync kube-proxy applied since the last poll.
// It returns whether that sync may have changed the rules (false when newSync is false).
func (w *syncWatch) observe(res *probeResult, newSync bool) bool {
	pending := res.endpointsPending > 0 || res.servicesPending > 0
	if w.last == nil {
		w.last, w.pendingSeen = res, pending
		return newSync
	}
	if !newSync {
		w.pendingSeen = w.pendingSeen || pending
		return false
	}
	prev := w.last
	changed := w.pendingSeen ||
		!prev.changes.known || !res.changes.known ||
		res.changes.received != prev.changes.received ||
		res.changes.fullSyncs != prev.changes.fullSyncs ||
		res.restoreFailures != prev.restoreFailures
	w.last, w.pendingSeen = res, pending
	return changed
}
