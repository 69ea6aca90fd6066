// Package kubeproxyrun is how the benchmarks run a real kube-proxy on their node: its command
// line, and the iptables backend it writes with.
package kubeproxyrun

import (
	"os"
	"os/exec"
	"path/filepath"

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

// IPTablesShim makes dir/iptables-<backend>, a directory of links named iptables,
// iptables-save, iptables-restore (and ip6tables-*) to the backend's (legacy or nft) binaries.
// kube-proxy runs the iptables binaries on its PATH: with this directory first on it, it
// writes with that backend, as the iptables-wrapper of kube-proxy's image chooses on a node.
func IPTablesShim(dir, backend string) (string, error) {
	shim := filepath.Join(dir, "iptables-"+backend)
	if err := os.MkdirAll(shim, 0o755); err != nil {
		return "", err
	}
	for _, fam := range []string{"iptables", "ip6tables"} {
		for _, suffix := range []string{"", "-save", "-restore"} {
			target, err := exec.LookPath(fam + "-" + backend + suffix)
			if err != nil {
				return "", err
			}
			if err := os.Symlink(target, filepath.Join(shim, fam+suffix)); err != nil {
				return "", err
			}
		}
	}
	return shim, nil
}
