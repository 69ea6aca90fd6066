package main

// UIDs are part of the contract: links, bookmarks and provisioning refer to them.
const (
	overviewUID = "proxyhealth-overview"
	nodeUID     = "proxyhealth-node"
)

// Files maps each committed file name (under dashboards/) to its dashboard.
func Files() map[string]*Dashboard {
	return map[string]*Dashboard{
		"proxyhealth-overview.json": Overview(),
		"proxyhealth-node.json":     Node(),
	}
}

// selector returns a function that puts the dashboard's label matchers on a metric.
func selector(matchers string) func(metric string) string {
	return func(metric string) string { return metric + "{" + matchers + "}" }
}

// rate is rate() over Grafana's $__rate_interval.
func rate(series string) string { return "rate(" + series + "[$__rate_interval])" }

const serviceLabels = "service_namespace, service_name, service_port, protocol"
const serviceLegend = "{{service_namespace}}/{{service_name}}:{{service_port}}/{{protocol}}"

// invalidReasonLegend names an INVALID reason series: "lab/web seq_over_window", or
// "/ checksum" for packets of no Service.
const invalidReasonLegend = "{{service_namespace}}/{{service_name}} {{reason}}"

func newDashboard(uid, title, description string, vars ...*Variable) *Dashboard {
	return &Dashboard{
		Description:  description,
		Editable:     false,
		GraphTooltip: 1,
		Links: []Link{{
			AsDropdown: false, IncludeVars: true, KeepTime: true, Tags: []string{"proxyhealth"},
			Title: "proxyhealth", Type: "dashboards",
		}},
		Panels:        []*Panel{},
		Refresh:       "30s",
		SchemaVersion: 39,
		Tags:          []string{"proxyhealth", "kubernetes", "kube-proxy", "conntrack"},
		Templating:    Templating{List: vars},
		Time:          TimeRange{From: "now-1h", To: "now"},
		Title:         title,
		UID:           uid,
		Version:       1,
	}
}

func datasourceVar() *Variable {
	return &Variable{
		Current:     Current{},
		Description: "The Prometheus that scrapes proxyhealth.",
		Label:       "Data source",
		Name:        "datasource",
		Options:     []any{},
		Query:       "prometheus",
		Refresh:     1,
		Type:        "datasource",
	}
}

func queryVar(name, label, query, description string, multi bool) *Variable {
	v := &Variable{
		Current:     Current{},
		Datasource:  &Datasource{Type: "prometheus", UID: "${datasource}"},
		Definition:  query,
		Description: description,
		Label:       label,
		Multi:       multi,
		IncludeAll:  multi,
		Name:        name,
		Options:     []any{},
		Query:       VariableQuery{Query: query, RefID: "PrometheusVariableQueryEditor-VariableQuery"},
		Refresh:     2, // on time range change
		Sort:        1,
		Type:        "query",
	}
	if multi {
		v.AllValue = ".+"
		v.Current = Current{Selected: true, Text: []string{"All"}, Value: []string{"$__all"}}
	}
	return v
}

// clusterVar is the cluster of a Prometheus holding several (Thanos, Mimir, federation), as
// kubernetes-mixin has it: single-valued, every selector carries cluster="$cluster". Where the
// series carry no cluster label (one Prometheus per cluster) it lists nothing, its value is
// empty, and cluster="" matches exactly those series.
func clusterVar() *Variable {
	return queryVar("cluster", "Cluster", "label_values(proxyhealth_build_info, cluster)",
		"The cluster, where one Prometheus holds several and labels their series cluster; empty otherwise.", false)
}

func jobVar() *Variable {
	return queryVar("job", "Job", `label_values(proxyhealth_build_info{cluster="$cluster"}, job)`,
		"The scrape job of the proxyhealth DaemonSet.", true)
}

// nodeVar lists the nodes of the selected cluster and jobs.
func nodeVar(description string, multi bool) *Variable {
	return queryVar("node", "Node", `label_values(proxyhealth_build_info{cluster="$cluster", job=~"$job"}, node)`, description, multi)
}

// Overview is the cluster-wide dashboard: which nodes and services are hit by the three
// incidents, and whether the exporters themselves can be trusted.
func Overview() *Dashboard {
	d := newDashboard(overviewUID, "proxyhealth / Cluster overview",
		"Service traffic silently breaking on Kubernetes nodes, cluster-wide: kube-proxy rules drifting from the API (incident 3), unreplied Service flows and INVALID packets (incidents 1 and 2), and the exporters' own health. Open proxyhealth / Node for one node.",
		datasourceVar(), clusterVar(), jobVar(),
		nodeVar("Kubernetes node names (the node label the PodMonitor sets from the pod's node).", true))
	m := selector(`cluster="$cluster", job=~"$job", node=~"$node"`)
	top := func(expr string) string { return "topk(20, " + expr + ")" }

	d.row("Summary")
	d.stat(4, "Nodes with drifting rules", "none",
		"Nodes where kube-proxy's programmed endpoints differ from the API for at least one Service port, past the exporter's grace period (incident 3). Anything above 0: look at the panels below for the service and the node, then at that node's kube-proxy log and its API connection; restarting kube-proxy re-lists the API.",
		nil, steps("green", 1, "red"),
		q{`count(max by (node) (` + m("proxyhealth_rules_services_drifted") + `) > 0) or vector(0)`, ""})
	d.stat(4, "Services drifting", "none",
		"Distinct Service ports that drift on at least one node (from the per-service series, which are capped per node; see 'beyond the series cap' below). A Service here sends part of its traffic to endpoints that are gone, or never to new ones.",
		nil, steps("green", 1, "red"),
		q{`count(count by (` + serviceLabels + `) (` + m("proxyhealth_service_drift_endpoints") + `)) or vector(0)`, ""})
	d.stat(4, "kube-proxy down or stuck", "none",
		"Nodes whose kube-proxy does not answer on its metrics endpoint, or holds a queued change unapplied for over 60 s. Either way the node's rules stop following the API: check the kube-proxy pod on those nodes.",
		nil, steps("green", 1, "red"),
		q{`count(` + m("proxyhealth_kubeproxy_up") + ` == 0 or ` + m("proxyhealth_kubeproxy_sync_pending_seconds") + ` > 60) or vector(0)`, ""})
	d.stat(4, "Nodes with a stale API view", "none",
		"Exporters whose own view of the API is not fresh: their drift check is withheld, so drift on those nodes would go unseen. Check the exporter's API connection (its log, RBAC, the apiserver).",
		nil, steps("green", 1, "orange"),
		q{`count(` + m("proxyhealth_api_view_fresh") + ` == 0) or vector(0)`, ""})
	d.stat(4, "Nodes with bridge netfilter off", "none",
		"Nodes with net.bridge.bridge-nf-call-iptables not 1 (or br_netfilter not loaded): Service connections to an endpoint on the client's own bridge hang there (incident 1). Load br_netfilter and set the sysctl to 1 on those nodes.",
		nil, steps("green", 1, "red"),
		q{`count(` + m("proxyhealth_bridge_nf_call_iptables") + ` != 1) or vector(0)`, ""})
	d.stat(4, "Exporters not scraped", "none",
		"proxyhealth targets Prometheus failed to scrape (up == 0). Those nodes report nothing, so every other panel is blind to them: check the DaemonSet's pods there.",
		nil, steps("green", 1, "red"),
		q{`count(` + m("up") + ` == 0) or vector(0)`, ""})

	d.row("Rules drift (incident 3)")
	d.timeseries(12, "Nodes drifting, by service", "none",
		"For each drifting Service port, on how many nodes kube-proxy's rules disagree with the API. One service on a few nodes: those nodes' kube-proxy lost its API connection (look at its list/watch errors below). Many services on one node: that node's kube-proxy is stuck.",
		q{`count by (` + serviceLabels + `) (max by (node, ` + serviceLabels + `) (` + m("proxyhealth_service_drift_endpoints") + `))`, serviceLegend})
	d.timeseries(12, "Stale and missing endpoints, by service", "none",
		"Endpoints summed over nodes: stale are programmed in a chain (cluster or local) that the API does not give them to, such as endpoints gone from the API (connections to them fail); missing are given to a chain by the API but not programmed there (they get no traffic from those nodes). Find the nodes in 'Drifting service ports by node'.",
		q{`sum by (` + serviceLabels + `, kind) (` + m("proxyhealth_service_drift_endpoints") + `)`, serviceLegend + " {{kind}}"})
	d.timeseries(12, "Drifting service ports by node (top 20)", "none",
		"Service ports whose rules drift, per node (the 20 nodes with most), and the drifting ports left out of the per-service series by the exporter's cap. Open the node in proxyhealth / Node to see which services and why.",
		q{top(`max by (node) (` + m("proxyhealth_rules_services_drifted") + `) > 0`), "{{node}}"},
		q{`sum(` + m("proxyhealth_rules_drift_unlisted") + `)`, "beyond the series cap (all nodes)"})
	d.timeseries(12, "Oldest drift by node (top 20)", "s",
		"How long the oldest current drift on each node has lasted. kube-proxy re-syncs fully once an hour; a drift older than that means kube-proxy no longer hears from the API: restart it and fix its connection.",
		q{top(`max by (node) (` + m("proxyhealth_rules_drift_age_seconds") + `) > 0`), "{{node}}"})

	d.row("kube-proxy")
	d.timeseries(8, "kube-proxy list/watch errors by resource", "cps",
		"Reflector failures in kube-proxy's logs, per second, summed over nodes, by resource and verb. Incident 3 began with 'Failed to list *v1.Service' while kube-proxy called itself healthy: errors for services or endpointslices mean its rules may be going stale. Note that a node's very first error shows as a new series, not a rise: see the next panel.",
		q{`sum by (resource, verb) (` + rate(m("proxyhealth_kubeproxy_list_errors_total")) + `)`, "{{resource}} {{verb}}"})
	d.timeseries(8, "Time since the last list/watch error (20 most recent nodes)", "s",
		"On the nodes whose kube-proxy logged a list/watch failure most recently, how long ago that was. A small value on many nodes points at the apiserver or the network to it; on a few nodes, at those nodes.",
		q{`bottomk(20, time() - max by (node) (` + m("proxyhealth_kubeproxy_last_list_error_timestamp_seconds") + `))`, "{{node}}"})
	d.timeseries(8, "kube-proxy state across nodes", "none",
		"Nodes whose kube-proxy does not answer its metrics endpoint, calls itself unhealthy, has held a queued change unapplied for more than 60 s, or whose every rule sync has failed for more than 2 minutes. Unhealthy is rare even when it is broken (incident 3 stayed green, and so does a kube-proxy whose restores all fail); a pending change is the sign of a stuck kube-proxy, failing syncs of a node that cannot take its rules (a kernel module it lacks: restarting kube-proxy does not help, see the ProxyHealthKubeProxySyncFailing runbook).",
		q{`count(` + m("proxyhealth_kubeproxy_up") + ` == 0) or vector(0)`, "down"},
		q{`count(` + m("proxyhealth_kubeproxy_healthy") + ` == 0) or vector(0)`, "unhealthy by its own verdict"},
		q{`count(` + m("proxyhealth_kubeproxy_sync_pending_seconds") + ` > 60) or vector(0)`, "change pending > 60s"},
		q{`count(` + m("proxyhealth_kubeproxy_sync_failing_seconds") + ` > 120) or vector(0)`, "syncs failing > 2m"})

	d.row("conntrack (incidents 1 and 2)")
	d.timeseries(12, "Unreplied Service flows by service and reason", "cps",
		"Service (DNAT'ed) flows that ended without a reply, per second, summed over nodes. same_bridge: client and endpoint on one bridge, the bridge netfilter is off on that node (incident 1); remote_endpoint/local_endpoint: the endpoint did not answer (gone, or blocked); no_service: a DNAT no Service owns. Open the node in proxyhealth / Node.",
		q{`sum by (` + serviceLabels + `, reason) (` + rate(m("proxyhealth_conntrack_unreplied_flows_total")) + `)`, serviceLegend + " {{reason}}"},
		q{`sum by (protocol, reason) (` + rate(m("proxyhealth_conntrack_unreplied_flows_unlisted_total")) + `)`, "services beyond the series cap {{protocol}} {{reason}}"})
	d.timeseries(12, "Open unreplied flows by service and reason", "none",
		"Service flows waiting for a reply longer than the exporter's --conntrack.unreplied-after right now, summed over nodes. A steady same_bridge count is incident 1 in progress.",
		q{`sum by (` + serviceLabels + `, reason) (` + m("proxyhealth_conntrack_open_unreplied_flows") + `)`, serviceLegend + " {{reason}}"},
		q{`sum by (protocol, reason) (` + m("proxyhealth_conntrack_open_unreplied_flows_unlisted") + `)`, "services beyond the series cap {{protocol}} {{reason}}"})
	d.timeseries(8, "INVALID packet rate by node (top 20)", "pps",
		"Packets conntrack marked INVALID, per node. Under load these are typically replies out of the TCP window; if nothing drops them they leave un-NATed and the client resets the connection (incident 2). On such a node check be_liberal and the INVALID drop rule in proxyhealth / Node.",
		q{top(`sum by (node) (` + rate(m("proxyhealth_conntrack_invalid_packets_total")) + `)`), "{{node}}"})
	d.timeseries(8, "Conntrack table fill by node (top 20)", "percentunit",
		"Entries in the conntrack table over its size (nf_conntrack_max), per node. A full table drops new flows (see the next panel): raise nf_conntrack_max or find what opens so many flows.",
		q{top(`max by (node) (` + m("proxyhealth_conntrack_entries") + ` / ` + m("proxyhealth_conntrack_entries_limit") + `)`), "{{node}}"})
	d.timeseries(8, "Conntrack drops and insert failures by node (top 20)", "cps",
		"Per node and second: packets dropped for want of a table entry, entries evicted early and entries that could not be inserted. Non-zero means new flows are failing on that node, usually a full table.",
		q{top(`sum by (node) (` + rate(m("proxyhealth_conntrack_drop_total")) + ` + ` + rate(m("proxyhealth_conntrack_early_drop_total")) + ` + ` + rate(m("proxyhealth_conntrack_insert_failed_total")) + `)`), "{{node}}"})
	d.timeseries(12, "Nodes with incident 1 or 2 settings", "none",
		"Nodes whose settings leave them open to incident 1 (bridge-nf-call-iptables not 1) or incident 2 (be_liberal 0 and no INVALID drop rule), and nodes where conntrack events are off, so unreplied flows go unseen.",
		q{`count(` + m("proxyhealth_bridge_nf_call_iptables") + ` != 1) or vector(0)`, "bridge-nf-call-iptables not 1"},
		q{`count(` + m("proxyhealth_conntrack_tcp_be_liberal") + ` == 0 and ` + m("proxyhealth_invalid_drop_rule_present") + ` == 0) or vector(0)`, "be_liberal 0 and no INVALID drop rule"},
		q{`count(` + m("proxyhealth_conntrack_events_setting") + ` == 0) or vector(0)`, "conntrack events off"})
	d.timeseries(12, "INVALID packets by reason and Service (top 20)", "pps",
		"With the exporter's --conntrack.invalid-reasons: packets conntrack marked INVALID, per second, summed over nodes, by the kernel's reason and the Service whose address or endpoint they carried (no Service: the node's own traffic, or ports not mapped). seq_over_window and the other window reasons on one Service, with nothing dropping them, are incident 2: that Service's clients get reset. Empty without the flag.",
		q{top(`sum by (service_namespace, service_name, reason) (` + rate(m("proxyhealth_conntrack_invalid_reason_packets_total")) + `)`), invalidReasonLegend},
		q{`sum by (reason) (` + rate(m("proxyhealth_conntrack_invalid_reason_packets_unlisted_total")) + `)`, "services beyond the series cap {{reason}}"})

	d.row("Exporter health")
	d.timeseries(12, "Collector success", "percentunit",
		"Share of nodes on which each collector read everything it should in the last scrape. Below 100%: open the exporter's landing page (/) on a failing node, which says why (missing capability, no API, missing binaries).",
		q{`avg by (collector) (` + m("proxyhealth_collector_success") + `)`, "{{collector}}"})
	d.timeseries(12, "API view and drift check freshness (worst node)", "s",
		"The longest time since an exporter last heard from the API server, and since a drift check last ran. While the API view is not fresh the drift check is withheld: a node here with a large value cannot report incident 3.",
		q{`max(time() - ` + m("proxyhealth_api_last_heard_timestamp_seconds") + `)`, "since the API was last heard"},
		q{`max(time() - ` + m("proxyhealth_rules_last_check_timestamp_seconds") + `)`, "since the last drift check"})
	return d
}

// Node is the drill-down: every collector of one node, its settings first.
func Node() *Dashboard {
	d := newDashboard(nodeUID, "proxyhealth / Node",
		"Everything proxyhealth knows about one node: the settings that decide incidents 1 and 2, kube-proxy's state, its rules against the API (incident 3), conntrack and the exporter's own health.",
		datasourceVar(), clusterVar(), jobVar(),
		nodeVar("The Kubernetes node to show (the node label the PodMonitor sets from the pod's node).", false))
	m := selector(`cluster="$cluster", job=~"$job", node="$node"`)

	d.row("Settings and kube-proxy")
	d.stat(4, "bridge-nf-call-iptables", "none",
		"net.bridge.bridge-nf-call-iptables. Off (or br_netfilter not loaded), replies between pods on one bridge bypass conntrack and Service connections to a same-node endpoint hang (incident 1). Fix: modprobe br_netfilter and sysctl -w net.bridge.bridge-nf-call-iptables=1.",
		words("1", "on", "green", "0", "off", "red", "-1", "br_netfilter not loaded", "red"), nil,
		q{`max(` + m("proxyhealth_bridge_nf_call_iptables") + `)`, ""})
	d.stat(4, "conntrack be_liberal", "none",
		"net.netfilter.nf_conntrack_tcp_be_liberal. Off is safe only with an INVALID drop rule (next panel); off and no rule lets out-of-window replies escape un-NATed and reset connections (incident 2). Fix: set it to 1, or have the drop rule.",
		words("1", "on", "green", "0", "off", "text"), nil,
		q{`max(` + m("proxyhealth_conntrack_tcp_be_liberal") + `)`, ""})
	d.stat(4, "INVALID drop rule", "none",
		"Whether a conntrack INVALID DROP rule is reachable from the forward path (iptables legacy or nft, or native nftables). kube-proxy's iptables mode adds one when be_liberal is off at its start; its nftables mode adds none. Absent with be_liberal off: incident 2 can happen here.",
		words("1", "present", "green", "0", "absent", "orange"), nil,
		q{`max(` + m("proxyhealth_invalid_drop_rule_present") + `)`, ""})
	d.stat(4, "conntrack events", "none",
		"net.netfilter.nf_conntrack_events. Off, the kernel sends no conntrack events and unreplied Service flows cannot be seen on this node: set it to 1 or 2.",
		words("0", "off", "red", "1", "on", "green", "2", "on while listened", "green"), nil,
		q{`max(` + m("proxyhealth_conntrack_events_setting") + `)`, ""})
	mode := d.stat(4, "Proxy mode", "none",
		"kube-proxy's mode as found in the node's rules: iptables, nftables, ipvs (detected, not compared) or none (no kube-proxy rules, so no drift check and no Service attribution).",
		nil, nil,
		q{`max by (mode) (` + m("proxyhealth_proxy_mode") + ` == 1)`, "{{mode}}"})
	mode.Options["textMode"] = "name"
	d.stat(4, "Exporter's API view", "none",
		"Whether the exporter's own view of the API is fresh. Stale, the drift check is withheld and incident 3 cannot be seen: check the exporter's log, its RBAC and the apiserver.",
		words("1", "fresh", "green", "0", "stale", "red"), nil,
		q{`max(` + m("proxyhealth_api_view_fresh") + `)`, ""})
	d.stat(4, "kube-proxy up", "none",
		"Whether kube-proxy's metrics endpoint answered the exporter's last poll. Down: kube-proxy is not running, or listens elsewhere than --kubeproxy.metrics-url; the node's rules stop following the API.",
		words("1", "up", "green", "0", "down", "red"), nil,
		q{`max(` + m("proxyhealth_kubeproxy_up") + `)`, ""})
	d.stat(4, "kube-proxy healthy", "none",
		"kube-proxy's own verdict (/livez, or /healthz on old versions). It stayed healthy through incident 3, so green here proves little: compare with the drift and list errors below.",
		words("1", "healthy", "green", "0", "unhealthy", "red"), nil,
		q{`max(` + m("proxyhealth_kubeproxy_healthy") + `)`, ""})
	d.stat(4, "kube-proxy last sync age", "s",
		"Time since kube-proxy last applied its rules. A quiet node syncs about hourly, so an old sync alone is no fault; look at the pending change next to it.",
		nil, steps("text", 3900, "orange"),
		q{`max(` + m("proxyhealth_kubeproxy_last_sync_age_seconds") + `)`, ""})
	d.stat(4, "kube-proxy change pending", "s",
		"How long a change kube-proxy has queued has waited unapplied (0 when none). Growing past a minute: kube-proxy is stuck; its log says why, restart it.",
		nil, steps("green", 30, "orange", 60, "red"),
		q{`max(` + m("proxyhealth_kubeproxy_sync_pending_seconds") + `)`, ""})
	d.stat(4, "Service ports drifting", "none",
		"Service ports whose programmed endpoints differ from the API past the grace period (incident 3). Above 0: see the rules drift row below.",
		nil, steps("green", 1, "red"),
		q{`max(` + m("proxyhealth_rules_services_drifted") + `)`, ""})
	d.stat(4, "Conntrack table fill", "percentunit",
		"Entries in the conntrack table over its size. Near 100% new flows are dropped: raise nf_conntrack_max or find the flood.",
		nil, steps("green", 0.75, "orange", 0.9, "red"),
		q{`max(` + m("proxyhealth_conntrack_entries") + ` / ` + m("proxyhealth_conntrack_entries_limit") + `)`, ""})

	d.row("Rules drift (incident 3)")
	d.timeseries(12, "Drifting endpoints by service", "none",
		"Per drifting Service port: stale endpoints are programmed in a chain (cluster or local) that the API does not give them to, such as endpoints gone from the API (connections to them fail); missing ones are given to a chain by the API but not programmed there. kube-proxy on this node no longer follows the API: check its list/watch errors and its connection to the apiserver, then restart it.",
		q{`sum by (` + serviceLabels + `, kind) (` + m("proxyhealth_service_drift_endpoints") + `)`, serviceLegend + " {{kind}}"})
	d.timeseries(12, "Drift totals", "none",
		"The drift check's totals on this node: service ports drifted, stale and missing endpoints, drifting ports left out of the per-service series by the cap, and orphan chains (rules of Services the API no longer has, usually left by a stuck kube-proxy).",
		q{m("proxyhealth_rules_services_drifted"), "service ports drifted"},
		q{m("proxyhealth_rules_endpoints_stale"), "stale endpoints"},
		q{m("proxyhealth_rules_endpoints_missing"), "missing endpoints"},
		q{m("proxyhealth_rules_drift_unlisted"), "drifting ports beyond the series cap"},
		q{m("proxyhealth_rules_orphan_chains"), "orphan chains"})
	d.timeseries(6, "Service ports checked", "none",
		"Service ports compared in the last check; 0 while the exporter's API view is not fresh. A sudden drop to 0 means the check is withheld, not that all is well.",
		q{m("proxyhealth_rules_services_checked"), "checked"})
	d.timeseries(6, "Oldest drift", "s",
		"How long the oldest current drift has lasted (0 when none). Past an hour kube-proxy's full re-sync has not fixed it: it does not hear from the API.",
		q{m("proxyhealth_rules_drift_age_seconds"), "oldest drift"})
	d.timeseries(6, "Drift check timing", "s",
		"How long the last drift check took, and how long ago it ran. A check older than a few intervals means the exporter's background check is stuck; a long duration, a very large ruleset.",
		q{m("proxyhealth_rules_check_duration_seconds"), "duration"},
		q{`time() - ` + m("proxyhealth_rules_last_check_timestamp_seconds"), "since the last check"})
	d.timeseries(6, "Drift check errors and rules reads", "cps",
		"Per second: drift checks that could not read the rules or the API view (see the exporter's log), and reads of the node's netfilter tables by source (nf_tables is read when a change is committed, iptables-legacy when its size moved or kube-proxy synced; a steady high rate on a quiet node is churn elsewhere).",
		q{rate(m("proxyhealth_rules_check_errors_total")), "errors"},
		q{`sum by (source) (` + rate(m("proxyhealth_netfilter_reads_total")) + `)`, "reads {{source}}"})

	d.row("kube-proxy")
	d.timeseries(8, "kube-proxy list/watch errors by resource", "cps",
		"Reflector failures in kube-proxy's log per second, by resource and verb. Incident 3 started with 'Failed to list *v1.Service' while kube-proxy stayed healthy: errors for services or endpointslices mean its rules may be going stale (see the drift row).",
		q{`sum by (resource, verb) (` + rate(m("proxyhealth_kubeproxy_list_errors_total")) + `)`, "{{resource}} {{verb}}"})
	d.timeseries(8, "Time since the last list/watch error", "s",
		"How long ago kube-proxy last logged a list/watch failure (absent until one is read). Small and not growing: the failures go on.",
		q{`time() - ` + m("proxyhealth_kubeproxy_last_list_error_timestamp_seconds"), "since the last error"})
	d.timeseries(8, "kube-proxy sync", "s",
		"Time since kube-proxy last applied its rules, how long a queued change has waited unapplied, and how long its rule syncs have all failed. The sync age grows on a quiet node (it syncs hourly); a pending change that grows with no failing syncs is a stuck kube-proxy; failing syncs are a node that cannot take kube-proxy's rules (the verdict's kube_proxy_sync_failing has the error from kube-proxy's log; a restart does not help).",
		q{m("proxyhealth_kubeproxy_last_sync_age_seconds"), "since the last sync"},
		q{m("proxyhealth_kubeproxy_sync_pending_seconds"), "change pending"},
		q{m("proxyhealth_kubeproxy_sync_failing_seconds"), "syncs failing for"})
	d.timeseries(8, "kube-proxy pending changes", "none",
		"Endpoint and Service changes kube-proxy has received but not applied yet. Normally 0 between syncs; staying up goes with a stuck kube-proxy.",
		q{m("proxyhealth_kubeproxy_endpoint_changes_pending"), "endpoint changes"},
		q{m("proxyhealth_kubeproxy_service_changes_pending"), "service changes"})
	d.timeseries(8, "kube-proxy rule sync failures", "cps",
		"Rule syncs kube-proxy failed to apply (iptables-restore or nftables), per second. kube-proxy retries every sync period, so one failure a period is every sync failing: the node's rules no longer follow the API, and its log (and the verdict's kube_proxy_sync_failing) names the error, often a kernel module the node lacks. Restarting kube-proxy does not help.",
		q{rate(m("proxyhealth_kubeproxy_sync_failures_total")), "sync failures"})
	d.timeseries(8, "kube-proxy log files followed", "none",
		"kube-proxy log files the exporter follows. 0: it cannot see kube-proxy's list/watch errors; set --kubeproxy.log-path and mount the host's /var/log.",
		q{m("proxyhealth_kubeproxy_log_files_followed"), "files"})

	d.row("conntrack (incidents 1 and 2)")
	d.timeseries(12, "Unreplied Service flows by service and reason", "cps",
		"Service (DNAT'ed) flows that ended without a reply, per second. same_bridge: client and endpoint on one bridge with the bridge netfilter off (incident 1, see bridge-nf-call-iptables above); remote_endpoint/local_endpoint: the endpoint did not answer; no_service: a DNAT no Service owns.",
		q{`sum by (` + serviceLabels + `, reason) (` + rate(m("proxyhealth_conntrack_unreplied_flows_total")) + `)`, serviceLegend + " {{reason}}"},
		q{`sum by (protocol, reason) (` + rate(m("proxyhealth_conntrack_unreplied_flows_unlisted_total")) + `)`, "services beyond the series cap {{protocol}} {{reason}}"})
	d.timeseries(12, "Open unreplied flows by service and reason", "none",
		"Service flows waiting for a reply longer than --conntrack.unreplied-after right now. A steady same_bridge count is incident 1 in progress.",
		q{`sum by (` + serviceLabels + `, reason) (` + m("proxyhealth_conntrack_open_unreplied_flows") + `)`, serviceLegend + " {{reason}}"},
		q{`sum by (protocol, reason) (` + m("proxyhealth_conntrack_open_unreplied_flows_unlisted") + `)`, "services beyond the series cap {{protocol}} {{reason}}"})
	d.timeseries(8, "INVALID packets", "pps",
		"Packets conntrack marked INVALID, per second. Without be_liberal or an INVALID drop rule (see above) they leave un-NATed and clients reset their connections (incident 2).",
		q{rate(m("proxyhealth_conntrack_invalid_packets_total")), "marked INVALID"})
	d.timeseries(16, "INVALID packets by reason and Service", "pps",
		"With the exporter's --conntrack.invalid-reasons: packets conntrack marked INVALID and logged, per second, by the kernel's reason and the Service whose address or endpoint they carried (no Service: the node's own traffic, or ports not mapped); packets lost means the log outran the exporter. seq_over_window and the other window reasons on one Service, with nothing dropping them, are incident 2. Empty without the flag.",
		q{`sum by (service_namespace, service_name, reason) (` + rate(m("proxyhealth_conntrack_invalid_reason_packets_total")) + `)`, invalidReasonLegend},
		q{`sum by (reason) (` + rate(m("proxyhealth_conntrack_invalid_reason_packets_unlisted_total")) + `)`, "services beyond the series cap {{reason}}"},
		q{rate(m("proxyhealth_conntrack_invalid_reason_packets_lost_total")), "packets lost"})
	d.timeseries(8, "Conntrack table", "none",
		"Entries in the conntrack table and its size (nf_conntrack_max). When they meet, new flows are dropped.",
		q{m("proxyhealth_conntrack_entries"), "entries"},
		q{m("proxyhealth_conntrack_entries_limit"), "limit"})
	d.timeseries(8, "Drops and insert failures", "cps",
		"Per second: packets dropped because no entry could be created (a full table), entries evicted early to make room, and entries that could not be inserted. Non-zero: new flows fail on this node.",
		q{rate(m("proxyhealth_conntrack_drop_total")), "drop"},
		q{rate(m("proxyhealth_conntrack_early_drop_total")), "early drop"},
		q{rate(m("proxyhealth_conntrack_insert_failed_total")), "insert failed"})
	d.timeseries(8, "Conntrack events received", "cps",
		"Conntrack events the exporter receives per second, by kind. 0 with traffic on the node: events are off (see above) or the listener is failing.",
		q{`sum by (event) (` + rate(m("proxyhealth_conntrack_events_total")) + `)`, "{{event}}"})
	d.timeseries(8, "Event loss and tracking limits", "cps",
		"Per second: events the kernel dropped for the exporter's socket, receive errors, table re-reads that followed, and unreplied flows not followed because of the tracking cap. Sustained loss undercounts unreplied flows: raise --conntrack.socket-buffer-bytes or --conntrack.max-tracked-flows.",
		q{rate(m("proxyhealth_conntrack_events_lost_total")), "events lost"},
		q{rate(m("proxyhealth_conntrack_receive_errors_total")), "receive errors"},
		q{rate(m("proxyhealth_conntrack_table_resyncs_total")), "table re-reads"},
		q{rate(m("proxyhealth_conntrack_untracked_flows_total")), "flows not tracked (cap)"})
	d.timeseries(8, "Flows followed and Service ports known", "none",
		"Unreplied DNAT'ed flows followed now, and the Service ports flows can be attributed to. No Service ports known: every unreplied flow counts as no_service (no kube-proxy rules found).",
		q{m("proxyhealth_conntrack_tracked_flows"), "flows followed"},
		q{m("proxyhealth_conntrack_service_ports_known"), "Service ports known"})

	d.row("Exporter")
	d.timeseries(8, "Collector success", "bool",
		"Whether each collector read everything it should in the scrape. False: the exporter's landing page (/) says why (missing capability, no API, missing binaries).",
		q{`min by (collector) (` + m("proxyhealth_collector_success") + `)`, "{{collector}}"})
	d.timeseries(8, "Collector duration", "s",
		"How long each collector took during the scrape. Scrape-time work is kept cheap; a slow collector delays the whole scrape.",
		q{`max by (collector) (` + m("proxyhealth_collector_duration_seconds") + `)`, "{{collector}}"})
	d.timeseries(8, "Time since the API was last heard", "s",
		"How long ago the exporter's API view last heard from the API server. Past --api.fresh-within the view is stale and the drift check is withheld: check the exporter's connection to the apiserver.",
		q{`time() - ` + m("proxyhealth_api_last_heard_timestamp_seconds"), "since the API was last heard"})
	return d
}
