package iptlegacy

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/proxyhealth/proxyhealth/internal/memlimit"
	"github.com/proxyhealth/proxyhealth/internal/testsupport/prereq"
)

// memcgChildEnv tells a re-run test binary that it is the child TestKernelReadUnderMemoryCgroup
// started in a memory cgroup, and how to read: "derived" with the limit MaxTableBytesWithin
// gives from the cgroup's limit, "fixed" with DefaultMaxTableBytes, "measure" with no limit
// short of the table's size.
const memcgChildEnv = "PROXYHEALTH_TEST_MEMCG_CHILD"

// childFloorBytes is the floor MaxTableBytesWithin is given in the child (the exporter gives
// its own): the test binary's memory before a read, as its cgroup counts it, is under 2 MiB,
// 15 MiB with the race detector.
const childFloorBytes = 16 << 20

// A legacy table larger than a memory cgroup leaves room for is refused with ErrTableTooLarge
// under the limit MaxTableBytesWithin derives from the cgroup's limit, and the process lives
// on; the same table read under the fixed default limit gets the process killed by the
// cgroup's OOM killer (which shows the table really does not fit). With room enough, the
// read's peak, as the cgroup counts it, is within ReadPeakPerTableByte of the table's size.
func TestKernelReadUnderMemoryCgroup(t *testing.T) {
	if mode := os.Getenv(memcgChildEnv); mode != "" {
		memcgChild(t, mode)
		return
	}
	kernelTest(t)
	parent, v2, err := memlimit.Dir("/proc/self")
	if err != nil || parent == "" || v2 {
		prereq.Skipf(t, "needs a cgroup v1 memory hierarchy (memory cgroup %q, v2 %v): %v", parent, v2, err)
	}
	// kube-proxy's nat table in its two shapes, 40 MiB each: commented (about 19 KiB a Service
	// of 10 endpoints) and its large-cluster shape (about 10 KiB).
	for _, shape := range []struct {
		name  string
		rules string
	}{
		{"commented", kubeProxyNAT(2200)},
		{"large-cluster", largeClusterNAT(4000, 10)},
	} {
		t.Run(shape.name, func(t *testing.T) {
			inFreshNetns(t, func() { readUnderMemcg(t, parent, shape.rules, shape.name == "commented") })
		})
	}
}

// readUnderMemcg loads rules and reads them in children in memory cgroups below parent: the
// peak, and with tooLarge the refusal and the OOM kill.
func readUnderMemcg(t *testing.T, parent, rules string, tooLarge bool) {
	if !restore(t, false, rules) {
		return
	}
	info, err := ReadInfo(threadProc, false, "nat")
	if err != nil || info == nil {
		t.Errorf("ReadInfo: %v, %v", info, err)
		return
	}
	size := int64(info.Size)
	t.Logf("nat table: %.1f MiB", float64(size)/(1<<20))

	if tooLarge {
		// Room for the test binary and half the table.
		small := int64(childFloorBytes) + size/2
		out, state := runInMemcg(t, parent, "derived", small)
		if state == nil || !state.Exited() || state.ExitCode() != 0 || !strings.Contains(out, "read refused: ") {
			t.Errorf("derived limit under a %d MiB cgroup: %v; want the read refused and the process alive:\n%s", small>>20, state, out)
		}
		out, state = runInMemcg(t, parent, "fixed", small)
		if ws, ok := state.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
			t.Errorf("fixed %d MiB limit under a %d MiB cgroup: %v; want the process OOM-killed:\n%s", DefaultMaxTableBytes>>20, small>>20, state, out)
		}
	}

	out, state := runInMemcg(t, parent, "measure", childFloorBytes+3*size)
	if state == nil || !state.Exited() || state.ExitCode() != 0 {
		t.Errorf("read with room enough: %v:\n%s", state, out)
		return
	}
	var before, peak int64
	if i := strings.Index(out, "usage "); i < 0 {
		t.Errorf("no usage in the child's report:\n%s", out)
		return
	} else if _, err := fmt.Sscanf(out[i:], "usage %d peak %d", &before, &peak); err != nil {
		t.Errorf("child's report: %v:\n%s", err, out)
		return
	}
	perByte := float64(peak-before) / float64(size)
	t.Logf("read's peak: %.1f MiB over %.1f MiB before it, %.2f bytes a table byte (ReadPeakPerTableByte %.2f)",
		float64(peak-before)/(1<<20), float64(before)/(1<<20), perByte, ReadPeakPerTableByte)
	// The race detector's instrumentation makes the decoding's allocations larger (1.06-1.09
	// here, against 1.02-1.04): it gets a margin, the exporter's build does not.
	allowed := ReadPeakPerTableByte
	if raceEnabled {
		allowed += 0.1
	}
	if perByte > allowed {
		t.Errorf("a read took %.2f bytes a table byte, more than ReadPeakPerTableByte (%.2f; %.2f allowed in this build)", perByte, ReadPeakPerTableByte, allowed)
	}
}

// runInMemcg runs this test again in a new memory cgroup of limit bytes below parent, from the
// calling thread (so in its network namespace), and removes the cgroup after. It returns the
// child's output and how it ended.
func runInMemcg(t *testing.T, parent, mode string, limit int64) (string, *os.ProcessState) {
	t.Helper()
	dir := filepath.Join(parent, fmt.Sprintf("proxyhealth-test-%d-%s", os.Getpid(), mode))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Errorf("memory cgroup: %v", err)
		return "", nil
	}
	defer func() {
		if err := os.Remove(dir); err != nil {
			t.Errorf("removing memory cgroup %s: %v", dir, err)
		}
	}()
	// The memory and swap limit (when swap is accounted): a child that does not fit is killed,
	// not swapped out.
	for _, file := range []string{"memory.limit_in_bytes", "memory.memsw.limit_in_bytes"} {
		err := os.WriteFile(filepath.Join(dir, file), []byte(strconv.FormatInt(limit, 10)), 0)
		if err != nil && !(errors.Is(err, os.ErrNotExist) && file == "memory.memsw.limit_in_bytes") {
			t.Errorf("memory cgroup: %v", err)
			return "", nil
		}
	}
	// The shell joins the cgroup and then becomes the test binary: nothing of the child runs
	// outside it.
	cmd := exec.Command("sh", "-c", `echo $$ > "$0/tasks" && exec "$@"`, dir,
		os.Args[0], "-test.run=^TestKernelReadUnderMemoryCgroup$", "-test.v")
	cmd.Env = append(os.Environ(), memcgChildEnv+"="+mode, "PROXYHEALTH_TEST_MEMCG_DIR="+dir)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Errorf("running the child: %v", err)
		return string(out), nil
	}
	return string(out), cmd.ProcessState
}

// memcgChild is the child's side: it reads the nat table of the namespace it was started in.
func memcgChild(t *testing.T, mode string) {
	dir := os.Getenv("PROXYHEALTH_TEST_MEMCG_DIR")
	mem, err := memlimit.Read("/proc/self")
	if err != nil {
		t.Fatal(err)
	}
	var lim Limits
	switch mode {
	case "derived":
		lim.MaxTableBytes = MaxTableBytesWithin(mem.Bytes, childFloorBytes)
	case "fixed":
		lim.MaxTableBytes = DefaultMaxTableBytes
	case "measure":
		lim.MaxTableBytes = mem.Bytes
	}
	t.Logf("cgroup memory limit %d (%s), read limit %d", mem.Bytes, mem.Source, lim.MaxTableBytes)
	before := cgroupValue(t, dir, "memory.usage_in_bytes")
	pt, err := ReadNAT("/proc/self", false, lim)
	switch {
	case errors.Is(err, ErrTableTooLarge):
		fmt.Printf("read refused: %v\n", err)
	case err != nil:
		t.Fatal(err)
	case pt == nil:
		t.Fatal("no kube-proxy table read")
	default:
		fmt.Printf("read %d services: usage %d peak %d\n", len(pt.Services), before, cgroupValue(t, dir, "memory.max_usage_in_bytes"))
	}
}

func cgroupValue(t *testing.T, dir, file string) int64 {
	b, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
