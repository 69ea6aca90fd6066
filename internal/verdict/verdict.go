// Package verdict turns what proxyhealth knows about a node into findings: each names a cause
// from a fixed vocabulary, with a severity, the Service port it concerns (if any), a one-sentence
// summary, structured evidence and a runbook link. Causes that explain each other are told once:
// stale rules explained by kube-proxy's failing list/watch is one stale_rules finding per
// service port whose evidence carries the failures, not two findings.
//
// The engine is a pure function of an Input (plain facts), so that the running exporter
// (GET /status, the landing page) and the one-shot `proxyhealth diagnose` judge alike.
package verdict

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Cause names why Service traffic on a node breaks, or would.
type Cause string

// The cause vocabulary. It is part of the /status schema: a cause is never renamed.
const (
	// StaleRules: kube-proxy's rules for a Service port differ from the API's endpoints for
	// this node past the grace period (incident 3). Critical, per service port.
	StaleRules Cause = "stale_rules"
	// KubeProxyWatchFailing: kube-proxy keeps failing to list or watch the API. Warning.
	KubeProxyWatchFailing Cause = "kube_proxy_watch_failing"
	// KubeProxyStuck: kube-proxy has left a queued change unapplied for minutes. Warning.
	KubeProxyStuck Cause = "kube_proxy_stuck"
	// KubeProxySyncFailing: kube-proxy keeps failing to apply its rules (iptables-restore,
	// the nftables transaction), so no change reaches them; a restart does not mend a cause
	// on the node. Critical when it has applied none since it started (the node has no
	// Service rules at all), else a warning.
	KubeProxySyncFailing Cause = "kube_proxy_sync_failing"
	// KubeProxyDown: kube-proxy's rules are on the node but kube-proxy does not answer.
	// Warning.
	KubeProxyDown Cause = "kube_proxy_down"
	// BridgeNetfilterOff: Service flows to endpoints on the client's own bridge end
	// unreplied while bridge-nf-call-iptables is off (incident 1). Critical.
	BridgeNetfilterOff Cause = "bridge_netfilter_off"
	// InvalidNotDropped: conntrack marks many packets INVALID and nothing drops them
	// (incident 2). Warning.
	InvalidNotDropped Cause = "invalid_not_dropped"
	// ConntrackTableFull: the table dropped or evicted flows (critical), or is nearly full
	// (warning).
	ConntrackTableFull Cause = "conntrack_table_full"
	// ConntrackInsertFailing: conntrack keeps failing to insert entries. Warning.
	ConntrackInsertFailing Cause = "conntrack_insert_failing"
	// APIViewStale: the exporter's own view of the API is stale, so drift is not checked.
	// Warning.
	APIViewStale Cause = "api_view_stale"
	// UnrepliedFlows: a Service port's connections end unreplied with no known cause on this
	// node (a symptom). Warning, per service port.
	UnrepliedFlows Cause = "unreplied_flows"
)

// Causes lists the vocabulary in the order findings of equal severity are told.
var Causes = []Cause{StaleRules, BridgeNetfilterOff, ConntrackTableFull, KubeProxySyncFailing, KubeProxyDown,
	KubeProxyStuck, KubeProxyWatchFailing, InvalidNotDropped, ConntrackInsertFailing, UnrepliedFlows, APIViewStale}

// Severity is how bad a finding is.
type Severity string

const (
	// Critical: Service traffic on the node is failing now, for a known cause.
	Critical Severity = "critical"
	// Warning: a fault that breaks, or will break, traffic less surely or less directly.
	Warning Severity = "warning"
)

// Verdict sums up a node: the one health model that /status, the landing page, the ProxyHealthy
// Node condition, `proxyhealth diagnose` and `kubectl proxyhealth` all tell, decided by Judge
// alone.
type Verdict string

// The verdicts, from the best to the worst (see Compare). Unknown ranks above WarningsOnly: a
// cause that could not be checked may be a critical one, so warnings are the whole story only
// when everything was checked; a critical finding is certain, whatever could not be checked.
const (
	// Healthy: no finding, and every cause was checked.
	Healthy Verdict = "healthy"
	// WarningsOnly: only warnings, and every cause was checked.
	WarningsOnly Verdict = "warning"
	// Unknown: no critical finding, but some cause could not be checked (NotChecked says
	// which, and why): the node is not known healthy. Also the verdict on a node that could
	// not be read at all.
	Unknown Verdict = "unknown"
	// CriticalFound: at least one critical finding.
	CriticalFound Verdict = "critical"
)

// Judge decides the verdict on a node from its findings and what could not be checked.
func Judge(findings []Finding, notChecked []NotChecked) Verdict {
	warned := false
	for _, f := range findings {
		if f.Severity == Critical {
			return CriticalFound
		}
		warned = true
	}
	for _, n := range notChecked {
		if len(n.Causes) > 0 {
			return Unknown
		}
	}
	if warned {
		return WarningsOnly
	}
	return Healthy
}

// The exit codes of `proxyhealth diagnose` and `kubectl proxyhealth`, one per verdict.
const (
	ExitHealthy  = 0
	ExitWarnings = 1
	ExitCritical = 2
	// ExitUnknown is also the code of a run that could not judge at all (usage, privileges,
	// the API, an exporter that could not be read).
	ExitUnknown = 3
)

// ExitCode is v for scripts; a verdict outside the vocabulary is Unknown's.
func (v Verdict) ExitCode() int {
	switch v {
	case Healthy:
		return ExitHealthy
	case WarningsOnly:
		return ExitWarnings
	case CriticalFound:
		return ExitCritical
	}
	return ExitUnknown
}

// Compare orders verdicts from the best to the worst: healthy, warning, unknown, critical (a
// verdict outside the vocabulary counts as unknown). The worst of several nodes is the fleet's.
func Compare(a, b Verdict) int { return cmp.Compare(a.rank(), b.rank()) }

func (v Verdict) rank() int {
	switch v {
	case Healthy:
		return 0
	case WarningsOnly:
		return 1
	case CriticalFound:
		return 3
	}
	return 2
}

// Service is a Service port, as the metrics' service labels name it.
type Service struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Port      uint16 `json:"port"`     // the Service's port number
	Protocol  string `json:"protocol"` // tcp, udp or sctp
	// PortName is the port's name in the Service, when known ("" for an unnamed port).
	PortName string `json:"port_name,omitempty"`
}

// String is "namespace/name:port/protocol", with the port's name when known:
// "kube-system/kube-dns:dns-tcp (53/tcp)".
func (s Service) String() string {
	port := strconv.Itoa(int(s.Port)) + "/" + s.Protocol
	if s.PortName != "" {
		return s.Namespace + "/" + s.Name + ":" + s.PortName + " (" + port + ")"
	}
	return s.Namespace + "/" + s.Name + ":" + port
}

// samePort reports whether s and o are the same Service port (the port's name aside).
func (s Service) samePort(o Service) bool {
	return s.Namespace == o.Namespace && s.Name == o.Name && s.Port == o.Port && s.Protocol == o.Protocol
}

// Finding is one named cause on the node.
type Finding struct {
	Cause    Cause    `json:"cause"`
	Severity Severity `json:"severity"`
	// Service is the Service port concerned; nil for a node-wide cause.
	Service *Service `json:"service"`
	// Summary is one sentence for the engineer.
	Summary string `json:"summary"`
	// Evidence is a JSON object of the facts behind the finding (counts, addresses, times);
	// its type depends on the cause (StaleRulesEvidence, ...).
	Evidence any `json:"evidence"`
	// Runbook links the section of docs/runbooks.md for the cause.
	Runbook string `json:"runbook"`
}

// NotChecked names causes that could not be judged, and why: a node with nothing found but
// something not checked is not known healthy.
type NotChecked struct {
	Causes []Cause `json:"causes"`
	Reason string  `json:"reason"`
}

// Report is the verdict on a node: the /status document.
type Report struct {
	Node string `json:"node"`
	// Verdict is Judge(Findings, NotChecked).
	Verdict Verdict   `json:"verdict"`
	Time    time.Time `json:"time"`
	// WindowSeconds is the span the counters were judged over.
	WindowSeconds float64      `json:"window_seconds"`
	Findings      []Finding    `json:"findings"`
	NotChecked    []NotChecked `json:"not_checked"`
	// Notes are what the engineer should know of how the node was judged that is neither a
	// finding nor a cause left unchecked: a kube-proxy version proxyhealth is not tested with.
	Notes []string `json:"notes,omitempty"`
}

// UncheckedCauses lists the causes that could not be checked, once each, in the report's order.
func (r Report) UncheckedCauses() []Cause {
	var out []Cause
	for _, n := range r.NotChecked {
		for _, c := range n.Causes {
			if !slices.Contains(out, c) {
				out = append(out, c)
			}
		}
	}
	return out
}

// RunbookBase is where the runbooks are published; a cause's runbook is an anchor in it, the
// same the alerts' runbook_url use.
const RunbookBase = "https://github.com/proxyhealth/proxyhealth/blob/main/docs/runbooks.md"

// Runbook anchors, as in alerts/proxyhealth.rules.yml (unreplied_flows has no alert).
const (
	anchorRulesStale         = "proxyhealthkubeproxyrulesstale"
	anchorListWatchFailing   = "proxyhealthkubeproxylistwatchfailing"
	anchorKubeProxyStuck     = "proxyhealthkubeproxystuck"
	anchorKubeProxyDown      = "proxyhealthkubeproxydown"
	anchorSyncFailing        = "proxyhealthkubeproxysyncfailing"
	anchorBridgeNetfilterOff = "proxyhealthbridgenetfilteroff"
	anchorInvalidNotDropped  = "proxyhealthinvalidpacketsnotdropped"
	anchorTableNearlyFull    = "proxyhealthconntracktablenearlyfull"
	anchorDroppingFlows      = "proxyhealthconntrackdroppingflows"
	anchorInsertFailing      = "proxyhealthconntrackinsertfailing"
	anchorAPIViewStale       = "proxyhealthapiviewstale"
	anchorUnrepliedFlows     = "unreplied-service-flows"
)

func runbook(anchor string) string { return RunbookBase + "#" + anchor }

// Thresholds are the engine's limits; DefaultThresholds match the shipped alerts.
type Thresholds struct {
	// InvalidPerSecond: INVALID packets per second above which undropped INVALID packets
	// are a finding (the alert's 1/s).
	InvalidPerSecond float64
	// InsertFailedPerSecond: failed inserts per second above which they are a finding
	// (the alert's 0.1/s).
	InsertFailedPerSecond float64
	// TableFullRatio: entries over the limit from which the table counts as nearly full.
	TableFullRatio float64
	// SyncPending: how long a queued change may wait before kube-proxy counts as stuck.
	SyncPending time.Duration
	// SyncFailures: failed syncs in a row (no sync applied since the first) that make
	// kube_proxy_sync_failing; one failure in a row still explains stale rules. kube-proxy
	// retries a failed sync, so 2 says the retry failed too.
	SyncFailures uint64
	// ListErrors: failures of one resource and verb within the span that make
	// kube_proxy_watch_failing (one failure still explains stale rules).
	ListErrors uint64
	// UnrepliedFlows: TCP or SCTP flows of one Service port (ended in the window plus open
	// now) that make an unreplied_flows finding.
	UnrepliedFlows uint64
	// MaxServiceFindings bounds the per-service findings of one cause; the rest are told in
	// one more finding of that cause without a service.
	MaxServiceFindings int
}

// DefaultThresholds are the thresholds of the shipped alerts.
var DefaultThresholds = Thresholds{
	InvalidPerSecond:      1,
	InsertFailedPerSecond: 0.1,
	TableFullRatio:        0.9,
	SyncPending:           2 * time.Minute,
	SyncFailures:          2,
	ListErrors:            3,
	UnrepliedFlows:        3,
	MaxServiceFindings:    50,
}

// Evaluate judges in with DefaultThresholds.
func Evaluate(in Input) Report { return DefaultThresholds.Evaluate(in) }

// Evaluate judges in: every rule, then the explanations (which cause folds which), then the
// verdict (Judge).
func (th Thresholds) Evaluate(in Input) Report {
	e := &evaluation{in: in, th: th}
	e.run()
	r := Report{
		Node:          in.Node,
		Time:          in.Now.UTC(),
		WindowSeconds: in.Window.Seconds(),
		Findings:      e.findings,
		NotChecked:    e.notCheckedList(),
		Notes:         e.notes(),
	}
	if r.Findings == nil {
		r.Findings = []Finding{}
	}
	slices.SortStableFunc(r.Findings, compareFindings)
	r.Verdict = Judge(r.Findings, r.NotChecked)
	return r
}

func compareFindings(a, b Finding) int {
	if c := cmp.Compare(severityRank(a.Severity), severityRank(b.Severity)); c != 0 {
		return c
	}
	if c := cmp.Compare(slices.Index(Causes, a.Cause), slices.Index(Causes, b.Cause)); c != 0 {
		return c
	}
	// A cause's findings with a service first, in the order the rule gave them (worst first).
	return cmp.Compare(boolRank(a.Service == nil), boolRank(b.Service == nil))
}

func severityRank(s Severity) int {
	if s == Critical {
		return 0
	}
	return 1
}

func boolRank(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Formatting shared by the summaries.

func formatTime(t time.Time) string { return t.UTC().Format(time.RFC3339) }

// FormatDuration rounds d for a sentence: 45s, 14m, 3h20m, 2d4h.
func FormatDuration(d time.Duration) string { return formatDuration(d) }

func formatDuration(d time.Duration) string {
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Round(time.Second)/time.Second))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Round(time.Minute)/time.Minute))
	case d < 48*time.Hour:
		d = d.Round(time.Minute)
		h, m := int(d/time.Hour), int(d%time.Hour/time.Minute)
		if m == 0 {
			return fmt.Sprintf("%dh", h)
		}
		return fmt.Sprintf("%dh%dm", h, m)
	default:
		d = d.Round(time.Hour)
		days, h := int(d/(24*time.Hour)), int(d%(24*time.Hour)/time.Hour)
		if h == 0 {
			return fmt.Sprintf("%dd", days)
		}
		return fmt.Sprintf("%dd%dh", days, h)
	}
}

func plural(n uint64, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return strconv.FormatUint(n, 10) + " " + many
}

// listServices names up to max services, then how many more.
func listServices(svcs []Service, max int) string {
	names := make([]string, 0, min(len(svcs), max)+1)
	for i, s := range svcs {
		if i == max {
			names = append(names, fmt.Sprintf("%d more", len(svcs)-max))
			break
		}
		names = append(names, s.String())
	}
	return strings.Join(names, ", ")
}

func secondsDuration(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
