// Package prereq is what a test does when the machine lacks something it needs (root, a
// network namespace, a tool, the control plane's binaries, podman, a browser): it skips, as on
// a developer's machine, or, under CI, fails. A CI run must not pass having run none of the
// kernel, lab, image or browser tests because a tool went missing.
package prereq

import (
	"fmt"
	"os"
)

// Env is the switch: set (to anything but "" or "0"), every missing prerequisite fails its
// test. .ci/run sets it; CI=true, which CI services set, does too.
const Env = "PROXYHEALTH_REQUIRE_ALL"

// Required reports whether a missing prerequisite fails the test.
func Required() bool {
	if v := os.Getenv(Env); v != "" && v != "0" {
		return true
	}
	return os.Getenv("CI") == "true"
}

// T is the part of testing.TB used here.
type T interface {
	Helper()
	Fatalf(format string, args ...any)
	Skipf(format string, args ...any)
}

// Skip skips t, saying what is missing, or fails it when Required.
func Skip(t T, args ...any) {
	t.Helper()
	Skipf(t, "%s", fmt.Sprint(args...))
}

// Skipf is Skip with a format.
func Skipf(t T, format string, args ...any) {
	t.Helper()
	if Required() {
		t.Fatalf("%s (a missing prerequisite fails the test under CI or %s)", fmt.Sprintf(format, args...), Env)
		return // for a T whose Fatalf returns
	}
	t.Skipf(format, args...)
}
