package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/proxyhealth/proxyhealth/internal/verdict"
)

// The plugin's exit codes: the fleet's verdict's, as `proxyhealth diagnose`'s for one node.
const (
	exitHealthy   = verdict.ExitHealthy  // every node healthy
	exitWarnings  = verdict.ExitWarnings // only warnings, every node checked throughout
	exitCritical  = verdict.ExitCritical // a critical finding somewhere (whatever could not be read)
	exitCannotRun = verdict.ExitUnknown  // usage, the API, no exporter found, or a node unknown: not read, or not checked
)

// nodeStatus is one exporter pod's node: its /status, or why it could not be read.
type nodeStatus struct {
	Node   string          `json:"node"`
	Pod    string          `json:"pod"` // namespace/name
	Report *verdict.Report `json:"status,omitempty"`
	Err    string          `json:"error,omitempty"`
}

// statusReader reads one pod's /status body.
type statusReader func(ctx context.Context, pod *corev1.Pod) ([]byte, error)

// readAll reads every pod's /status, at most parallel at a time, each within timeout. The
// result has one entry per pod, in pods' order.
func readAll(ctx context.Context, pods []corev1.Pod, read statusReader, parallel int, timeout time.Duration) []nodeStatus {
	out := make([]nodeStatus, len(pods))
	sem := make(chan struct{}, max(parallel, 1))
	var wg sync.WaitGroup
	for i := range pods {
		pod := &pods[i]
		out[i] = nodeStatus{Node: pod.Spec.NodeName, Pod: pod.Namespace + "/" + pod.Name}
		if reason := notReadable(pod); reason != "" {
			out[i].Err = reason
			continue
		}
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			rctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			body, err := read(rctx, pod)
			if err != nil {
				out[i].Err = err.Error()
				return
			}
			var rep verdict.Report
			if err := json.Unmarshal(body, &rep); err != nil {
				out[i].Err = fmt.Sprintf("decoding /status: %v", err)
				return
			}
			if rep.Verdict == "" {
				out[i].Err = "/status has no verdict: not a proxyhealth exporter, or one too old to serve /status"
				return
			}
			// The verdict is judged here as the exporter judges it, from the findings and what
			// was not checked: an exporter older than the one health model said "healthy" for
			// a node it could not check throughout (and "degraded", "broken").
			rep.Verdict = verdict.Judge(rep.Findings, rep.NotChecked)
			out[i].Report = &rep
			if out[i].Node == "" {
				out[i].Node = rep.Node
			}
		})
	}
	wg.Wait()
	return out
}

// notReadable says why a pod's /status cannot be asked for, "" when it can.
func notReadable(pod *corev1.Pod) string {
	switch {
	case pod.DeletionTimestamp != nil:
		return "pod " + pod.Name + " is terminating"
	case pod.Status.Phase != corev1.PodRunning:
		phase := string(pod.Status.Phase)
		if phase == "" {
			phase = "Unknown"
		}
		return "pod " + pod.Name + " is " + phase + ", not Running"
	case pod.Status.PodIP == "":
		return "pod " + pod.Name + " has no IP yet"
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

// podPort finds the pod's port to read /status on: port, a number or the name of a container
// port.
func podPort(pod *corev1.Pod, port string) (string, error) {
	if _, err := strconv.ParseUint(port, 10, 16); err == nil {
		return port, nil
	}
	for _, c := range pod.Spec.Containers {
		for _, p := range c.Ports {
			if p.Name == port {
				return strconv.Itoa(int(p.ContainerPort)), nil
			}
		}
	}
	return "", fmt.Errorf("pod %s has no container port named %q (--port)", pod.Name, port)
}
