package promtext

import "testing"

func TestHasSeries(t *testing.T) {
	body := `# HELP proxyhealth_service_drift_endpoints x
proxyhealth_service_drift_endpoints{kind="missing",protocol="tcp",service_name="svc1",service_namespace="ns1",service_port="80"} 1
proxyhealth_service_drift_endpoints_other{service_name="svc2",service_namespace="ns2"} 1
`
	if !HasSeries(body, "proxyhealth_service_drift_endpoints", []string{`service_namespace="ns1"`, `service_name="svc1"`}) {
		t.Error("svc1's series not found")
	}
	if HasSeries(body, "proxyhealth_service_drift_endpoints", []string{`service_namespace="ns2"`, `service_name="svc2"`}) {
		t.Error("another metric's series taken for the drift series")
	}
	if HasSeries(body, "proxyhealth_service_drift_endpoints", []string{`service_namespace="ns1"`, `service_name="svc12"`}) {
		t.Error("svc12 matched svc1's series")
	}
}

// Value takes the largest sample of a name over its label sets, Sum their sum; other
// names, prefixes of them included, and unparsable values are left out.
func TestValueAndSum(t *testing.T) {
	body := `# HELP proxyhealth_netfilter_reads_total Reads.
proxyhealth_netfilter_reads_total{source="iptables-legacy"} 4
proxyhealth_netfilter_reads_total{source="nftables"} 7
proxyhealth_netfilter_reads_total_other 100
kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"} 1.7e+09
kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv6"} NaN-ish
`
	if got := Sum(body, "proxyhealth_netfilter_reads_total"); got != 11 {
		t.Errorf("Sum = %v, want 11", got)
	}
	if got, ok := Value(body, "proxyhealth_netfilter_reads_total"); !ok || got != 7 {
		t.Errorf("Value = %v, %v; want 7, true", got, ok)
	}
	if got, ok := Value(body, "kubeproxy_sync_proxy_rules_last_timestamp_seconds"); !ok || got != 1.7e9 {
		t.Errorf("Value = %v, %v; want 1.7e9, true", got, ok)
	}
	if _, ok := Value(body, "absent"); ok {
		t.Error("Value found an absent name")
	}
}
