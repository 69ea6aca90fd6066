package verdict

import "time"

// The evidence of each cause. Field names are part of the /status schema. Two fields recur:
// explained_by lists causes that explain this finding and are told in it rather than as
// findings of their own (stale_rules explained by kube_proxy_watch_failing); explains lists
// causes this finding accounts for (bridge_netfilter_off explains the same-bridge
// unreplied_flows).

// StaleRulesEvidence backs a stale_rules finding: one service port.
type StaleRulesEvidence struct {
	// Programmed and Expected are the distinct endpoints in kube-proxy's rules and in the
	// API for this node.
	Programmed int `json:"programmed"`
	Expected   int `json:"expected"`
	// MissingCount endpoints are in the API but not programmed, StaleCount programmed but
	// gone from the API; Missing and Stale list their addresses (at most 20 of each).
	MissingCount int      `json:"missing_count"`
	StaleCount   int      `json:"stale_count"`
	Missing      []string `json:"missing"`
	Stale        []string `json:"stale"`
	// MissingFrom and StaleIn, alongside Missing and Stale, name the port's chains that lack
	// each missing endpoint or hold each stale one: "cluster", "local" or "cluster+local".
	// An endpoint missing from the local chain only is cut off from the traffic a Local
	// traffic policy keeps on the node, though the cluster chain still holds it.
	MissingFrom []string `json:"missing_from,omitempty"`
	StaleIn     []string `json:"stale_in,omitempty"`
	// MissingFromVirtualServers and StaleInVirtualServers, alongside Missing and Stale in
	// kube-proxy's IPVS mode, name the virtual servers ("10.96.0.10:53/UDP") that lack each
	// missing endpoint or hold each stale one; MissingFrom and StaleIn then say which list
	// they follow (local: a Local traffic policy's).
	MissingFromVirtualServers [][]string `json:"missing_from_virtual_servers,omitempty"`
	StaleInVirtualServers     [][]string `json:"stale_in_virtual_servers,omitempty"`
	// ByFamily splits the counts by IP family, for each family whose endpoints differ (IPv4
	// first): on a dual-stack Service, which family's rules are stale.
	ByFamily []FamilyDrift `json:"by_family"`
	// Since is when the oldest current difference was first seen; a difference counts only
	// after GracePeriodSeconds.
	Since              time.Time `json:"since"`
	GracePeriodSeconds float64   `json:"grace_period_seconds"`
	ProxyMode          string    `json:"proxy_mode"`
	ExplainedBy        []Cause   `json:"explained_by"`
	// KubeProxy is kube-proxy's side of the story: its list/watch failures, last sync, health.
	KubeProxy *KubeProxyEvidence `json:"kube_proxy,omitempty"`
	// UnrepliedFlows are this service port's unreplied flows (the effect), when there are.
	UnrepliedFlows *FlowsEvidence `json:"unreplied_flows,omitempty"`
	Explains       []Cause        `json:"explains,omitempty"`
}

// FamilyDrift is one IP family's part of a service port's difference.
type FamilyDrift struct {
	Family       string `json:"family"` // IPv4 or IPv6
	MissingCount int    `json:"missing_count"`
	StaleCount   int    `json:"stale_count"`
}

// StaleRulesRestEvidence backs the one stale_rules finding that counts the drifting service
// ports beyond Thresholds.MaxServiceFindings.
type StaleRulesRestEvidence struct {
	ServicePorts int     `json:"service_ports"`
	MissingCount int     `json:"missing_count"`
	StaleCount   int     `json:"stale_count"`
	ExplainedBy  []Cause `json:"explained_by"`
}

// KubeProxyEvidence is what is known of kube-proxy; it backs kube_proxy_sync_failing,
// kube_proxy_watch_failing, kube_proxy_stuck and kube_proxy_down, and is part of stale_rules'
// evidence.
type KubeProxyEvidence struct {
	Up         bool   `json:"up"`
	DownReason string `json:"down_reason,omitempty"`
	// Healthy is its own verdict (/livez, /healthz); absent when not asked.
	Healthy            *bool     `json:"healthy,omitempty"`
	LastSync           time.Time `json:"last_sync,omitzero"`
	SyncPendingSeconds float64   `json:"sync_pending_seconds"`
	// ListErrors are the list/watch failures read from its log, recent ones within
	// ListErrorsSpanSeconds.
	ListErrors            []ListErrorCount `json:"list_errors"`
	ListErrorsSpanSeconds float64          `json:"list_errors_span_seconds"`
	LastListError         time.Time        `json:"last_list_error,omitzero"`
	LogFiles              []string         `json:"log_files"`
	// ProxyMode is kube-proxy's mode found from the node's rules.
	ProxyMode string `json:"proxy_mode,omitempty"`
	// SyncFailures are its failing rule syncs, while they fail.
	SyncFailures *SyncFailuresEvidence `json:"sync_failures,omitempty"`
	// APIView is the exporter's own view of the API, when it is stale too (the node's path
	// to the API server is then the likely cause).
	APIView  *APIEvidence `json:"exporter_api_view,omitempty"`
	Explains []Cause      `json:"explains,omitempty"`
}

// SyncFailuresEvidence is kube-proxy's failing rule syncs: part of the kube-proxy evidence of
// kube_proxy_sync_failing and of the stale_rules it explains.
type SyncFailuresEvidence struct {
	// Failed are the syncs failed in a row (no sync applied since the first), Since when the
	// first was seen, or kube-proxy's start when it has applied none since it started
	// (NeverApplied). Total is kube-proxy's own count since it started.
	Failed       uint64    `json:"failed"`
	Total        uint64    `json:"total"`
	Since        time.Time `json:"since,omitzero"`
	NeverApplied bool      `json:"never_applied"`
	// IPFamilies names the IP families whose syncs fail while the other's apply (a
	// dual-stack kube-proxy runs one proxier per family); empty when all fail.
	IPFamilies []string `json:"ip_families,omitempty"`
	// Tool is what failed: iptables-restore (iptables and IPVS mode) or nft (nftables mode).
	Tool string `json:"tool,omitempty"`
	// Error is the last failure's error as kube-proxy logged it (one line, at most 512 bytes),
	// ErrorAt when; ErrorNotRead says why there is none.
	Error        string    `json:"error,omitempty"`
	ErrorAt      time.Time `json:"error_at,omitzero"`
	ErrorNotRead string    `json:"error_not_read,omitempty"`
	// Remedy is what to do, from the error when it tells.
	Remedy string `json:"remedy"`
}

// APIEvidence backs api_view_stale.
type APIEvidence struct {
	Fresh     bool      `json:"fresh"`
	LastHeard time.Time `json:"last_heard,omitzero"`
	Error     string    `json:"error,omitempty"`
}

// FlowsEvidence counts a service port's unreplied flows; it backs unreplied_flows.
type FlowsEvidence struct {
	Service *Service `json:"service,omitempty"`
	// Ended without a reply during the window; Open and unreplied now.
	Ended         uint64        `json:"ended"`
	Open          uint64        `json:"open"`
	WindowSeconds float64       `json:"window_seconds"`
	ByReason      []ReasonCount `json:"by_reason"`
}

// ReasonCount is unreplied flows of one reason (where the endpoint was).
type ReasonCount struct {
	Reason string `json:"reason"`
	Ended  uint64 `json:"ended"`
	Open   uint64 `json:"open"`
}

// BridgeNetfilterEvidence backs bridge_netfilter_off.
type BridgeNetfilterEvidence struct {
	// BridgeNFCallIptables is the sysctl: 0, or -1 when br_netfilter is not loaded.
	BridgeNFCallIptables int `json:"bridge_nf_call_iptables"`
	// Ended and Open are the same-bridge unreplied flows over all services.
	Ended         uint64  `json:"ended"`
	Open          uint64  `json:"open"`
	WindowSeconds float64 `json:"window_seconds"`
	// Services are the Service ports hit, most flows first.
	Services []ServiceFlows `json:"services"`
	Explains []Cause        `json:"explains"`
}

// ServiceFlows is one service port's unreplied flows of one kind.
type ServiceFlows struct {
	Service Service `json:"service"`
	Ended   uint64  `json:"ended"`
	Open    uint64  `json:"open"`
}

// InvalidEvidence backs invalid_not_dropped.
type InvalidEvidence struct {
	InvalidPackets  uint64  `json:"invalid_packets"`
	WindowSeconds   float64 `json:"window_seconds"`
	PerSecond       float64 `json:"per_second"`
	TCPBeLiberal    int     `json:"tcp_be_liberal"`
	InvalidDropRule bool    `json:"invalid_drop_rule"`
	// ByServiceReason are, with --conntrack.invalid-reasons, the packets conntrack logged
	// INVALID in the window per Service and reason, most first (at most
	// maxInvalidReasonsShown); OtherLoggedPackets counts the logged ones not listed (more
	// Services and reasons, and Services beyond the series cap), LostLoggedPackets those
	// that never reached the exporter.
	ByServiceReason    []InvalidReasonCount `json:"by_service_reason,omitempty"`
	OtherLoggedPackets uint64               `json:"other_logged_packets,omitempty"`
	LostLoggedPackets  uint64               `json:"lost_logged_packets,omitempty"`
	// SampledShare is the share of the window the logged counts cover when the log was read
	// in windows under a flood; absent when every packet was read.
	SampledShare float64 `json:"sampled_share,omitempty"`
	// ReasonsNotNamed says why the Services and reasons are not named, when they are not.
	ReasonsNotNamed string `json:"reasons_not_named,omitempty"`
}

// TableEvidence backs conntrack_table_full.
type TableEvidence struct {
	Entries       uint64  `json:"entries"`
	Limit         uint64  `json:"limit"`
	Fill          float64 `json:"fill"`
	Drop          uint64  `json:"drop"`
	EarlyDrop     uint64  `json:"early_drop"`
	WindowSeconds float64 `json:"window_seconds"`
}

// InsertEvidence backs conntrack_insert_failing.
type InsertEvidence struct {
	InsertFailed  uint64  `json:"insert_failed"`
	WindowSeconds float64 `json:"window_seconds"`
	PerSecond     float64 `json:"per_second"`
}
