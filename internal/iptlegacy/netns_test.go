package iptlegacy

import (
	"errors"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/proxyhealth/proxyhealth/internal/nftnl/nftnltest"
	"github.com/proxyhealth/proxyhealth/internal/testsupport/prereq"
)

// TestMain re-runs the package's tests inside a new network namespace when it can (root and
// unshare(1) present), so that even a mistake in a kernel test changes rules only there.
func TestMain(m *testing.M) {
	nftnltest.ReexecInNetns()
	os.Exit(m.Run())
}

// threadProc is the procfs view of the calling thread's own network namespace, which is what
// the kernel tests pass as procPath: each runs on a thread moved to a namespace of its own.
const threadProc = "/proc/thread-self"

// kernelTest skips the test unless it runs in the namespace TestMain made and has
// iptables-legacy-restore.
func kernelTest(t testing.TB) {
	t.Helper()
	if !nftnltest.InNetns() {
		prereq.Skip(t, "needs root and unshare(1) to run in a network namespace of its own")
	}
	for _, bin := range []string{"iptables-legacy-restore", "ip6tables-legacy-restore", "iptables-legacy-save", "ip6tables-legacy-save"} {
		if _, err := exec.LookPath(bin); err != nil {
			prereq.Skipf(t, "%s not installed", bin)
		}
	}
}

// inFreshNetns runs fn on an OS thread moved into a new, empty network namespace: no legacy
// table exists there until fn loads one, and commands fn starts inherit the namespace. The
// thread is never handed back to the runtime (the goroutine exits locked), so it dies with the
// namespace.
func inFreshNetns(t testing.TB, fn func()) {
	t.Helper()
	kernelTest(t)
	done := make(chan struct{})
	var setupErr error
	go func() {
		defer close(done)
		runtime.LockOSThread()
		if setupErr = unix.Unshare(unix.CLONE_NEWNET); setupErr != nil {
			return
		}
		fn()
	}()
	<-done
	if setupErr != nil {
		t.Fatalf("unshare(CLONE_NEWNET): %v", setupErr)
	}
}

// restore loads iptables-save text with iptables-legacy-restore (ip6tables- for IPv6) into the
// calling thread's namespace. It reports failures with t.Error, since it runs off the test's
// goroutine; the caller checks the result.
func restore(t testing.TB, ipv6 bool, rules string) bool {
	t.Helper()
	bin := "iptables-legacy-restore"
	if ipv6 {
		bin = "ip6tables-legacy-restore"
	}
	cmd := exec.Command(bin)
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("%s: %v: %s", bin, err, out)
		return false
	}
	return true
}

// save runs iptables-legacy-save -t table (ip6tables- for IPv6) in the calling thread's
// namespace.
func save(t *testing.T, ipv6 bool, table string) (string, bool) {
	t.Helper()
	bin := "iptables-legacy-save"
	if ipv6 {
		bin = "ip6tables-legacy-save"
	}
	out, err := exec.Command(bin, "-t", table).Output()
	if err != nil {
		t.Errorf("%s -t %s: %v", bin, table, err)
		return "", false
	}
	return string(out), true
}

// tableNames reads the calling thread's legacy table list.
func tableNames(t *testing.T, ipv6 bool) string {
	t.Helper()
	file := threadProc + "/net/ip_tables_names"
	if ipv6 {
		file = threadProc + "/net/ip6_tables_names"
	}
	b, err := os.ReadFile(file)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Errorf("read %s: %v", file, err)
	}
	return strings.Join(strings.Fields(string(b)), " ")
}
