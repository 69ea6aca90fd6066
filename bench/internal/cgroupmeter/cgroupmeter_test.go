//go:build linux

package cgroupmeter

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/proxyhealth/proxyhealth/bench/internal/benchns"
	"github.com/proxyhealth/proxyhealth/internal/testsupport/prereq"
)

// A process started through Group.Wrap runs in both cgroups, with its own pid, and the
// cgroups' files read.
func TestCgroupWrap(t *testing.T) {
	if os.Geteuid() != 0 {
		prereq.Skip(t, "needs root")
	}
	if _, err := os.Stat(Root + "/cpuacct/cpuacct.usage"); err != nil {
		prereq.Skip(t, "no cgroup v1 cpuacct hierarchy")
	}
	cg, err := New("ph-bench-test-", "cg")
	if err != nil {
		prereq.Skip(t, err)
	}
	defer func() {
		if err := cg.Remove(); err != nil {
			t.Error(err)
		}
	}()
	ns := benchns.NewName("ph-bench-test-cg-")
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		prereq.Skipf(t, "ip netns add: %v: %s", err, out)
	}
	defer func() { _ = exec.Command("ip", "netns", "del", ns).Run() }()
	argv := cg.Wrap(ns, "sh", "-c", "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; sleep 5")
	cmd := exec.Command(argv[0], argv[1:]...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	deadline := time.Now().Add(5 * time.Second)
	for {
		procs := cg.Procs()
		if len(procs) >= 1 && procs[0] == cmd.Process.Pid {
			b, _ := os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/comm")
			if strings.TrimSpace(string(b)) == "sh" {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("cgroup procs %v, want [%d] running sh", procs, cmd.Process.Pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := cg.ResetMax(); err != nil {
		t.Errorf("resetting memory.max_usage_in_bytes: %v", err)
	}
	time.Sleep(200 * time.Millisecond)
	if cpu, err := cg.CPUNanos(); err != nil || cpu == 0 {
		t.Errorf("cpuacct.usage %d, %v", cpu, err)
	}
	if m, err := cg.MaxUsage(); err != nil || m == 0 {
		t.Errorf("memory.max_usage_in_bytes %d, %v", m, err)
	}
}

// A prefix must begin with ph-bench-, so that no prefix takes in another's cgroups.
func TestPrefixChecked(t *testing.T) {
	if _, err := New("", "x"); err == nil {
		t.Error("New made a group with an empty prefix")
	}
	if err := RemoveLeftovers("system"); err == nil {
		t.Error("RemoveLeftovers took prefix system")
	}
}
