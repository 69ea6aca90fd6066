//go:build e2e

package e2e

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/proxyhealth/proxyhealth/internal/testsupport/metricsref"
)

// readmeReference reads the metrics reference, docs/metrics.md.
func readmeReference(t *testing.T) map[string]metricsref.Metric {
	t.Helper()
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(filepath.Join(root, "docs", "metrics.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ref, err := metricsref.Parse(f)
	if err != nil {
		t.Fatal(err)
	}
	return ref
}

// testScrapeMatchesReadme checks every proxyhealth_ family of a real scrape against docs/metrics.md:
// the type the exporter really sends, and the label names of every series.
func testScrapeMatchesReadme(t *testing.T, s Scrape) {
	ref := readmeReference(t)
	seen := checkScrapeSignatures(t, s, ref)
	// The lab has driven every path of the node-local collectors: every documented family must
	// have appeared but those that only exist in some states: the overflow series (the cap is
	// not reached), the open-flow gauge (no flow is open by now; the incident tests saw it), and
	// what needs an API server or a drifting service (the control-plane scenarios see those).
	conditional := map[string]bool{
		openUnreplied:                                  true,
		"proxyhealth_service_drift_endpoints":          true,
		"proxyhealth_api_last_heard_timestamp_seconds": true,
		// From kube-proxy's own metrics and log: the kernel lab runs no kube-proxy.
		"proxyhealth_kubeproxy_last_list_error_timestamp_seconds": true,
		"proxyhealth_kubeproxy_last_sync_age_seconds":             true,
		"proxyhealth_kubeproxy_sync_pending_seconds":              true,
		"proxyhealth_kubeproxy_endpoint_changes_pending":          true,
		"proxyhealth_kubeproxy_service_changes_pending":           true,
		"proxyhealth_kubeproxy_sync_failures_total":               true,
		"proxyhealth_kubeproxy_sync_failing_seconds":              true,
		"proxyhealth_kubeproxy_invalid_dropped_packets_total":     true,
		"proxyhealth_kubeproxy_healthy":                           true,
		"proxyhealth_kubeproxy_build_info":                        true,
		// Only with --web.kubernetes-auth: TestKubernetesAuth checks them.
		"proxyhealth_kubernetes_auth_requests_total":   true,
		"proxyhealth_kubernetes_auth_reviews_total":    true,
		"proxyhealth_kubernetes_auth_cache_hits_total": true,
		// Only with --conntrack.invalid-reasons: TestExporterInvalidReasons checks them.
		"proxyhealth_conntrack_invalid_reason_packets_total":       true,
		"proxyhealth_conntrack_invalid_reason_packets_lost_total":  true,
		"proxyhealth_conntrack_invalid_log_foreign_messages_total": true,
		"proxyhealth_conntrack_invalid_log_sampling":               true,
		"proxyhealth_conntrack_invalid_log_listened_seconds_total": true,
		// Served with --node-conditions only (TestVerdictStaleRules).
		"proxyhealth_node_condition_patches_total":      true,
		"proxyhealth_node_condition_last_patch_success": true,
		"proxyhealth_node_events_total":                 true,
		// Served with --node-report only (TestPluginKubernetesAuth, TestNodeReportAdmissionPolicy).
		"proxyhealth_node_report_writes_total": true,
		"proxyhealth_node_report_bytes":        true,
	}
	for name := range ref {
		if _, ok := s[name]; !ok && !strings.Contains(name, "_unlisted") && !conditional[name] {
			t.Errorf("%s is documented but was not in the scrape", name)
		}
	}
	t.Logf("%d proxyhealth_ families checked against docs/metrics.md", seen)
}

// checkScrapeSignatures checks every proxyhealth_ family of s against the metrics reference (docs/metrics.md):
// the type the exporter really sends, and the label names of every series. It returns how many
// families it checked.
func checkScrapeSignatures(t *testing.T, s Scrape, ref map[string]metricsref.Metric) int {
	t.Helper()
	if len(ref) == 0 {
		t.Fatal("no metrics reference found in docs/metrics.md")
	}
	seen := 0
	for name, fam := range s {
		if !strings.HasPrefix(name, "proxyhealth_") {
			continue
		}
		seen++
		typ := strings.ToLower(fam.GetType().String())
		for _, m := range fam.GetMetric() {
			got := typ + " {" + strings.Join(labelNames(m), ",") + "}"
			if doc, ok := ref[name]; !ok {
				t.Errorf("%s (%s) is exported but not documented in docs/metrics.md", name, got)
				break
			} else if want := doc.Signature(); got != want {
				t.Errorf("%s: exported as %s, docs/metrics.md says %s", name, got, want)
				break
			}
		}
	}
	return seen
}

func labelNames(m *dto.Metric) []string {
	var names []string
	for _, lp := range m.GetLabel() {
		names = append(names, lp.GetName())
	}
	sort.Strings(names)
	return names
}
