package verdict

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/proxyhealth/proxyhealth/internal/proxyversion"
)

// evaluation is one run of the engine's rules over an Input.
type evaluation struct {
	in       Input
	th       Thresholds
	findings []Finding
	// unchecked maps a reason to the causes it kept from being judged, in first-seen order.
	unchecked []NotChecked
}

func (e *evaluation) notChecked(reason string, causes ...Cause) {
	for i := range e.unchecked {
		if e.unchecked[i].Reason == reason {
			for _, c := range causes {
				if !slices.Contains(e.unchecked[i].Causes, c) {
					e.unchecked[i].Causes = append(e.unchecked[i].Causes, c)
				}
			}
			return
		}
	}
	e.unchecked = append(e.unchecked, NotChecked{Causes: slices.Clone(causes), Reason: reason})
}

func (e *evaluation) notCheckedList() []NotChecked {
	out := slices.Clone(e.unchecked)
	if out == nil {
		out = []NotChecked{}
	}
	return out
}

func (e *evaluation) add(f Finding) { e.findings = append(e.findings, f) }

// notes says when kube-proxy's version is one proxyhealth is not tested with: the endpoints
// it should program, which stale rules are judged against, follow the tested versions' rules.
func (e *evaluation) notes() []string {
	reported := e.in.KubeProxy.Version
	if reported == "" {
		return nil
	}
	v, ok := proxyversion.Parse(reported)
	switch {
	case !ok:
		return []string{fmt.Sprintf("kube-proxy reports version %q, which proxyhealth cannot place: what it should program is computed as kube-proxy %s computes it (proxyhealth is tested with %s).",
			reported, proxyversion.NewestTested, proxyversion.TestedRange())}
	case !v.Tested():
		return []string{fmt.Sprintf("kube-proxy %s is outside the versions proxyhealth is tested with (%s): stale rules may be misjudged where it picks endpoints differently.",
			reported, proxyversion.TestedRange())}
	}
	return nil
}

// kubeProxyRules is on the node: the drift check found kube-proxy's rules.
func (e *evaluation) kubeProxyRules() bool {
	switch e.in.Rules.Mode {
	case "iptables", "nftables", "ipvs":
		return true
	}
	return false
}

func (e *evaluation) run() {
	kp := e.kubeProxy()
	apiStale := e.apiView()
	stale := e.staleRules(kp)
	if len(stale) > 0 {
		// Stale rules are the story; what kube-proxy did wrong is told in their evidence.
		kp = kubeProxyFindings{}
	} else if kp.watch != nil && apiStale != nil {
		// kube-proxy and the exporter both fail to hear from the API: one story, the node's
		// path to the API server, told once.
		ev := kp.watch.Evidence.(*KubeProxyEvidence)
		ev.APIView = apiStale.Evidence.(*APIEvidence)
		ev.Explains = append(ev.Explains, APIViewStale)
		kp.watch.Summary = strings.TrimSuffix(kp.watch.Summary, ".") +
			", and the exporter's own view of the API is stale too: the node's path to the API server is the likely cause."
		apiStale = nil
	}
	flows := e.unrepliedFlows()
	flows = e.bridgeNetfilter(flows)
	for i := range stale {
		flows = e.attachFlows(&stale[i], flows)
	}
	for _, f := range stale {
		e.add(f)
	}
	for _, f := range []*Finding{kp.sync, kp.down, kp.stuck, kp.watch, apiStale} {
		if f != nil {
			e.add(*f)
		}
	}
	e.unexplainedFlows(flows)
	e.conntrack()
}

// kubeProxyFindings are the node-wide kube-proxy findings, nil when not found.
type kubeProxyFindings struct {
	sync, watch, stuck, down *Finding
	// explainedBy are the kube-proxy causes that would explain stale rules: failing syncs
	// (one in a row is enough), any list/watch failure read (one is enough: a black-holed
	// connection logs one per informer, then nothing), a stuck sync, kube-proxy down.
	explainedBy []Cause
	because     []string // the same, as clauses of a sentence
	// remedy is what to do about stale rules they explain: restart kube-proxy, unless its
	// syncs fail, which a restart does not mend.
	remedy string
}

// restartRemedy is what mends a kube-proxy that lost its watch or got stuck.
const restartRemedy = "restart kube-proxy on this node"

func (e *evaluation) kubeProxyEvidence() *KubeProxyEvidence {
	k := e.in.KubeProxy
	ev := &KubeProxyEvidence{
		Up:                    k.Up,
		Healthy:               k.Healthy,
		LastSync:              k.LastSync.UTC(),
		SyncPendingSeconds:    k.SyncPending.Seconds(),
		ListErrors:            slices.Clone(k.ListErrors),
		ListErrorsSpanSeconds: k.ListErrorsSpan.Seconds(),
		LastListError:         k.LastListError.UTC(),
		LogFiles:              slices.Clone(k.LogFiles),
	}
	if !k.Up {
		ev.DownReason = k.DownReason
	}
	if k.Up && k.SyncFailing && k.SyncFailures > 0 {
		ev.SyncFailures = e.syncFailuresEvidence()
	}
	if ev.ListErrors == nil {
		ev.ListErrors = []ListErrorCount{}
	}
	if ev.LogFiles == nil {
		ev.LogFiles = []string{}
	}
	return ev
}

// listErrorSummary names the resources that failed, most failures first, and the total, counting
// recent failures when recent is set, else all.
func listErrorSummary(errs []ListErrorCount, recent bool) (string, uint64) {
	type rv struct {
		name string
		n    uint64
	}
	var parts []rv
	var total uint64
	for _, l := range errs {
		n := l.Total
		if recent {
			n = l.Recent
		}
		if n == 0 {
			continue
		}
		total += n
		parts = append(parts, rv{l.Resource + " " + l.Verb, n})
	}
	slices.SortStableFunc(parts, func(a, b rv) int { return cmp.Compare(b.n, a.n) })
	names := make([]string, 0, len(parts))
	for _, p := range parts {
		names = append(names, fmt.Sprintf("%s %d", p.name, p.n))
	}
	return strings.Join(names, ", "), total
}

func (e *evaluation) kubeProxy() kubeProxyFindings {
	var out kubeProxyFindings
	k := e.in.KubeProxy
	if !k.Checked {
		reason := k.Err
		if reason == "" {
			reason = "kube-proxy was not looked at"
		}
		e.notChecked(reason, KubeProxySyncFailing, KubeProxyDown, KubeProxyStuck, KubeProxyWatchFailing)
		return out
	}

	// Its metrics and log: rule syncs that keep failing. They explain a queued change left
	// unapplied, so kube_proxy_stuck is then not told.
	syncFailing := k.Up && k.SyncFailing && k.SyncFailures > 0
	if syncFailing {
		ev := e.syncFailuresEvidence()
		out.explainedBy = append(out.explainedBy, KubeProxySyncFailing)
		out.because = append(out.because, syncFailureClause(ev, e.in.Rules.Mode))
		out.remedy = ev.Remedy
		if ev.NeverApplied || (e.th.SyncFailures > 0 && ev.Failed >= e.th.SyncFailures) {
			kev := e.kubeProxyEvidence()
			kev.ProxyMode = e.in.Rules.Mode
			kev.SyncFailures = ev
			severity, effect := syncFailureEffect(e.in.Rules.Mode, ev.NeverApplied)
			summary := syncFailureClause(ev, e.in.Rules.Mode) + effect + "; " + ev.Remedy
			out.sync = &Finding{Cause: KubeProxySyncFailing, Severity: severity, Summary: summary, Evidence: kev,
				Runbook: runbook(anchorSyncFailing)}
		}
	}

	// Its log: list/watch failures.
	if detail, total := listErrorSummary(k.ListErrors, false); total > 0 || !k.LastListError.IsZero() {
		out.explainedBy = append(out.explainedBy, KubeProxyWatchFailing)
		clause := "kube-proxy's list/watch of the API failed"
		if total > 0 {
			clause += " (" + detail
			if !k.LastListError.IsZero() {
				clause += "; last at " + formatTime(k.LastListError)
			}
			clause += ")"
		}
		out.because = append(out.because, clause)
	}
	var failing bool
	for _, l := range k.ListErrors {
		if l.Recent >= e.th.ListErrors && e.th.ListErrors > 0 {
			failing = true
		}
	}
	if failing {
		detail, total := listErrorSummary(k.ListErrors, true)
		summary := fmt.Sprintf("kube-proxy failed to list or watch the API %s in the last %s (%s)",
			plural(total, "time", "times"), formatDuration(k.ListErrorsSpan), detail)
		if !k.LastListError.IsZero() {
			summary += ", last at " + formatTime(k.LastListError)
		}
		summary += ": its view of Services and endpoints may be stuck while its health check stays green."
		out.watch = &Finding{Cause: KubeProxyWatchFailing, Severity: Warning, Summary: summary,
			Evidence: e.kubeProxyEvidence(), Runbook: runbook(anchorListWatchFailing)}
	}
	switch {
	case k.LogErr != "":
		e.notChecked(k.LogErr, KubeProxyWatchFailing)
	case len(k.LogFiles) == 0 && e.kubeProxyRules():
		e.notChecked("no kube-proxy log file found (see --kubeproxy.log-path): its list/watch failures cannot be read", KubeProxyWatchFailing)
	}

	// Its metrics: a queued change left unapplied.
	if k.Up && !syncFailing && e.th.SyncPending > 0 && k.SyncPending >= e.th.SyncPending {
		out.explainedBy = append(out.explainedBy, KubeProxyStuck)
		out.because = append(out.because, "kube-proxy has left a queued change unapplied for "+formatDuration(k.SyncPending))
		summary := "kube-proxy has had a change queued for " + formatDuration(k.SyncPending) + " without applying it"
		if !k.LastSync.IsZero() {
			summary += " (its last sync was at " + formatTime(k.LastSync) + ")"
		}
		summary += ": its sync loop is stuck or failing, and new endpoints do not reach the rules."
		out.stuck = &Finding{Cause: KubeProxyStuck, Severity: Warning, Summary: summary,
			Evidence: e.kubeProxyEvidence(), Runbook: runbook(anchorKubeProxyStuck)}
	}

	// Whether it answers at all.
	if !k.Up {
		switch {
		case e.kubeProxyRules():
			out.explainedBy = append(out.explainedBy, KubeProxyDown)
			out.because = append(out.because, "kube-proxy does not answer, so nothing updates its rules")
			ev := e.kubeProxyEvidence()
			ev.ProxyMode = e.in.Rules.Mode
			downFor := k.DownFor
			if downFor <= 0 {
				downFor = e.in.Window
			}
			summary := fmt.Sprintf("kube-proxy's %s rules are on this node but its metrics endpoint has not answered for %s: nothing updates those rules.",
				e.in.Rules.Mode, formatDuration(downFor))
			out.down = &Finding{Cause: KubeProxyDown, Severity: Warning, Summary: summary, Evidence: ev,
				Runbook: runbook(anchorKubeProxyDown)}
		case e.in.Rules.Mode == "":
			e.notChecked("kube-proxy does not answer, and whether its rules are on this node is unknown", KubeProxyDown)
		}
	}
	return out
}

func (e *evaluation) apiView() *Finding {
	a := e.in.API
	switch {
	case !a.Configured:
		reason := "no Kubernetes API is configured (--kubeconfig, in-cluster, or $KUBECONFIG): kube-proxy's rules cannot be compared with it"
		if a.Err != "" {
			reason = a.Err
		}
		e.notChecked(reason, StaleRules)
		return nil
	case a.Fresh:
		return nil
	}
	e.notChecked("the API view is not fresh: kube-proxy's rules are not compared with a view that may be stale", StaleRules)
	ev := &APIEvidence{Fresh: false, LastHeard: a.LastHeard.UTC(), Error: a.Err}
	summary := "The exporter's view of the Kubernetes API is stale"
	if a.LastHeard.IsZero() {
		summary += " (never heard from the API server"
	} else {
		summary += " (last heard from the API server at " + formatTime(a.LastHeard)
	}
	if a.Err != "" {
		summary += ": " + a.Err
	}
	summary += "), so kube-proxy's rules cannot be checked against it."
	return &Finding{Cause: APIViewStale, Severity: Warning, Summary: summary, Evidence: ev, Runbook: runbook(anchorAPIViewStale)}
}

func (e *evaluation) staleRules(kp kubeProxyFindings) []Finding {
	r := e.in.Rules
	if !e.in.API.Configured || !e.in.API.Fresh {
		return nil // said by apiView
	}
	switch {
	case r.Err != "":
		e.notChecked(r.Err, StaleRules)
	case !r.Checked:
		e.notChecked("kube-proxy's rules have not been compared with the API yet", StaleRules)
	}
	if len(r.Drifting) == 0 {
		return nil
	}
	explainedBy := slices.Clone(kp.explainedBy)
	if explainedBy == nil {
		explainedBy = []Cause{}
	}
	because := ", with no failure seen in kube-proxy's log or metrics"
	if len(kp.because) > 0 {
		because = ", because " + strings.Join(kp.because, " and ")
	}
	remedy := kp.remedy
	if remedy == "" {
		remedy = restartRemedy
	}
	max := len(r.Drifting)
	if e.th.MaxServiceFindings > 0 {
		max = min(max, e.th.MaxServiceFindings)
	}
	out := make([]Finding, 0, max+1)
	for _, d := range r.Drifting[:max] {
		svc := d.Service
		ev := &StaleRulesEvidence{
			Programmed:                d.Programmed,
			Expected:                  d.Expected,
			MissingCount:              d.MissingCount,
			StaleCount:                d.StaleCount,
			Missing:                   nonNil(d.Missing),
			Stale:                     nonNil(d.Stale),
			MissingFrom:               d.MissingFrom,
			StaleIn:                   d.StaleIn,
			MissingFromVirtualServers: d.MissingFromServers,
			StaleInVirtualServers:     d.StaleInServers,
			ByFamily:                  append([]FamilyDrift{}, d.ByFamily...),
			Since:                     d.Since.UTC(),
			GracePeriodSeconds:        r.GracePeriod.Seconds(),
			ProxyMode:                 r.Mode,
			ExplainedBy:               explainedBy,
		}
		if e.in.KubeProxy.Checked {
			ev.KubeProxy = e.kubeProxyEvidence()
		}
		var counts []string
		if d.MissingCount > 0 {
			counts = append(counts, fmt.Sprintf("%d missing", d.MissingCount)+onlyLocal(d.MissingFrom, d.MissingCount, "from", r.Mode))
		}
		if d.StaleCount > 0 {
			counts = append(counts, fmt.Sprintf("%d stale", d.StaleCount)+onlyLocal(d.StaleIn, d.StaleCount, "in", r.Mode))
		}
		summary := fmt.Sprintf("kube-proxy's rules for %s differ from the API: %d endpoints programmed, %d in the API (%s) for %s%s; %s",
			svc, d.Programmed, d.Expected, strings.Join(counts, ", "), formatDuration(e.in.Now.Sub(d.Since)), because, sentenceEnd(remedy))
		out = append(out, Finding{Cause: StaleRules, Severity: Critical, Service: &svc, Summary: summary, Evidence: ev,
			Runbook: runbook(anchorRulesStale)})
	}
	if rest := r.Drifting[max:]; len(rest) > 0 {
		ev := &StaleRulesRestEvidence{ServicePorts: len(rest), ExplainedBy: explainedBy}
		for _, d := range rest {
			ev.MissingCount += d.MissingCount
			ev.StaleCount += d.StaleCount
		}
		summary := fmt.Sprintf("kube-proxy's rules for %d more service ports differ from the API (%d endpoints missing, %d stale in all)%s; %s",
			len(rest), ev.MissingCount, ev.StaleCount, because, sentenceEnd(remedy))
		out = append(out, Finding{Cause: StaleRules, Severity: Critical, Summary: summary, Evidence: ev, Runbook: runbook(anchorRulesStale)})
	}
	return out
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return slices.Clone(s)
}

// serviceFlows is one service port's unreplied flows, by reason.
type serviceFlows struct {
	svc      Service
	byReason []ReasonCount
}

func (s *serviceFlows) total() (ended, open uint64) {
	for _, r := range s.byReason {
		ended += r.Ended
		open += r.Open
	}
	return ended, open
}

// unrepliedFlows groups the Input's unreplied flows by service port (flows to no known service
// are left out: they name nothing), or nil when flows were not followed.
func (e *evaluation) unrepliedFlows() []*serviceFlows {
	c := e.in.Conntrack
	if c.FlowsErr != "" {
		e.notChecked(c.FlowsErr, UnrepliedFlows)
		return nil
	}
	var out []*serviceFlows
	for _, u := range c.Unreplied {
		if u.Reason == ReasonNoService || u.Service.Name == "" || u.Ended+u.Open == 0 {
			continue
		}
		i := slices.IndexFunc(out, func(s *serviceFlows) bool { return s.svc.samePort(u.Service) })
		if i < 0 {
			out = append(out, &serviceFlows{svc: u.Service})
			i = len(out) - 1
		}
		s := out[i]
		j := slices.IndexFunc(s.byReason, func(r ReasonCount) bool { return r.Reason == u.Reason })
		if j < 0 {
			s.byReason = append(s.byReason, ReasonCount{Reason: u.Reason})
			j = len(s.byReason) - 1
		}
		s.byReason[j].Ended += u.Ended
		s.byReason[j].Open += u.Open
	}
	for _, s := range out {
		slices.SortFunc(s.byReason, func(a, b ReasonCount) int { return cmp.Compare(a.Reason, b.Reason) })
	}
	// Most flows first, then by name, so that output is stable.
	slices.SortStableFunc(out, func(a, b *serviceFlows) int {
		ae, ao := a.total()
		be, bo := b.total()
		if c := cmp.Compare(be+bo, ae+ao); c != 0 {
			return c
		}
		return cmp.Compare(a.svc.String(), b.svc.String())
	})
	return out
}

// bridgeNetfilter finds incident 1: same-bridge flows unreplied while bridge netfilter is off.
// It returns the flows it does not explain.
func (e *evaluation) bridgeNetfilter(flows []*serviceFlows) []*serviceFlows {
	k := e.in.Kernel
	switch {
	case k.BridgeNFCallIptables == nil:
		reason := "net.bridge.bridge-nf-call-iptables could not be read"
		if k.Err != "" {
			reason += ": " + k.Err
		}
		e.notChecked(reason, BridgeNetfilterOff)
		return flows
	case *k.BridgeNFCallIptables == 1:
		return flows
	case e.in.Conntrack.FlowsErr != "":
		e.notChecked(fmt.Sprintf("net.bridge.bridge-nf-call-iptables is %d, but Service flows cannot be followed to see whether same-bridge connections fail: %s",
			*k.BridgeNFCallIptables, e.in.Conntrack.FlowsErr), BridgeNetfilterOff)
		return flows
	}
	ev := &BridgeNetfilterEvidence{BridgeNFCallIptables: *k.BridgeNFCallIptables, WindowSeconds: e.in.Window.Seconds(),
		Services: []ServiceFlows{}, Explains: []Cause{UnrepliedFlows}}
	var rest []*serviceFlows
	for _, s := range flows {
		var hit ServiceFlows
		kept := s.byReason[:0:0]
		for _, r := range s.byReason {
			if r.Reason == ReasonSameBridge {
				hit = ServiceFlows{Service: s.svc, Ended: r.Ended, Open: r.Open}
				continue
			}
			kept = append(kept, r)
		}
		if hit.Ended+hit.Open > 0 {
			ev.Services = append(ev.Services, hit)
			ev.Ended += hit.Ended
			ev.Open += hit.Open
		}
		if len(kept) > 0 {
			rest = append(rest, &serviceFlows{svc: s.svc, byReason: kept})
		}
	}
	if len(ev.Services) == 0 {
		return flows
	}
	slices.SortStableFunc(ev.Services, func(a, b ServiceFlows) int { return cmp.Compare(b.Ended+b.Open, a.Ended+a.Open) })
	setting := "net.bridge.bridge-nf-call-iptables is 0"
	if ev.BridgeNFCallIptables < 0 {
		setting = "br_netfilter is not loaded"
	}
	svcs := make([]Service, 0, len(ev.Services))
	for _, s := range ev.Services {
		svcs = append(svcs, s.Service)
	}
	summary := fmt.Sprintf("%s, so replies from endpoints on the client's own bridge escape un-NATed: connections to %s fail (%s).",
		setting, listServices(svcs, 3), flowsWhen(ev.Ended, ev.Open, e.in.Window))
	e.add(Finding{Cause: BridgeNetfilterOff, Severity: Critical, Summary: summary, Evidence: ev, Runbook: runbook(anchorBridgeNetfilterOff)})
	return rest
}

// flowsWhen says how flows went unreplied: "6 ended unreplied in the last 10m, 1 still
// waiting for a reply".
func flowsWhen(ended, open uint64, window time.Duration) string {
	var parts []string
	if ended > 0 {
		parts = append(parts, fmt.Sprintf("%d ended unreplied in the last %s", ended, formatDuration(window)))
	}
	if open > 0 {
		parts = append(parts, fmt.Sprintf("%d still waiting for a reply", open))
	}
	return strings.Join(parts, ", ")
}

// attachFlows puts a stale service port's unreplied flows in its evidence: the stale rules
// explain them. It returns the flows left.
func (e *evaluation) attachFlows(f *Finding, flows []*serviceFlows) []*serviceFlows {
	if f.Service == nil {
		return flows
	}
	i := slices.IndexFunc(flows, func(s *serviceFlows) bool { return s.svc.samePort(*f.Service) })
	if i < 0 {
		return flows
	}
	ev := f.Evidence.(*StaleRulesEvidence)
	ended, open := flows[i].total()
	ev.UnrepliedFlows = &FlowsEvidence{Ended: ended, Open: open, WindowSeconds: e.in.Window.Seconds(), ByReason: flows[i].byReason}
	ev.Explains = []Cause{UnrepliedFlows}
	return slices.Delete(slices.Clone(flows), i, i+1)
}

// unexplainedFlows reports the Service ports whose TCP or SCTP connections end unreplied for no
// cause found. UDP is left out: fire-and-forget UDP (statsd, syslog) ends unreplied by design.
func (e *evaluation) unexplainedFlows(flows []*serviceFlows) {
	if e.th.UnrepliedFlows == 0 {
		return
	}
	var hit []*serviceFlows
	for _, s := range flows {
		if s.svc.Protocol == "udp" {
			continue
		}
		if ended, open := s.total(); ended+open >= e.th.UnrepliedFlows {
			hit = append(hit, s)
		}
	}
	max := len(hit)
	if e.th.MaxServiceFindings > 0 {
		max = min(max, e.th.MaxServiceFindings)
	}
	for _, s := range hit[:max] {
		svc := s.svc
		ended, open := s.total()
		reasons := make([]string, 0, len(s.byReason))
		for _, r := range s.byReason {
			reasons = append(reasons, r.Reason)
		}
		summary := fmt.Sprintf("Connections to %s get no reply (%s; endpoints: %s), and no cause was found on this node.",
			svc, flowsWhen(ended, open, e.in.Window), strings.Join(reasons, ", "))
		e.add(Finding{Cause: UnrepliedFlows, Severity: Warning, Service: &svc, Summary: summary,
			Evidence: &FlowsEvidence{Ended: ended, Open: open, WindowSeconds: e.in.Window.Seconds(), ByReason: s.byReason},
			Runbook:  runbook(anchorUnrepliedFlows)})
	}
	if rest := hit[max:]; len(rest) > 0 {
		ev := &FlowsEvidence{WindowSeconds: e.in.Window.Seconds(), ByReason: []ReasonCount{}}
		for _, s := range rest {
			ended, open := s.total()
			ev.Ended += ended
			ev.Open += open
		}
		summary := fmt.Sprintf("Connections to %d more Service ports get no reply (%s), and no cause was found on this node.",
			len(rest), flowsWhen(ev.Ended, ev.Open, e.in.Window))
		e.add(Finding{Cause: UnrepliedFlows, Severity: Warning, Summary: summary, Evidence: ev, Runbook: runbook(anchorUnrepliedFlows)})
	}
}

// conntrack judges the table: fill and drops, failed inserts, INVALID packets nothing drops.
func (e *evaluation) conntrack() {
	c := e.in.Conntrack
	if c.StatsErr != "" {
		e.notChecked(c.StatsErr, ConntrackTableFull, ConntrackInsertFailing, InvalidNotDropped)
		return
	}
	window := e.in.Window.Seconds()
	fill := 0.0
	if c.Limit > 0 {
		fill = float64(c.Entries) / float64(c.Limit)
	}
	table := &TableEvidence{Entries: c.Entries, Limit: c.Limit, Fill: math.Round(fill*1000) / 1000, Drop: c.Drop, EarlyDrop: c.EarlyDrop, WindowSeconds: window}
	switch {
	case window > 0 && c.Drop+c.EarlyDrop > 0:
		var what []string
		if c.Drop > 0 {
			what = append(what, "dropped "+plural(c.Drop, "packet of a new flow", "packets of new flows"))
		}
		if c.EarlyDrop > 0 {
			what = append(what, "evicted "+plural(c.EarlyDrop, "entry", "entries")+" to make room")
		}
		summary := fmt.Sprintf("The conntrack table %s in the last %s (now %.0f%% full: %d of %d entries): new connections fail.",
			strings.Join(what, " and "), formatDuration(e.in.Window), 100*fill, c.Entries, c.Limit)
		e.add(Finding{Cause: ConntrackTableFull, Severity: Critical, Summary: summary, Evidence: table, Runbook: runbook(anchorDroppingFlows)})
	case c.Limit > 0 && fill >= e.th.TableFullRatio:
		summary := fmt.Sprintf("The conntrack table is %.0f%% full (%d of %d entries): once full, new connections are dropped.",
			100*fill, c.Entries, c.Limit)
		e.add(Finding{Cause: ConntrackTableFull, Severity: Warning, Summary: summary, Evidence: table, Runbook: runbook(anchorTableNearlyFull)})
	}
	if window <= 0 {
		e.notChecked("the conntrack counters have been read only once: their rates need two readings", ConntrackInsertFailing, InvalidNotDropped)
		return
	}
	if rate := float64(c.InsertFailed) / window; rate > e.th.InsertFailedPerSecond {
		summary := fmt.Sprintf("Conntrack failed to insert %d entries in the last %s (%.2g/s): packets of those flows were dropped (often parallel UDP DNS queries racing).",
			c.InsertFailed, formatDuration(e.in.Window), rate)
		e.add(Finding{Cause: ConntrackInsertFailing, Severity: Warning, Summary: summary,
			Evidence: &InsertEvidence{InsertFailed: c.InsertFailed, WindowSeconds: window, PerSecond: rate}, Runbook: runbook(anchorInsertFailing)})
	}
	rate := float64(c.Invalid) / window
	if rate <= e.th.InvalidPerSecond {
		return
	}
	k := e.in.Kernel
	switch {
	case k.TCPBeLiberal != nil && *k.TCPBeLiberal == 1, k.InvalidDropRule != nil && *k.InvalidDropRule:
		return // harmless: conntrack is liberal, or INVALID packets are dropped
	case k.TCPBeLiberal == nil:
		e.notChecked("net.netfilter.nf_conntrack_tcp_be_liberal could not be read"+suffix(k.Err), InvalidNotDropped)
		return
	case k.InvalidDropRule == nil:
		e.notChecked("the forward path's rules could not be read to find a ctstate INVALID drop"+suffix(k.RulesErr), InvalidNotDropped)
		return
	}
	ev := &InvalidEvidence{InvalidPackets: c.Invalid, WindowSeconds: window, PerSecond: rate, TCPBeLiberal: *k.TCPBeLiberal, InvalidDropRule: false}
	mostly := invalidReasons(c.InvalidReasons, ev)
	summary := fmt.Sprintf("Conntrack marked %d packets INVALID in the last %s (%.2g/s)%s with nf_conntrack_tcp_be_liberal off and no ctstate INVALID drop rule on the forward path: such replies leave the node un-NATed and clients reset their connections.",
		c.Invalid, formatDuration(e.in.Window), rate, mostly)
	e.add(Finding{Cause: InvalidNotDropped, Severity: Warning, Summary: summary, Evidence: ev, Runbook: runbook(anchorInvalidNotDropped)})
}

// maxInvalidReasonsShown bounds the Services and reasons an invalid_not_dropped finding lists.
const maxInvalidReasonsShown = 5

// invalidReasons puts the window's INVALID packets by Service and reason in ev, most first, and
// returns the summary's clause for the Service of the most packets and its top reasons (",
// mostly for lab/web: 120 seq_over_window and 80 invalid_new packets,"), or "" when they are not
// known.
func invalidReasons(r *InvalidReasonFacts, ev *InvalidEvidence) string {
	switch {
	case r == nil:
		ev.ReasonsNotNamed = "conntrack's INVALID log is not read: --conntrack.invalid-reasons names the Services and reasons"
		return ""
	case r.Err != "":
		ev.ReasonsNotNamed = r.Err
		return ""
	}
	counts := slices.Clone(r.Counts)
	slices.SortStableFunc(counts, func(a, b InvalidReasonCount) int {
		return cmp.Or(cmp.Compare(b.Packets, a.Packets), strings.Compare(a.Namespace, b.Namespace),
			strings.Compare(a.Name, b.Name), strings.Compare(a.Reason, b.Reason))
	})
	counts = slices.DeleteFunc(counts, func(c InvalidReasonCount) bool { return c.Packets == 0 })
	shown := counts[:min(len(counts), maxInvalidReasonsShown)]
	ev.ByServiceReason = shown
	ev.OtherLoggedPackets = r.Unlisted
	for _, c := range counts[len(shown):] {
		ev.OtherLoggedPackets += c.Packets
	}
	ev.LostLoggedPackets = r.Lost
	ev.SampledShare = math.Round(r.SampledShare*1000) / 1000
	if len(shown) == 0 {
		return ""
	}

	// The Service of the most packets (the first in counts' order among equals), and its two
	// top reasons.
	type svc struct{ namespace, name string }
	logged, bySvc := r.Unlisted, map[svc]uint64{}
	for _, c := range counts {
		logged += c.Packets
		bySvc[svc{c.Namespace, c.Name}] += c.Packets
	}
	top := svc{counts[0].Namespace, counts[0].Name}
	for _, c := range counts {
		if k := (svc{c.Namespace, c.Name}); bySvc[k] > bySvc[top] {
			top = k
		}
	}
	var reasons []string
	var name string
	for _, c := range counts {
		if c.Namespace == top.namespace && c.Name == top.name && len(reasons) < 2 {
			reasons = append(reasons, fmt.Sprintf("%d %s", c.Packets, c.Reason))
			name = c.service()
		}
	}
	unit := " packets"
	if bySvc[top] == 1 {
		unit = " packet"
	}
	// "mostly" only when that Service has more than half of what was logged.
	most := "mostly"
	if 2*bySvc[top] <= logged {
		most = "most often"
	}
	sampled := ""
	if r.SampledShare > 0 {
		sampled = fmt.Sprintf(" (logged in %.2g%% of the window: a sample)", 100*r.SampledShare)
	}
	return fmt.Sprintf(", %s for %s: %s%s%s,", most, name, strings.Join(reasons, " and "), unit, sampled)
}

func suffix(err string) string {
	if err == "" {
		return ""
	}
	return ": " + err
}

// onlyLocal is " from the local chain" (prep "from") when every one of count differences is in
// the local chain alone: the cluster chain agrees with the API, so only the traffic a Local
// traffic policy keeps on the node is affected, which the counts alone would not tell. In IPVS
// mode the local "chain" is the virtual servers that follow a Local traffic policy.
func onlyLocal(chains []string, count int, prep, mode string) string {
	if len(chains) == 0 || len(chains) != count {
		return ""
	}
	for _, c := range chains {
		if c != "local" {
			return ""
		}
	}
	if mode == "ipvs" {
		return " " + prep + " the virtual servers of the Local traffic policy"
	}
	return " " + prep + " the local chain"
}
