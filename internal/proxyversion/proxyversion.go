// Package proxyversion is kube-proxy's version as proxyhealth uses it: read from the
// git_version of kube-proxy's kubernetes_build_info, compared with the releases proxyhealth's
// model of kube-proxy is tested against, and asked which of kube-proxy's behaviours applies.
package proxyversion

import (
	"fmt"
	"regexp"
	"strconv"
)

// Version is a Kubernetes release's major and minor version. The zero Version is unknown:
// kube-proxy did not say, or was built without version information.
type Version struct {
	Major, Minor int
}

// The releases proxyhealth is tested against (the lab runs each: test/kubelab).
var (
	OldestTested = Version{1, 34}
	NewestTested = Version{1, 37}
)

// gitVersionRE matches a Kubernetes git version: "v1.37.2", "v1.34.4+k3s1",
// "v1.36.3-eks-1234", "v1.38.0-alpha.1", "v1.37" ("v" optional).
var gitVersionRE = regexp.MustCompile(`^v?(0|[1-9]\d{0,3})\.(0|[1-9]\d{0,3})(?:[.+-]|$)`)

// Parse reads a git version as kube-proxy reports it. A version that does not parse, and
// v0.0 (what a build without version information reports, "v0.0.0-master+$Format:%H$"), are
// not known: ok is false.
func Parse(gitVersion string) (v Version, ok bool) {
	m := gitVersionRE.FindStringSubmatch(gitVersion)
	if m == nil {
		return Version{}, false
	}
	major, _ := strconv.Atoi(m[1])
	minor, _ := strconv.Atoi(m[2])
	if major == 0 && minor == 0 {
		return Version{}, false
	}
	return Version{major, minor}, true
}

// Known reports whether v is a version, not the unknown one.
func (v Version) Known() bool { return v != Version{} }

// Before reports whether v is a known version older than o.
func (v Version) Before(o Version) bool {
	return v.Known() && (v.Major < o.Major || v.Major == o.Major && v.Minor < o.Minor)
}

// Tested reports whether v is within the tested releases.
func (v Version) Tested() bool {
	return v.Known() && !v.Before(OldestTested) && !NewestTested.Before(v)
}

// String is "v1.37", or "unknown".
func (v Version) String() string {
	if !v.Known() {
		return "unknown"
	}
	return fmt.Sprintf("v%d.%d", v.Major, v.Minor)
}

// TestedRange is "v1.34 to v1.37".
func TestedRange() string { return OldestTested.String() + " to " + NewestTested.String() }
