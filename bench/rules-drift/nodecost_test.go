//go:build linux

package main

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/proxyhealth/proxyhealth/bench/internal/synthcluster"
	"github.com/proxyhealth/proxyhealth/internal/testsupport/prereq"
)

// The fork watch counts the processes a watched process creates, and names their programs.
func TestForkWatchCountsChildren(t *testing.T) {
	if os.Geteuid() != 0 {
		prereq.Skip(t, "the proc connector needs root")
	}
	w, err := newForkWatch()
	if err != nil {
		prereq.Skipf(t, "no proc connector: %v", err)
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
		prereq.Skip(t, "needs root")
	}
	if _, err := os.Stat(cgroupRoot + "/cpuacct/cpuacct.usage"); err != nil {
		prereq.Skip(t, "no cgroup v1 cpuacct hierarchy")
	}
	cg, err := newCgroup("test")
	if err != nil {
		prereq.Skip(t, err)
	}
	defer func() {
		if err := cg.remove(); err != nil {
			t.Error(err)
		}
	}()
	ns := newNSName("test")
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		prereq.Skipf(t, "ip netns add: %v: %s", err, out)
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

// Fresh endpoint addresses never repeat a loaded one and stay in 10.128.0.0/9.
func TestFreshEndpointIP(t *testing.T) {
	r := &ncRun{m: &ncMode{Services: 10000, Endpoints: 10}}
	if got, want := r.freshEndpointIP(0), synthcluster.EndpointIP(9999, 9, 10); got == want.String() {
		t.Errorf("the first fresh address %s is the last loaded one", got)
	}
	seen := map[string]bool{}
	for s := range 10000 {
		for e := range 10 {
			seen[synthcluster.EndpointIP(s, e, 10).String()] = true
		}
	}
	for k := range 5000 {
		ip := r.freshEndpointIP(k)
		if seen[ip] {
			t.Fatalf("fresh address %d, %s, repeats one", k, ip)
		}
		seen[ip] = true
	}
	if got := r.freshEndpointIP(ncMaxFreshAddr); !strings.HasPrefix(got, "10.") {
		t.Errorf("wrapped address %s", got)
	}
}

// A report renders whatever a run got to: a mode that failed before start-up, one with every
// phase.
func TestNodeCostReportRenders(t *testing.T) {
	r := &ncReport{cfg: ncConfig{endpoints: 10, idle: time.Minute, churn: 2 * time.Minute, rates: []int{1, 10}, healTimeout: time.Minute}}
	r.Modes = append(r.Modes, &ncMode{Mode: "iptables-nft", Services: 3000, Endpoints: 10, Err: "kube-proxy exited"})
	full := &ncMode{Mode: "iptables-legacy", Services: 10000, Endpoints: 10,
		Latency: &ncLatency{Service: "ns1/svc1", Grace: time.Minute, Seen: true, Latency: 61 * time.Second, KubeProxyCaughtUp: true}}
	for _, ph := range []*ncPhase{
		{Name: "start-up", ExpCPU: 50, KPCPU: 100},
		{Name: "idle", ExpCPU: 0.5, KPCPU: 0.2, ExpPeak: 50 << 20},
		{Name: "churn 1/s", Rate: 1, ExpCPU: 2, KPCPU: 40, Changes: 120},
		{Name: "churn 10/s", Rate: 10, ExpCPU: 3, KPCPU: 60, Changes: 1190, ChangesMissed: 10},
		{Name: "start-up through churn", AllPhases: true, ExpPeak: 60 << 20},
		{Name: "drift scenario", MaxDrifted: 1, Scrapes: 3},
	} {
		full.Phases = append(full.Phases, ph)
	}
	r.Modes = append(r.Modes, full)
	text := r.render()
	for _, want := range []string{
		"| iptables-nft | failed before start-up |",
		"idle 0.50% of a core (≤ 1%: met) with 0 children (none: met)",
		"peak 60.0 MiB start-up through churn (≤ 100 MiB: met)",
		"churn 1/s 5% of kube-proxy's CPU (≤ 10%: met)",
		"| iptables-legacy | ns1/svc1 | 61.00 | +1.00 | 60 | met | yes |",
		"1190 of 1200 (0 failed, 10 ticks missed)",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("report lacks %q:\n%s", want, text)
		}
	}
}
