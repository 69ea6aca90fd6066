// Command proxyhealth is a Prometheus exporter that tells, per node, whether Service traffic is
// silently breaking: conntrack INVALID and unreplied flows, the kernel settings that decide the
// path, the drift between kube-proxy's rules and the API, and kube-proxy's own health (see
// docs/design.md).
package main

import (
	"os"

	"github.com/proxyhealth/proxyhealth/exporter"
)

func main() {
	os.Exit(exporter.Main(os.Args[1:]))
}
