package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

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
	nodes := readAll(context.Background(), pods, func(_ context.Context, p *corev1.Pod) ([]byte, error) { return bodies[p.Name], nil }, 2, time.Second)
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
