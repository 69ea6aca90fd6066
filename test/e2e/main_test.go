//go:build e2e

// Package e2e is proxyhealth's kernel lab: it builds network namespaces shaped like a
// Kubernetes node (bridge cni0, pods, a remote pod, kube-proxy's iptables rules), reproduces
// incidents 1 and 2 of docs/design.md on the real kernel, and asserts on the exporter's real
// scrape. Run as root: go test -tags e2e -count=1 -v ./test/e2e/
package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/proxyhealth/proxyhealth/internal/testsupport/prereq"
)

// nsPrefix names every namespace the lab creates; TestMain removes leftovers with it.
const nsPrefix = "ph-e2e-"

// binariesEnv names a directory that holds the lab's binaries (labtool, proxyhealth,
// kubectl-proxyhealth) built beforehand, for a run without a Go toolchain: the kernel
// matrix's guests (test/vm). Unset, TestMain builds them from this tree.
const binariesEnv = "PROXYHEALTH_E2E_BINARIES"

var (
	skipReason       string // non-empty: every lab test skips with it
	binDir           string
	labtoolBin       string
	exporterBin      string
	exporterBuildErr error // the exporter may be mid-change; only its scenarios fail then
	pluginBin        string
	pluginBuildErr   error
)

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	if os.Geteuid() != 0 {
		skipReason = "the kernel lab needs root (network namespaces, netfilter); run: sudo go test -tags e2e -count=1 -v ./test/e2e/"
		return m.Run()
	}
	for _, tool := range []string{"ip", "iptables-nft-restore", "iptables-nft", "nft", "conntrack", "sysctl", "setpriv"} {
		if _, err := exec.LookPath(tool); err != nil {
			skipReason = fmt.Sprintf("%s not found; install: apt-get install -y iptables nftables conntrack iproute2 procps util-linux", tool)
			return m.Run()
		}
	}
	removeLeftovers()

	if dir := os.Getenv(binariesEnv); dir != "" {
		return runWithBinaries(m, dir)
	}
	dir, err := os.MkdirTemp("", "ph-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	// The no-capability scenario runs the exporter as user 65534.
	if err := os.Chmod(dir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	binDir = dir
	root, err := repoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	labtoolBin = filepath.Join(dir, "labtool")
	if out, err := goBuild(root, labtoolBin, "-tags", "e2e", "./test/e2e/labtool"); err != nil {
		fmt.Fprintf(os.Stderr, "building labtool: %v\n%s", err, out)
		return 1
	}
	exporterBin = filepath.Join(dir, "proxyhealth")
	if out, err := goBuild(root, exporterBin, "github.com/proxyhealth/proxyhealth"); err != nil {
		exporterBuildErr = fmt.Errorf("building the exporter: %v\n%s", err, out)
		fmt.Fprintln(os.Stderr, exporterBuildErr)
	}
	pluginBin = filepath.Join(dir, "kubectl-proxyhealth")
	if out, err := goBuild(root, pluginBin, "./cmd/kubectl-proxyhealth"); err != nil {
		pluginBuildErr = fmt.Errorf("building kubectl-proxyhealth: %v\n%s", err, out)
		fmt.Fprintln(os.Stderr, pluginBuildErr)
	}
	return m.Run()
}

// runWithBinaries runs the tests with the binaries in dir, built as goBuild builds them. Without
// labtool or the exporter the run fails: whoever set binariesEnv meant them to be there. The
// plugin is needed by its own tests only, which fail without it.
func runWithBinaries(m *testing.M, dir string) int {
	binDir = dir
	labtoolBin = filepath.Join(dir, "labtool")
	exporterBin = filepath.Join(dir, "proxyhealth")
	for _, bin := range []string{labtoolBin, exporterBin} {
		if _, err := os.Stat(bin); err != nil {
			fmt.Fprintf(os.Stderr, "%s=%s: %v\n", binariesEnv, dir, err)
			return 1
		}
	}
	pluginBin = filepath.Join(dir, "kubectl-proxyhealth")
	if _, err := os.Stat(pluginBin); err != nil {
		pluginBuildErr = fmt.Errorf("%s=%s: %w", binariesEnv, dir, err)
	}
	return m.Run()
}

// goBuild builds as make build does, without cgo (the exporter raises its file capabilities in
// every thread, which a binary linked with cgo cannot) and with -trimpath (one build cache for
// both).
func goBuild(root, out string, args ...string) ([]byte, error) {
	cmd := exec.Command("go", append([]string{"build", "-trimpath", "-o", out}, args...)...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	return cmd.CombinedOutput()
}

// repoRoot is the module's root directory. Without a Go toolchain (a kernel matrix guest, whose
// payload mirrors the tree's layout) it is two directories up from the package's, where go
// test runs it.
func repoRoot() (string, error) {
	if _, err := exec.LookPath("go"); err != nil {
		return filepath.Abs("../..")
	}
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return filepath.Abs("../..")
	}
	return filepath.Dir(mod), nil
}

// creatorAlive reports whether the lab namespace ns ("ph-e2e-<pid>-<id>-<role>") belongs to a
// test process that is still running, which may be another run of the lab going on at the
// same time: its namespaces are not leftovers.
func creatorAlive(ns string) bool {
	pidPart, _, ok := strings.Cut(strings.TrimPrefix(ns, nsPrefix), "-")
	if !ok {
		return false
	}
	pid, err := strconv.Atoi(pidPart)
	if err != nil || pid <= 1 || pid == os.Getpid() {
		return false
	}
	return syscall.Kill(pid, 0) == nil
}

// removeLeftovers deletes namespaces a killed earlier run left behind, after ending the
// processes that run inside them (a lab's exporter and servers). Namespaces of a run that is
// still going are left alone.
func removeLeftovers() {
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(out), "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 || !strings.HasPrefix(fields[0], nsPrefix) {
			continue
		}
		ns := fields[0]
		if creatorAlive(ns) {
			continue
		}
		if pids, err := exec.Command("ip", "netns", "pids", ns).Output(); err == nil {
			for _, p := range strings.Fields(string(pids)) {
				if pid, err := strconv.Atoi(p); err == nil && pid > 1 {
					if proc, err := os.FindProcess(pid); err == nil {
						_ = proc.Kill()
					}
				}
			}
		}
		if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "removing leftover namespace %s: %v: %s\n", ns, err, out)
		} else {
			fmt.Fprintf(os.Stderr, "removed leftover namespace %s\n", ns)
		}
	}
}

// requireLab skips the test when the lab cannot run on this machine.
func requireLab(t *testing.T) {
	t.Helper()
	if skipReason != "" {
		prereq.Skip(t, skipReason)
	}
}

// requireExporter fails the test when the exporter did not build.
func requireExporter(t *testing.T) {
	t.Helper()
	requireLab(t)
	if exporterBuildErr != nil {
		t.Fatal(exporterBuildErr)
	}
}
