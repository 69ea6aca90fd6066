package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/proxyhealth/proxyhealth/internal/nodereport"
	"github.com/proxyhealth/proxyhealth/internal/verdict"
)

// The plugin's exit codes: the fleet's verdict's, as `proxyhealth diagnose`'s for one node.
const (
	exitHealthy   = verdict.ExitHealthy  // every node healthy
	exitWarnings  = verdict.ExitWarnings // only warnings, every node checked throughout
	exitCritical  = verdict.ExitCritical // a critical finding somewhere (whatever could not be read)
	exitCannotRun = verdict.ExitUnknown  // usage, the API, nothing found, or a node unknown: no report to believe, or not checked
)

// nodeStatus is one node: its report, or why there is none to believe.
type nodeStatus struct {
	Node string `json:"node"`
	// Pod is the node's exporter pod (namespace/name), "" when none was found.
	Pod string `json:"pod"`
	// Object is the node's report ConfigMap (namespace/name), "" when none was found.
	Object string          `json:"report,omitempty"`
	Report *verdict.Report `json:"status,omitempty"`
	Err    string          `json:"error,omitempty"`
}

// defaultHeartbeat is the exporters' --node-report.heartbeat-interval, for a report that does
// not say its own.
const defaultHeartbeat = 5 * time.Minute

// staleAfter is how old a report may be before it is not believed: two heartbeats missed,
// and a minute for the clocks of the node and the engineer's machine.
func staleAfter(heartbeat time.Duration) time.Duration {
	if heartbeat <= 0 {
		heartbeat = defaultHeartbeat
	}
	return 2*heartbeat + time.Minute
}

// join puts the node reports and the exporter pods together, one entry per node: its report
// when there is one to believe (read whole, at most limit bytes, and not older than
// staleAfter at now); otherwise why not: none written yet, none read, or one left by an
// exporter that stopped. A pod not yet Running says so.
func join(reports []corev1.ConfigMap, pods []corev1.Pod, limit int, now time.Time) []nodeStatus {
	byNode := map[string]*nodeStatus{}
	var out []*nodeStatus
	entry := func(node string) *nodeStatus {
		if n, ok := byNode[node]; ok {
			return n
		}
		n := &nodeStatus{Node: node}
		byNode[node] = n
		out = append(out, n)
		return n
	}
	for i := range reports {
		cm := &reports[i]
		node := reportNode(cm)
		n := entry(node)
		n.Object = cm.Namespace + "/" + cm.Name
		r, err := nodereport.Decode(cm, limit)
		switch {
		case err != nil:
			n.Err = fmt.Sprintf("report %s: %v", n.Object, err)
		case r.Report.Verdict == "":
			n.Err = fmt.Sprintf("report %s has no verdict", n.Object)
		case now.Sub(r.Report.Time) > staleAfter(r.Heartbeat):
			n.Err = fmt.Sprintf("report %s is %s old, written at %s (its exporter rewrites it every %s while it runs): the exporter stopped or cannot write it",
				n.Object, verdict.FormatDuration(now.Sub(r.Report.Time)), r.Report.Time.UTC().Format(time.RFC3339), verdict.FormatDuration(max(r.Heartbeat, 0)))
		default:
			rep := r.Report
			// Judged again from the findings and what was not checked, as the exporter judges.
			rep.Verdict = verdict.Judge(rep.Findings, rep.NotChecked)
			n.Report = &rep
		}
	}
	for i := range pods {
		pod := &pods[i]
		if pod.Spec.NodeName == "" {
			continue
		}
		n := entry(pod.Spec.NodeName)
		if n.Pod != "" && pod.DeletionTimestamp != nil {
			continue // a pod being replaced: the other one is the node's
		}
		n.Pod = pod.Namespace + "/" + pod.Name
		if n.Object != "" {
			continue
		}
		if reason := notRunning(pod); reason != "" {
			n.Err = reason
			continue
		}
		n.Err = "no report from exporter pod " + n.Pod + " yet (is it run with --node-report, and allowed to write ConfigMaps in its namespace?)"
	}
	nodes := make([]nodeStatus, 0, len(out))
	for _, n := range out {
		nodes = append(nodes, *n)
	}
	return nodes
}

// reportNode is the node a report ConfigMap is of: its owner Node's name, else what its name
// says.
func reportNode(cm *corev1.ConfigMap) string {
	for _, o := range cm.OwnerReferences {
		if o.Kind == "Node" && o.APIVersion == "v1" {
			return o.Name
		}
	}
	return strings.TrimPrefix(cm.Name, "proxyhealth-node-")
}

// notRunning says why a pod's exporter cannot be reporting, "" when it can.
func notRunning(pod *corev1.Pod) string {
	switch {
	case pod.DeletionTimestamp != nil:
		return "pod " + pod.Name + " is terminating"
	case pod.Status.Phase != corev1.PodRunning:
		phase := string(pod.Status.Phase)
		if phase == "" {
			phase = "Unknown"
		}
		return "pod " + pod.Name + " is " + phase + ", not Running"
	}
	return ""
}

// verdict is the node's verdict; unknown when its /status could not be read.
func (n nodeStatus) verdict() verdict.Verdict {
	if n.Report == nil {
		return verdict.Unknown
	}
	return n.Report.Verdict
}

// sortNodes orders rows worst first: critical, unknown (those not read before those not
// checked throughout), warning, healthy.
func sortNodes(nodes []nodeStatus) {
	slices.SortStableFunc(nodes, func(a, b nodeStatus) int {
		if c := verdict.Compare(b.verdict(), a.verdict()); c != 0 {
			return c
		}
		if c := cmp.Compare(boolRank(a.Report != nil), boolRank(b.Report != nil)); c != 0 {
			return c
		}
		if c := cmp.Compare(a.Node, b.Node); c != 0 {
			return c
		}
		return cmp.Compare(a.Pod, b.Pod)
	})
}

// causes lists a report's causes once each, worst first (the report's order).
func causes(r *verdict.Report) []string {
	var out []string
	for _, f := range r.Findings {
		if c := string(f.Cause); !slices.Contains(out, c) {
			out = append(out, c)
		}
	}
	return out
}

// worstService is the Service port of the worst finding that concerns one (findings come
// worst first), nil when none does.
func worstService(r *verdict.Report) *verdict.Service {
	for _, f := range r.Findings {
		if f.Service != nil {
			return f.Service
		}
	}
	return nil
}

func boolRank(b bool) int {
	if b {
		return 1
	}
	return 0
}

// fleetVerdict is the worst node's verdict (verdict.Compare): a critical finding anywhere is
// certain whatever could not be read or checked; otherwise a node not read, or not checked
// throughout, leaves the fleet unknown. No node at all is unknown too.
func fleetVerdict(nodes []nodeStatus) verdict.Verdict {
	if len(nodes) == 0 {
		return verdict.Unknown
	}
	worst := verdict.Healthy
	for _, n := range nodes {
		if verdict.Compare(n.verdict(), worst) > 0 {
			worst = n.verdict()
		}
	}
	return worst
}

// exitCode sums the nodes up for scripts: the fleet's verdict's exit code.
func exitCode(nodes []nodeStatus) int { return fleetVerdict(nodes).ExitCode() }

// staleRules is one node's stale_rules finding for one port of the Service asked about: its
// evidence as /status gives it, with the port and the summary.
type staleRules struct {
	Service verdict.Service `json:"service"`
	Summary string          `json:"summary"`
	verdict.StaleRulesEvidence
}

// serviceNode is one node's answer about a Service: its stale ports, or why it is not known.
type serviceNode struct {
	Node       string       `json:"node"`
	Pod        string       `json:"pod"`
	StaleRules []staleRules `json:"stale_rules"`
	// NotChecked says why stale rules could not be judged on the node, when they could not.
	NotChecked string `json:"not_checked,omitempty"`
	Err        string `json:"error,omitempty"`
}

// forService picks, for each node, its stale_rules findings for namespace/name.
func forService(nodes []nodeStatus, namespace, name string) ([]serviceNode, error) {
	out := make([]serviceNode, 0, len(nodes))
	for _, n := range nodes {
		sn := serviceNode{Node: n.Node, Pod: n.Pod, StaleRules: []staleRules{}, Err: n.Err}
		if n.Report != nil {
			for _, f := range n.Report.Findings {
				if f.Cause != verdict.StaleRules || f.Service == nil || f.Service.Namespace != namespace || f.Service.Name != name {
					continue
				}
				sr, err := decodeStale(f)
				if err != nil {
					return nil, fmt.Errorf("node %s: %w", n.Node, err)
				}
				sn.StaleRules = append(sn.StaleRules, sr)
			}
			sn.NotChecked = notCheckedReason(n.Report, verdict.StaleRules)
		}
		out = append(out, sn)
	}
	slices.SortStableFunc(out, func(a, b serviceNode) int {
		if c := cmp.Compare(serviceRank(a), serviceRank(b)); c != 0 {
			return c
		}
		return cmp.Compare(a.Node, b.Node)
	})
	return out, nil
}

func serviceRank(n serviceNode) int {
	switch {
	case len(n.StaleRules) > 0:
		return 0
	case n.Err != "" || n.NotChecked != "":
		return 1
	}
	return 2
}

func decodeStale(f verdict.Finding) (staleRules, error) {
	b, err := json.Marshal(f.Evidence)
	if err != nil {
		return staleRules{}, err
	}
	var ev verdict.StaleRulesEvidence
	if err := json.Unmarshal(b, &ev); err != nil {
		return staleRules{}, fmt.Errorf("stale_rules evidence for %s: %w", f.Service, err)
	}
	return staleRules{Service: *f.Service, Summary: f.Summary, StaleRulesEvidence: ev}, nil
}

func notCheckedReason(r *verdict.Report, cause verdict.Cause) string {
	for _, n := range r.NotChecked {
		if slices.Contains(n.Causes, cause) {
			return n.Reason
		}
	}
	return ""
}

// serviceExitCode: 2 when a node has stale rules for the Service, 3 when a node could not be
// read or judged, 0 otherwise.
func serviceExitCode(nodes []serviceNode) int {
	code := exitHealthy
	for _, n := range nodes {
		if len(n.StaleRules) > 0 {
			return exitCritical
		}
		if n.Err != "" || n.NotChecked != "" {
			code = exitCannotRun
		}
	}
	if len(nodes) == 0 {
		return exitCannotRun
	}
	return code
}
