package exporter

import (
	"errors"
	"os"
	"strings"
	"time"

	"github.com/proxyhealth/proxyhealth/collectors/conntrack"
	"github.com/proxyhealth/proxyhealth/collectors/kubeproxy"
	"github.com/proxyhealth/proxyhealth/collectors/node"
	"github.com/proxyhealth/proxyhealth/collectors/rules"
	"github.com/proxyhealth/proxyhealth/internal/cluster"
	"github.com/proxyhealth/proxyhealth/internal/hostrules"
	"github.com/proxyhealth/proxyhealth/internal/verdict"
)

// What the verdict reads of each collector; a nil one is a collector that is off. The
// collectors implement these (tests use fakes).
type (
	conntrackFacts interface {
		Stats() (conntrack.Stats, error)
		Flows() conntrack.Flows
		InvalidReasons() conntrack.InvalidReasons
	}
	nodeFacts      interface{ Settings() node.Settings }
	rulesFacts     interface{ LastCheck() rules.CheckSummary }
	kubeProxyFacts interface{ Status() kubeproxy.Status }
	apiFacts       interface {
		Snapshot() *cluster.Snapshot
		LastError() error
		Configured() bool
	}
	hostFacts interface{ State() *hostrules.State }
)

// factSources are where the verdict's facts come from: the running exporter's collectors, or
// those diagnose builds for one look.
type factSources struct {
	node      string
	conntrack conntrackFacts
	settings  nodeFacts
	rules     rulesFacts
	kubeproxy kubeProxyFacts
	api       apiFacts
	host      hostFacts
	now       func() time.Time
}

// sourcesOf picks the verdict's sources from the exporter's built collectors.
func sourcesOf(built *builtCollectors, nodeName string) *factSources {
	s := &factSources{node: nodeName, now: time.Now}
	// A collector switched off leaves its interface nil: the verdict reads it as such.
	for _, n := range built.named() {
		switch c := n.collector.(type) {
		case *conntrack.Collector:
			s.conntrack = c
		case *node.Collector:
			s.settings = c
		case *rules.Collector:
			s.rules = c
		case *kubeproxy.Collector:
			s.kubeproxy = c
		}
	}
	if built.api != nil {
		s.api = built.api
		if s.node == "" {
			s.node = built.api.NodeName()
		}
	}
	if built.host != nil {
		s.host = built.host
	}
	if s.node == "" {
		s.node, _ = os.Hostname()
	}
	return s
}

// factSample is one reading of the facts that change with time: counters and states whose
// history the verdict needs (deltas, "throughout").
type factSample struct {
	at       time.Time
	stats    conntrack.Stats
	statsErr error
	flows    conntrack.Flows
	invalid  conntrack.InvalidReasons
	kp       kubeproxy.Status
}

// sample reads the counters now. It waits on nothing but a netlink statistics query.
func (s *factSources) sample() factSample {
	fs := factSample{at: s.now()}
	if s.conntrack != nil {
		fs.stats, fs.statsErr = s.conntrack.Stats()
		fs.flows = s.conntrack.Flows()
		fs.invalid = s.conntrack.InvalidReasons()
	}
	if s.kubeproxy != nil {
		fs.kp = s.kubeproxy.Status()
	}
	return fs
}

// inputOptions are what the exporter and diagnose judge differently.
type inputOptions struct {
	// minDown is how long kube-proxy must not have answered before it counts as down: a
	// restart takes seconds (the exporter), or none when asked once (diagnose).
	minDown time.Duration
	// logScan, when set, is a one-shot read of kube-proxy's log (diagnose) used in place of
	// the follower's counts; logSpan is how far back it read.
	logScan *kubeproxy.LogScan
	logSpan time.Duration
}

// input builds the verdict's Input from samples, oldest first (at least one): the deltas are
// between the first and the last.
func (s *factSources) input(samples []factSample, o inputOptions) verdict.Input {
	first, last := samples[0], samples[len(samples)-1]
	in := verdict.Input{Node: s.node, Now: last.at, Window: last.at.Sub(first.at)}
	s.apiInput(&in)
	s.rulesInput(&in)
	s.kubeProxyInput(&in, samples, o)
	s.kernelInput(&in)
	s.conntrackInput(&in, samples)
	return in
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func (s *factSources) apiInput(in *verdict.Input) {
	if s.api == nil {
		in.API.Err = "no Kubernetes API view: the rules and conntrack collectors are off"
		return
	}
	snap := s.api.Snapshot()
	in.API = verdict.APIFacts{Configured: s.api.Configured(), Fresh: snap.Fresh, LastHeard: snap.LastHeard, Err: errString(s.api.LastError())}
	if in.API.Configured && !in.API.Fresh && in.API.Err == "" && !snap.Synced {
		in.API.Err = "the API view has not synced yet"
	}
}

func (s *factSources) rulesInput(in *verdict.Input) {
	if s.host != nil {
		if st := s.host.State(); st != nil {
			in.Rules.Mode = st.Mode
		}
	}
	if s.rules == nil {
		in.Rules.Err = "the rules collector is off (--no-collector.rules)"
		return
	}
	lc := s.rules.LastCheck()
	in.Rules.GracePeriod = lc.GracePeriod
	if lc.At.IsZero() {
		return // not compared yet
	}
	if lc.Mode != "" {
		in.Rules.Mode = lc.Mode
	}
	in.Rules.Checked = lc.Err == nil
	in.Rules.Err = errString(lc.Err)
	in.Rules.ServicesChecked = lc.Checked
	for _, d := range lc.Drifting {
		in.Rules.Drifting = append(in.Rules.Drifting, verdict.DriftingPort{
			Service: verdict.Service{Namespace: d.Name.Namespace, Name: d.Name.Name, Port: d.Port,
				Protocol: strings.ToLower(d.Name.Protocol), PortName: d.Name.Port},
			Stale:              addrStrings(d.Stale),
			Missing:            addrStrings(d.Missing),
			StaleCount:         d.StaleCount,
			MissingCount:       d.MissingCount,
			StaleIn:            chainNames(d.StaleIn),
			MissingFrom:        chainNames(d.MissingFrom),
			StaleInServers:     d.StaleInServers,
			MissingFromServers: d.MissingFromServers,
			ByFamily:           byFamily(d.StaleByFamily, d.MissingByFamily),
			Programmed:         d.Programmed,
			Expected:           d.Expected,
			Since:              d.Since,
		})
	}
}

func addrStrings[T interface{ String() string }](addrs []T) []string {
	out := make([]string, 0, len(addrs))
	for _, a := range addrs {
		out = append(out, a.String())
	}
	return out
}

func (s *factSources) kubeProxyInput(in *verdict.Input, samples []factSample, o inputOptions) {
	if s.kubeproxy == nil {
		in.KubeProxy.Err = "the kubeproxy collector is off (--no-collector.kubeproxy)"
		return
	}
	first, last := samples[0].kp, samples[len(samples)-1].kp
	if !last.Polled {
		in.KubeProxy.Err = "kube-proxy has not been asked yet"
		return
	}
	k := &in.KubeProxy
	k.Checked = true
	// Down: every poll since some time did not answer, for at least minDown.
	k.Up = true
	if !last.Up {
		downSince := last.At
		for i := len(samples) - 1; i >= 0; i-- {
			st := samples[i].kp
			if !st.Polled {
				continue
			}
			if st.Up {
				break
			}
			downSince = st.At
		}
		if last.At.Sub(downSince) >= o.minDown {
			k.Up, k.DownFor, k.DownReason = false, last.At.Sub(downSince), last.UpReason
		}
	}
	if last.HealthChecked {
		k.Healthy = verdict.Bool(last.Healthy)
	}
	k.LastSync = last.LastSync
	k.Version = last.Version
	if !last.PendingSince.IsZero() {
		k.SyncPending = max(0, in.Now.Sub(last.PendingSince))
	}

	syncFailuresInput(k, last, o)

	if o.logScan != nil {
		k.LogFiles, k.LogErr = o.logScan.Files, errString(o.logScan.Err)
		k.ListErrorsSpan, k.LastListError = o.logSpan, o.logScan.LastListError
		for _, l := range o.logScan.ListErrors {
			k.ListErrors = append(k.ListErrors, verdict.ListErrorCount{Resource: l.Resource, Verb: l.Verb, Recent: l.Count, Total: l.Count})
		}
		return
	}
	if !last.LogsRead {
		k.LogErr = "kube-proxy's log has not been read yet"
	}
	k.LogFiles, k.LastListError = last.LogFiles, last.LastListError
	if last.LogErr != nil {
		k.LogErr = last.LogErr.Error()
	}
	k.ListErrorsSpan = in.Window
	for _, l := range last.ListErrors {
		var before uint64
		for _, f := range first.ListErrors {
			if f.Resource == l.Resource && f.Verb == l.Verb {
				before = f.Count
			}
		}
		k.ListErrors = append(k.ListErrors, verdict.ListErrorCount{Resource: l.Resource, Verb: l.Verb, Recent: delta(before, l.Count), Total: l.Count})
	}
}

// syncFailuresInput takes kube-proxy's failing syncs: the poller's run of failures, and the
// last failure its log reported (the follower's, or diagnose's one-shot read).
func syncFailuresInput(k *verdict.KubeProxyFacts, last kubeproxy.Status, o inputOptions) {
	if !k.Up {
		return
	}
	k.SyncFailuresTotal, k.SyncTool = last.SyncFailures, last.SyncTool
	logged := last.LastSyncError
	if o.logScan != nil {
		logged = o.logScan.LastSyncError
	}
	if last.SyncFailing {
		k.SyncFailing, k.SyncFailures = true, last.FailingSyncs
		k.SyncFailingSince, k.SyncNeverApplied = last.FailingSince, last.SyncNeverApplied
		k.SyncFailingFamilies = last.FailingFamilies
	} else if last.SyncFailures > 0 && !logged.At.IsZero() && logged.At.After(last.LastSync) && !last.LastSync.IsZero() {
		// The polls saw no failure yet (a one-shot look shorter than kube-proxy's retry),
		// but its log shows one after its last applied sync: failing since then at least.
		k.SyncFailing, k.SyncFailures, k.SyncFailingSince = true, 1, logged.At
	}
	if k.SyncFailing && logged.Text != "" {
		k.SyncError, k.SyncErrorAt = logged.Text, logged.At
		if k.SyncTool == "" {
			k.SyncTool = logged.Tool
		}
	}
}

// delta is a counter's increase; a counter that went back was reset, and counts from 0.
func delta(before, after uint64) uint64 {
	if after < before {
		return after
	}
	return after - before
}

func (s *factSources) kernelInput(in *verdict.Input) {
	if s.settings == nil {
		in.Kernel.Err = "the node collector is off (--no-collector.node)"
		in.Kernel.RulesErr = in.Kernel.Err
		return
	}
	st := s.settings.Settings()
	in.Kernel = verdict.KernelFacts{
		BridgeNFCallIptables: st.BridgeNFCallIptables,
		TCPBeLiberal:         st.TCPBeLiberal,
		ConntrackEvents:      st.ConntrackEvents,
		InvalidDropRule:      st.InvalidDrop,
		InvalidDropPath:      st.InvalidDropPath,
		Err:                  errString(st.Err),
		RulesErr:             errString(st.RulesErr),
	}
}

var errEventsOff = errors.New("net.netfilter.nf_conntrack_events is 0: the kernel sends no conntrack events, so Service flows cannot be followed")

func (s *factSources) conntrackInput(in *verdict.Input, samples []factSample) {
	c := &in.Conntrack
	if s.conntrack == nil {
		c.StatsErr = "the conntrack collector is off (--no-collector.conntrack)"
		c.FlowsErr = c.StatsErr
		return
	}
	first, last := samples[0], samples[len(samples)-1]
	switch {
	case last.statsErr != nil:
		c.StatsErr = last.statsErr.Error()
	case first.statsErr != nil:
		c.StatsErr = first.statsErr.Error()
	default:
		c.Entries, c.Limit = last.stats.Entries, last.stats.Limit
		c.Invalid = delta(first.stats.Invalid, last.stats.Invalid)
		c.InsertFailed = delta(first.stats.InsertFailed, last.stats.InsertFailed)
		c.Drop = delta(first.stats.Drop, last.stats.Drop)
		c.EarlyDrop = delta(first.stats.EarlyDrop, last.stats.EarlyDrop)
	}
	c.InvalidReasons = invalidReasonsInput(samples)
	// Flows are judged only when they were followed throughout: a listener that failed in
	// the window may have missed some. One that had not started yet had counted nothing, so
	// only the last sample's says they are not followed.
	for i, sm := range samples {
		if sm.flows.Err != nil && (i == len(samples)-1 || !errors.Is(sm.flows.Err, conntrack.ErrNotListening)) {
			c.FlowsErr = sm.flows.Err.Error()
		}
	}
	if ev := in.Kernel.ConntrackEvents; ev != nil && *ev == 0 {
		c.FlowsErr = errEventsOff.Error()
	}
	if c.FlowsErr != "" {
		return
	}
	type key struct {
		ns, name string
		port     uint16
		proto    string
		reason   string
	}
	before := map[key]uint64{}
	for _, u := range first.flows.Unreplied {
		before[key{u.Namespace, u.Name, u.Port, u.Protocol, u.Reason}] = u.Ended
	}
	for _, u := range last.flows.Unreplied {
		ended := delta(before[key{u.Namespace, u.Name, u.Port, u.Protocol, u.Reason}], u.Ended)
		if ended+u.Open == 0 {
			continue
		}
		c.Unreplied = append(c.Unreplied, verdict.UnrepliedCount{
			Service: verdict.Service{Namespace: u.Namespace, Name: u.Name, Port: u.Port, Protocol: u.Protocol},
			Reason:  u.Reason, Ended: ended, Open: u.Open,
		})
	}
}

// byFamily is the verdict's per-family split of a drifting port's counts ([0] IPv4, [1] IPv6),
// for the families that differ.
func byFamily(stale, missing [2]int) []verdict.FamilyDrift {
	var out []verdict.FamilyDrift
	for i, family := range []string{"IPv4", "IPv6"} {
		if stale[i]+missing[i] > 0 {
			out = append(out, verdict.FamilyDrift{Family: family, StaleCount: stale[i], MissingCount: missing[i]})
		}
	}
	return out
}

// chainNames names each entry of chains ("cluster", "local", "cluster+local"); nil for none.
func chainNames(chains []rules.Chains) []string {
	if chains == nil {
		return nil
	}
	out := make([]string, len(chains))
	for i, c := range chains {
		out[i] = c.String()
	}
	return out
}
