// Package kubeproxyrun is how the benchmarks run a real kube-proxy on their node: its command
// line. The iptables backend it writes with is test/kubelab's IPTablesShim, which the lab uses
// too.
package kubeproxyrun

import (
	"github.com/proxyhealth/proxyhealth/bench/internal/synthcluster"
)

// kube-proxy's metrics and health addresses, in the node's network namespace: its defaults,
// and where the exporter looks by default.
const (
	MetricsAddr = "127.0.0.1:10249"
	HealthzAddr = "127.0.0.1:10256"
)

// Args is kube-proxy's command line on synthcluster's node, in proxy mode mode (iptables or
// nftables), reaching the apiserver with kubeconfig. Args(...)[2:] leaves the kubeconfig out,
// for a report.
func Args(kubeconfig, mode string) []string {
	return []string{
		"--kubeconfig", kubeconfig,
		"--hostname-override", synthcluster.NodeName,
		"--proxy-mode", mode,
		"--cluster-cidr", synthcluster.ClusterCIDR,
		"--conntrack-max-per-core=0", // nf_conntrack_max cannot be set in a non-root namespace
		"--conntrack-tcp-timeout-established=0",
		"--conntrack-tcp-timeout-close-wait=0",
		"--metrics-bind-address", MetricsAddr,
		"--healthz-bind-address", HealthzAddr,
		"--v", "1",
	}
}
