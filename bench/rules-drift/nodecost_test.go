//go:build linux

package main

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The fork watch counts the processes a watched process creates, and names their programs.
func TestForkWatchCountsChildren(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the proc connector needs root")
	}
	w, err := newForkWatch()
	if err != nil {
		t.Skipf("no proc connector: %v", err)
	}
	defer w.close()
	// Go's first exec in a process probes clone(CLONE_PIDFD) with a child that exits at once
	// (syscall.checkClonePidfd): a process too, but not one to count here.
	if err := exec.Command("true").Run(); err != nil {
		t.Fatal(err)
	}
	// Its events must be read before this process is watched, or they count.
	time.Sleep(300 * time.Millisecond)
	w.watch("self", os.Getpid())
	for range 3 {
		if err := exec.Command("true").Run(); err != nil {
			t.Fatal(err)
		}
	}
	// Grandchildren count too: sh -c forks (and execs) sleep.
	if err := exec.Command("sh", "-c", "sleep 0; exit 0").Run(); err != nil {
		t.Fatal(err)
	}
	var n int
	var cmds string
	deadline := time.Now().Add(3 * time.Second)
	for {
		k, c := w.take("self")
		n += k
		if c != "" {
			cmds += c + "; "
		}
		if n >= 5 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	// A program is named from /proc when its exec event is read: one that is gone by then is
	// "?". The count is exact.
	if n != 5 || !strings.Contains(cmds, "true ") {
		t.Errorf("counted %d processes (%s), want 5: true 3, sh 1, sleep 1", n, cmds)
	}
	if k, _ := w.take("other"); k != 0 {
		t.Errorf("an unwatched group counted %d", k)
	}
}

// A process started through cgroup.wrap runs in both cgroups, with its own pid, and the
// cgroups' files read.
func TestCgroupWrap(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	if _, err := os.Stat(cgroupRoot + "/cpuacct/cpuacct.usage"); err != nil {
		t.Skip("no cgroup v1 cpuacct hierarchy")
	}
	cg, err := newCgroup("test")
	if err != nil {
		t.Skip(err)
	}
	defer func() {
		if err := cg.remove(); err != nil {
			t.Error(err)
		}
	}()
	ns := newNSName("test")
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Skipf("ip netns add: %v: %s", err, out)
	}
	defer func() { _ = exec.Command("ip", "netns", "del", ns).Run() }()
	argv := cg.wrap(ns, "sh", "-c", "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; sleep 5")
	cmd := exec.Command(argv[0], argv[1:]...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	deadline := time.Now().Add(5 * time.Second)
	for {
		procs := cg.procs()
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
	if err := cg.resetMax(); err != nil {
		t.Errorf("resetting memory.max_usage_in_bytes: %v", err)
	}
	time.Sleep(200 * time.Millisecond)
	if cpu, err := cg.cpuNS(); err != nil || cpu == 0 {
		t.Errorf("cpuacct.usage %d, %v", cpu, err)
	}
	if m, err := cg.maxUsage(); err != nil || m == 0 {
		t.Errorf("memory.max_usage_in_bytes %d, %v", m, err)
	}
}
