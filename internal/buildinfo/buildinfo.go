// Package buildinfo fills github.com/prometheus/common/version's variables from the build
// information the Go toolchain records in every binary (runtime/debug.ReadBuildInfo), so that a
// plain `go build` or `go install` reports its version in --version, the start-up log and
// proxyhealth_build_info. A value set with -ldflags -X (make build) is kept.
//
// What Go records, and so what a build reports:
//
//   - the main module's version: the tag (v1.2.3) for `go install ...@v1.2.3`, and since Go 1.24
//     for a build in a git checkout too, or a pseudo-version (v0.0.0-20260102030405-abcdef123456)
//     between tags, with "+dirty" when the work tree has uncommitted changes; "(devel)" when
//     no VCS information was stamped (-buildvcs=false, a source tree without .git, a git
//     worktree, whose .git is a file the toolchain does not follow);
//   - the VCS revision and whether the tree was modified (vcs.revision, vcs.modified).
package buildinfo

import (
	"runtime/debug"

	"github.com/prometheus/common/version"
)

// Devel is the version Go records for a main module built without VCS information.
const Devel = "(devel)"

// Set fills version.Version and version.Revision from this binary's build information where
// they are empty (not set with -ldflags -X). Call it before the version is read, first thing in
// main.
func Set() {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		bi = nil
	}
	version.Version, version.Revision = Fill(version.Version, version.Revision, bi)
}

// Fill returns the version and revision to report: v and rev when set, else what bi says.
// The version is the main module's ("(devel)" when Go recorded none); the revision is the VCS
// revision with "-dirty" appended when the work tree had uncommitted changes, or "" when Go
// recorded none (prometheus/common then says "unknown").
func Fill(v, rev string, bi *debug.BuildInfo) (string, string) {
	if v == "" {
		v = Devel
		if bi != nil && bi.Main.Version != "" {
			v = bi.Main.Version
		}
	}
	if rev == "" && bi != nil {
		modified := false
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
		if rev != "" && modified {
			rev += "-dirty"
		}
	}
	return v, rev
}
