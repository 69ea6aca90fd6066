package buildinfo

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/proxyhealth/proxyhealth/internal/testsupport/prereq"
)

func TestFill(t *testing.T) {
	vcs := func(rev, modified string) []debug.BuildSetting {
		return []debug.BuildSetting{
			{Key: "-trimpath", Value: "true"},
			{Key: "vcs", Value: "git"},
			{Key: "vcs.revision", Value: rev},
			{Key: "vcs.time", Value: "2026-01-02T03:04:05Z"},
			{Key: "vcs.modified", Value: modified},
		}
	}
	const hash = "29da2082a3d1f45b6738451c2addfd1e39e5b3ef"
	for _, tc := range []struct {
		name           string
		v, rev         string
		bi             *debug.BuildInfo
		wantV, wantRev string
	}{
		{"tagged", "", "", &debug.BuildInfo{Main: debug.Module{Version: "v1.2.3"}, Settings: vcs(hash, "false")}, "v1.2.3", hash},
		{"dirty", "", "", &debug.BuildInfo{Main: debug.Module{Version: "v0.0.0-20260102030405-29da2082a3d1+dirty"}, Settings: vcs(hash, "true")},
			"v0.0.0-20260102030405-29da2082a3d1+dirty", hash + "-dirty"},
		{"go install of a release: no VCS settings", "", "", &debug.BuildInfo{Main: debug.Module{Version: "v1.2.3"}}, "v1.2.3", ""},
		{"no VCS information", "", "", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "(devel)", ""},
		{"no build information", "", "", nil, "(devel)", ""},
		{"ldflags win", "1.0.0-rc.1", "abc", &debug.BuildInfo{Main: debug.Module{Version: "v1.2.3"}, Settings: vcs(hash, "true")}, "1.0.0-rc.1", "abc"},
		{"ldflags version only", "v9", "", &debug.BuildInfo{Main: debug.Module{Version: "v1.2.3"}, Settings: vcs(hash, "false")}, "v9", hash},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, rev := Fill(tc.v, tc.rev, tc.bi)
			if v != tc.wantV || rev != tc.wantRev {
				t.Fatalf("Fill(%q, %q) = %q, %q; want %q, %q", tc.v, tc.rev, v, rev, tc.wantV, tc.wantRev)
			}
		})
	}
}

// vcsProgram is a main package that reports the version as the exporter does (--version and
// proxyhealth_build_info read these variables and functions).
const vcsProgram = `package main

import (
	"fmt"

	"github.com/prometheus/common/version"
	"github.com/proxyhealth/proxyhealth/internal/buildinfo"
)

func main() {
	buildinfo.Set()
	fmt.Printf("version=%s\nrevision=%s\n", version.Version, version.GetRevision())
}
`

// TestBuildsInAGitCheckout builds a program that calls Set the way main does, with the plain
// go command in a fresh git repository, and reads what it reports: the pseudo-version and
// revision of the commit, the tag once there is one, the dirty flag, and that -ldflags -X wins.
func TestBuildsInAGitCheckout(t *testing.T) {
	if testing.Short() {
		t.Skip("builds programs")
	}
	for _, tool := range []string{"go", "git"} {
		if _, err := exec.LookPath(tool); err != nil {
			prereq.Skipf(t, "%s not found", tool)
		}
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	// A module under proxyhealth's path, so that it may import the internal package; its
	// requirements come from the module cache (the exporter's own, whose go.sum it copies).
	dir := t.TempDir()
	files := map[string]string{
		"go.mod": "module github.com/proxyhealth/proxyhealth/vcstest\n\ngo 1.26\n\n" +
			"require github.com/proxyhealth/proxyhealth v0.0.0\n\n" +
			"replace github.com/proxyhealth/proxyhealth => " + root + "\n",
		"go.sum":  string(sum),
		"main.go": vcsProgram,
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	env := append(os.Environ(),
		// GOPROXY=off would also turn off the main module's version from its tags.
		"GOFLAGS=-mod=mod", "GOPROXY=direct", "GONOSUMDB=*", "GOWORK=off",
		"GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1",
		"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com",
	)
	runEnv := func(env []string, name string, args ...string) string {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Dir, cmd.Env = dir, env
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
		return strings.TrimSpace(string(out))
	}
	run := func(name string, args ...string) string {
		t.Helper()
		return runEnv(env, name, args...)
	}
	build := func(ldflags string) map[string]string {
		t.Helper()
		args := []string{"build", "-buildvcs=true", "-trimpath", "-o", "prog"}
		if ldflags != "" {
			args = append(args, "-ldflags", ldflags)
		}
		run("go", append(args, ".")...)
		got := map[string]string{}
		for _, line := range strings.Split(run("./prog"), "\n") {
			k, v, _ := strings.Cut(line, "=")
			got[k] = v
		}
		return got
	}
	// tidy may need modules the exporter's build did not fetch (its dependencies' tests'
	// imports; `make vet`'s tidy fetches them, a first `go test` has not): from the proxy the
	// go command is configured with, the last value of a key in env being the one used.
	proxy := runEnv(os.Environ(), "go", "env", "GOPROXY")
	runEnv(append(env[:len(env):len(env)], "GOPROXY="+proxy), "go", "mod", "tidy")
	run("git", "init", "-q")
	if err := os.WriteFile(filepath.Join(dir, ".gitignore"), []byte("/prog\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	run("git", "add", ".")
	run("git", "commit", "-q", "-m", "first")
	head := run("git", "rev-parse", "HEAD")

	got := build("")
	pseudo := regexp.MustCompile(`^v0\.0\.0-\d{14}-` + head[:12] + `$`)
	if !pseudo.MatchString(got["version"]) || got["revision"] != head {
		t.Fatalf("untagged commit: got %v, want a pseudo-version of %s and its revision", got, head[:12])
	}

	run("git", "tag", "v1.2.3")
	if got := build(""); got["version"] != "v1.2.3" || got["revision"] != head {
		t.Fatalf("tagged commit: got %v, want v1.2.3 and %s", got, head)
	}

	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(vcsProgram+"\n// changed\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := build(""); got["version"] != "v1.2.3+dirty" || got["revision"] != head+"-dirty" {
		t.Fatalf("modified work tree: got %v, want v1.2.3+dirty and %s-dirty", got, head)
	}

	got = build("-X github.com/prometheus/common/version.Version=v7.0.0 -X github.com/prometheus/common/version.Revision=abc")
	if got["version"] != "v7.0.0" || got["revision"] != "abc" {
		t.Fatalf("-ldflags -X: got %v, want v7.0.0 and abc", got)
	}

	run("go", "build", "-buildvcs=false", "-o", "prog", ".")
	if got := strings.Split(run("./prog"), "\n"); got[0] != "version=(devel)" || got[1] != "revision=unknown" {
		t.Fatalf("-buildvcs=false: got %v, want (devel) and unknown", got)
	}
}
