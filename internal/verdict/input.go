package verdict

import "time"

// Input is everything the engine judges: plain facts about this node, as the running exporter
// knows them from its collectors' last results and as `proxyhealth diagnose` reads them once.
// Counter facts are deltas over Window; a fact that could not be read is marked unknown (a nil
// pointer, or an Err saying why) and leads to a NotChecked entry, never to a finding.
type Input struct {
	// Node is this node's name in the API.
	Node string
	// Now is when the facts were gathered.
	Now time.Time
	// Window is the span the deltas cover (the exporter's --status.window, diagnose's
	// --window); a fact said to hold "throughout" held over all of it.
	Window time.Duration

	API       APIFacts
	Rules     RulesFacts
	KubeProxy KubeProxyFacts
	Kernel    KernelFacts
	Conntrack ConntrackFacts
}

// APIFacts are about the exporter's own view of the Kubernetes API.
type APIFacts struct {
	// Configured is false when no API is configured at all (no --kubeconfig, not in a
	// cluster, no $KUBECONFIG): kube-proxy's rules cannot be compared with anything.
	Configured bool
	// Fresh is true while the view is synced and recently heard from; drift is judged only
	// while it is.
	Fresh bool
	// LastHeard is when the view last heard from the API server; zero if never.
	LastHeard time.Time
	// Err is why the view is not fresh, when known.
	Err string
}

// RulesFacts are the drift check's: kube-proxy's programmed endpoints against the API.
type RulesFacts struct {
	// Checked is true once a comparison ran (or found nothing to compare, mode none) with
	// what it needed; false before the first check or when it could not read the rules.
	Checked bool
	// Err is why the check could not compare all it should (rules unreadable, no API, ...).
	Err string
	// Mode is kube-proxy's mode found from the node's rules: iptables, nftables, ipvs, none;
	// empty when unknown.
	Mode string
	// ServicesChecked is how many service ports were compared.
	ServicesChecked int
	// GracePeriod is how long a difference had to last before it counted: the exporter's
	// --rules.grace-period, or diagnose's --window.
	GracePeriod time.Duration
	// Drifting are the service ports whose rules differed from the API past GracePeriod.
	Drifting []DriftingPort
}

// DriftingPort is one service port whose programmed endpoints differ from the API's.
type DriftingPort struct {
	Service Service
	// Stale are endpoint addresses ("ip:port") in kube-proxy's rules but not in the API,
	// Missing the reverse; bounded lists (see StaleCount and MissingCount for the totals).
	Stale, Missing           []string
	StaleCount, MissingCount int
	// StaleIn and MissingFrom, alongside Stale and Missing, name the chains that hold each
	// stale endpoint without cause, or lack each missing one: "cluster", "local" or
	// "cluster+local" (each chain is compared with what it should hold). Nil when unknown.
	StaleIn, MissingFrom []string
	// StaleInServers and MissingFromServers, alongside Stale and Missing in IPVS mode, name
	// the virtual servers ("10.96.0.10:53/UDP") that hold each stale endpoint or lack each
	// missing one. Nil in the other modes.
	StaleInServers, MissingFromServers [][]string
	// ByFamily splits StaleCount and MissingCount by IP family, for the families that differ
	// (IPv4 first).
	ByFamily []FamilyDrift
	// Programmed and Expected are the distinct endpoints in the rules and in the API for
	// this node.
	Programmed, Expected int
	// Since is when its oldest current difference was first seen.
	Since time.Time
}

// KubeProxyFacts are about kube-proxy on this node: its metrics, health and log.
type KubeProxyFacts struct {
	// Checked is false when kube-proxy was not looked at (the collector is off, or has not
	// polled yet); Err then says why.
	Checked bool
	Err     string
	// Up is false only when its metrics endpoint did not answer throughout the window;
	// DownFor is then how long it has not answered, as far as is known.
	Up      bool
	DownFor time.Duration
	// DownReason is why it did not answer (the last poll's error).
	DownReason string
	// Healthy is kube-proxy's own verdict (/livez or /healthz); nil when not asked.
	Healthy *bool
	// LastSync is its last applied rules sync; zero when unknown.
	LastSync time.Time
	// SyncPending is how long a queued change has waited unapplied now (0 when none).
	SyncPending time.Duration
	// SyncFailing says its rule syncs are failing now: failed syncs counted with no sync
	// applied since the first of them. SyncFailures are those failed syncs, SyncFailingSince
	// when the first was seen, or its start when it has applied no sync since it started
	// (SyncNeverApplied: the node has none of its rules). SyncFailuresTotal is its own count
	// since it started.
	SyncFailing                     bool
	SyncFailures, SyncFailuresTotal uint64
	SyncFailingSince                time.Time
	SyncNeverApplied                bool
	// SyncFailingFamilies names the IP families whose syncs fail while another family's
	// apply (one proxier of a dual-stack kube-proxy); nil when all fail.
	SyncFailingFamilies []string
	// SyncTool is the tool that failed: "iptables-restore" (iptables and IPVS mode) or "nft"
	// (nftables mode); "" when unknown.
	SyncTool string
	// SyncError is the last failed sync's error as kube-proxy logged it (one line, bounded),
	// SyncErrorAt its time; empty when its log is not read or holds none.
	SyncError   string
	SyncErrorAt time.Time
	// Version is the version it reports (the git_version of its kubernetes_build_info, as
	// reported); "" when it reports none or was never heard.
	Version string

	// LogFiles are the log files followed (or read); empty when none was found.
	LogFiles []string
	// LogErr is why its log could not be read, if it could not.
	LogErr string
	// ListErrors are the reflector (list/watch) failures read from its log, per resource
	// and verb: Recent within ListErrorsSpan, Total since reading began.
	ListErrors     []ListErrorCount
	ListErrorsSpan time.Duration
	// LastListError is the time of the last failure read; zero when none.
	LastListError time.Time
}

// ListErrorCount is kube-proxy's list/watch failures of one resource and verb.
type ListErrorCount struct {
	Resource string `json:"resource"` // services, endpointslices, ...
	Verb     string `json:"verb"`     // list or watch
	Recent   uint64 `json:"recent"`
	Total    uint64 `json:"total"`
}

// KernelFacts are the node settings that decide incidents 1 and 2.
type KernelFacts struct {
	// BridgeNFCallIptables is net.bridge.bridge-nf-call-iptables: 1, 0, or -1 when
	// br_netfilter is not loaded; nil when unknown.
	BridgeNFCallIptables *int
	// TCPBeLiberal is net.netfilter.nf_conntrack_tcp_be_liberal; nil when unknown.
	TCPBeLiberal *int
	// ConntrackEvents is net.netfilter.nf_conntrack_events; nil when unknown.
	ConntrackEvents *int
	// InvalidDropRule tells whether a ctstate INVALID drop is reachable from the forward
	// path; nil when the rules could not be read. InvalidDropPath is the path to it.
	InvalidDropRule *bool
	InvalidDropPath string
	// Err is why some of these could not be read.
	Err string
	// RulesErr is why the forward path's rules could not be read.
	RulesErr string
}

// ConntrackFacts are the kernel's conntrack table and the Service flows followed.
type ConntrackFacts struct {
	// StatsErr is why the table's statistics could not be read; empty when they were.
	StatsErr string
	// Entries and Limit are the table's fill now.
	Entries, Limit uint64
	// Deltas of the kernel's per-CPU counters over the window.
	Invalid, InsertFailed, Drop, EarlyDrop uint64

	// FlowsErr is why Service flows could not be followed (the event listener is not
	// running, events are off); empty while they were, throughout the window.
	FlowsErr string
	// Unreplied are the Service flows that ended unreplied in the window, or are open and
	// unreplied now, per service port and reason.
	Unreplied []UnrepliedCount

	// InvalidReasons are the window's INVALID packets by Service and reason, from conntrack's
	// own log (--conntrack.invalid-reasons); nil when that log is not read.
	InvalidReasons *InvalidReasonFacts
}

// InvalidReasonFacts are what conntrack's INVALID log counted in the window.
type InvalidReasonFacts struct {
	// Err is why the log was not read throughout the window; empty while it was.
	Err string
	// Counts are the packets logged in the window per Service and reason (none of zero).
	Counts []InvalidReasonCount
	// Unlisted are the packets of Services beyond the per-service series cap, Lost those the
	// kernel logged that never reached the reader, in the window.
	Unlisted, Lost uint64
	// SampledShare is, when the log was read in windows (above
	// --conntrack.invalid-reasons.max-rate), the share of the window they cover; 0 when
	// every packet was read.
	SampledShare float64
}

// InvalidReasonCount is the INVALID packets of one Service and reason, labelled as the metric
// proxyhealth_conntrack_invalid_reason_packets_total is.
type InvalidReasonCount struct {
	// Namespace and Name are the Service whose address or endpoint the packets carried;
	// empty for packets of no Service.
	Namespace string `json:"service_namespace,omitempty"`
	Name      string `json:"service_name,omitempty"`
	// Reason is the kernel's reason, normalised: seq_over_window, tcp_flags, checksum, ...
	Reason  string `json:"reason"`
	Packets uint64 `json:"packets"`
}

// service names the packets' Service: "lab/web", or "no Service".
func (c InvalidReasonCount) service() string {
	if c.Name == "" {
		return "no Service"
	}
	return c.Namespace + "/" + c.Name
}

// UnrepliedCount is one service port's unreplied DNAT'ed flows of one reason.
type UnrepliedCount struct {
	// Service is the Service port targeted; its Name is empty for reason no_service.
	Service Service
	// Reason is where the endpoint was: same_bridge, local_endpoint, remote_endpoint,
	// no_service.
	Reason string
	// Ended is how many ended without a reply during the window; Open how many are open and
	// unreplied now (for longer than --conntrack.unreplied-after).
	Ended, Open uint64
}

// Unreplied-flow reasons, as the conntrack collector names them.
const (
	ReasonSameBridge     = "same_bridge"
	ReasonLocalEndpoint  = "local_endpoint"
	ReasonRemoteEndpoint = "remote_endpoint"
	ReasonNoService      = "no_service"
)

// Int and Bool return a pointer to v, for the optional facts.
func Int(v int) *int    { return &v }
func Bool(v bool) *bool { return &v }
