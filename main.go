// Command proxyhealth is a Prometheus exporter that tells, per node, whether Service traffic is
// silently breaking: conntrack INVALID and unreplied flows, the kernel settings that decide the
// path, and (later) the drift between kube-proxy's rules and the API.
package main

import (
	"os"

	"github.com/proxyhealth/proxyhealth/exporter"
	"github.com/proxyhealth/proxyhealth/internal/buildinfo"
)

func main() {
	// The version from the build (module version, VCS revision) unless -ldflags set it.
	buildinfo.Set()
	os.Exit(exporter.Main(os.Args[1:]))
}
