// Command proxyhealth is a Prometheus exporter that tells, per node, whether Service traffic is
// silently breaking: conntrack INVALID and unreplied flows, the kernel settings that decide the
// path, the drift between kube-proxy's rules and the API, and kube-proxy's own health (see
// docs/design.md).
package main

import (
	"os"

	"github.com/proxyhealth/proxyhealth/exporter"
	"github.com/proxyhealth/proxyhealth/internal/buildinfo"
	"github.com/proxyhealth/proxyhealth/internal/capability"
)

func main() {
	// The version from the build (module version, VCS revision) unless -ldflags set it.
	buildinfo.Set()
	// The image's binary holds its capabilities in the permitted set only (a capability the
	// container lacks must not fail the exec): make them effective before any thread uses them.
	// What it could not raise, the start-up log says and the collectors that need it report.
	_, _ = capability.Raise()
	os.Exit(exporter.Main(os.Args[1:]))
}
