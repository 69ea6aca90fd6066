package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/proxyhealth/proxyhealth/internal/verdict"
)

// A node whose only finding is incident 2 names, read back from its /status, the Service of the
// most INVALID packets and its top reasons in the worst Service column.
func TestFleetTextNamesInvalidService(t *testing.T) {
	invalid := func(counts ...verdict.InvalidReasonCount) verdict.Finding {
		return verdict.Finding{Cause: verdict.InvalidNotDropped, Severity: verdict.Warning, Summary: "INVALID packets not dropped.",
			Evidence: &verdict.InvalidEvidence{InvalidPackets: 1200, WindowSeconds: 600, PerSecond: 2, ByServiceReason: counts}}
	}
	bodies := map[string][]byte{
		// Packets of no Service name none; lab/web has more than lab/api in all.
		"proxyhealth-a": statusBody(t, "worker-1", verdict.WarningsOnly, invalid(
			verdict.InvalidReasonCount{Reason: "checksum", Packets: 2000},
			verdict.InvalidReasonCount{Namespace: "lab", Name: "api", Reason: "checksum", Packets: 900},
			verdict.InvalidReasonCount{Namespace: "lab", Name: "web", Reason: "seq_over_window", Packets: 600},
			verdict.InvalidReasonCount{Namespace: "lab", Name: "web", Reason: "invalid_new", Packets: 500},
			verdict.InvalidReasonCount{Namespace: "lab", Name: "web", Reason: "tcp_flags", Packets: 63})),
		// Without conntrack's INVALID log the Services are not known.
		"proxyhealth-b": statusBody(t, "worker-2", verdict.WarningsOnly, invalid()),
	}
	pods := []corev1.Pod{pod("proxyhealth-a", "worker-1", corev1.PodRunning), pod("proxyhealth-b", "worker-2", corev1.PodRunning)}
	nodes := joinBodies(pods, bodies)
	var b bytes.Buffer
	if err := writeFleetText(&b, nodes); err != nil {
		t.Fatal(err)
	}
	want := `NODE      VERDICT  CAUSES               WORST SERVICE
worker-1  warning  invalid_not_dropped  lab/web: 1163 INVALID (seq_over_window, invalid_new)
worker-2  warning  invalid_not_dropped  -
`
	if got := b.String(); !strings.HasPrefix(got, want) {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
}

// The nodes' notes, which `proxyhealth diagnose` prints for one node, follow the table: each
// once, after the nodes that have it.
func TestFleetTextNotes(t *testing.T) {
	outside := "kube-proxy v1.33.2 is outside the versions proxyhealth is tested with (v1.34 to v1.37): stale rules may be misjudged where it picks endpoints differently."
	unplaced := `kube-proxy reports version "custom", which proxyhealth cannot place.`
	var pods []corev1.Pod
	bodies := map[string][]byte{}
	for i, notes := range [][]string{{outside}, {outside}, nil, {unplaced, outside}, {outside}, {outside}} {
		node := fmt.Sprintf("worker-%d", i+1)
		pods = append(pods, pod("proxyhealth-"+node, node, corev1.PodRunning))
		b, err := json.Marshal(verdict.Report{Node: node, Verdict: verdict.Healthy, Time: since, Findings: []verdict.Finding{},
			NotChecked: []verdict.NotChecked{}, Notes: notes})
		if err != nil {
			t.Fatal(err)
		}
		bodies["proxyhealth-"+node] = b
	}
	nodes := joinBodies(pods, bodies)
	sortNodes(nodes)
	var b bytes.Buffer
	if err := writeFleetText(&b, nodes); err != nil {
		t.Fatal(err)
	}
	want := `
6 nodes: 0 critical, 0 unknown (0 not read), 0 warning, 6 healthy

notes:
  worker-1, worker-2, worker-4 and 2 more: ` + outside + `
  worker-4: ` + unplaced + `
`
	if got := b.String(); !strings.HasSuffix(got, want) {
		t.Errorf("got:\n%s\nwant it to end:\n%s", got, want)
	}
}
