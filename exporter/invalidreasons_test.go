package exporter

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/proxyhealth/proxyhealth/internal/testsupport/prereq"
)

// exporterProcessEnv makes TestExporterProcess run the exporter with the arguments it holds
// (separated by newlines), as a process of its own.
const exporterProcessEnv = "PROXYHEALTH_TEST_EXPORTER_ARGS"

// TestExporterProcess is the exporter process of TestInvalidReasonsRestoredOnSIGTERM.
func TestExporterProcess(t *testing.T) {
	args := os.Getenv(exporterProcessEnv)
	if args == "" {
		t.Skip("run by TestInvalidReasonsRestoredOnSIGTERM")
	}
	os.Exit(Main(strings.Split(args, "\n")))
}

// invalidReasonsNetns is a network namespace held by another process, so that it can be
// looked at after the exporter in it is gone, with conntrack's log settings at values of the
// node's own. It returns how to run a shell script in it and the settings' values.
func invalidReasonsNetns(t *testing.T) (inNetns func(script string) string, nsenter []string, before string) {
	t.Helper()
	if os.Geteuid() != 0 {
		prereq.Skip(t, "needs root")
	}
	for _, tool := range []string{"unshare", "nsenter", "sh"} {
		if _, err := exec.LookPath(tool); err != nil {
			prereq.Skipf(t, "%s not installed", tool)
		}
	}
	holder := exec.Command("unshare", "--net", "sleep", "120")
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { holder.Process.Kill(); holder.Wait() })
	nsenter = []string{"nsenter", fmt.Sprintf("--net=/proc/%d/ns/net", holder.Process.Pid)}
	inNetns = func(script string) string {
		t.Helper()
		out, err := exec.Command(nsenter[0], append(nsenter[1:], "sh", "-ec", script)...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", script, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	own, _ := os.Readlink("/proc/self/ns/net")
	for i := 0; ; i++ {
		if ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", holder.Process.Pid)); err == nil && ns != own {
			break
		}
		if i == 100 {
			t.Fatal("the holder did not get a network namespace of its own")
		}
		time.Sleep(20 * time.Millisecond)
	}
	before = inNetns(`ip link set lo up
modprobe nf_conntrack 2>/dev/null || true
cd /proc/sys/net/netfilter
echo 6 > nf_conntrack_log_invalid
echo NONE > nf_log/2
` + readInvalidLogSettings)
	return inNetns, nsenter, before
}

const readInvalidLogSettings = `cd /proc/sys/net/netfilter; echo $(cat nf_conntrack_log_invalid nf_log/2 nf_log/10)`

// startExporterProcess runs Main with args as a process of its own in the namespace nsenter
// enters; exited reports its end.
func startExporterProcess(t *testing.T, nsenter, args []string) (cmd *exec.Cmd, exited chan error) {
	t.Helper()
	cmd = exec.Command(nsenter[0], append(nsenter[1:], os.Args[0], "-test.run=^TestExporterProcess$", "-test.count=1")...)
	cmd.Env = append(os.Environ(), exporterProcessEnv+"="+strings.Join(args, "\n"))
	var logs strings.Builder
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited = make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		if t.Failed() {
			t.Logf("exporter's log:\n%s", logs.String())
		}
	})
	return cmd, exited
}

// waitSettings waits until the namespace's settings read want, failing if the process ends
// first.
func waitSettings(t *testing.T, inNetns func(string) string, want string, exited chan error) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for got := inNetns(readInvalidLogSettings); got != want; got = inNetns(readInvalidLogSettings) {
		if time.Now().After(deadline) {
			t.Fatalf("the settings did not become %q: %s", want, got)
		}
		select {
		case err := <-exited:
			t.Fatalf("the process ended first: %v", err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// A real exporter process with --conntrack.invalid-reasons changes conntrack's log settings of
// its network namespace while it runs, and puts them back when SIGTERM ends it.
func TestInvalidReasonsRestoredOnSIGTERM(t *testing.T) {
	inNetns, nsenter, before := invalidReasonsNetns(t)
	args := []string{"--web.listen-address=127.0.0.1:19100", "--web.shutdown-timeout=2s", "--conntrack.invalid-reasons",
		"--conntrack.invalid-reasons.state-dir=" + t.TempDir(),
		"--no-collector.rules", "--no-collector.node", "--no-collector.kubeproxy", "--log.level=debug"}
	exporter, exited := startExporterProcess(t, nsenter, args)
	waitSettings(t, inNetns, "255 nfnetlink_log nfnetlink_log", exited)
	// nsenter execs the exporter: its pid is the exporter's.
	if err := exporter.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("the exporter exited with %v after SIGTERM, want 0", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the exporter did not end within 10s of SIGTERM")
	}
	if got := inNetns(readInvalidLogSettings); got != before {
		t.Errorf("settings after SIGTERM: %s, want the old %s", got, before)
	}
}

// proxyhealth diagnose with --conntrack.invalid-reasons reads the log during its window and
// puts the settings back when it ends.
func TestInvalidReasonsRestoredAfterDiagnose(t *testing.T) {
	inNetns, nsenter, before := invalidReasonsNetns(t)
	args := []string{"diagnose", "--window=2s", "--conntrack.invalid-reasons", "--conntrack.invalid-reasons.state-dir=" + t.TempDir(),
		"--no-collector.rules", "--no-collector.node", "--no-collector.kubeproxy", "--log.level=debug"}
	_, exited := startExporterProcess(t, nsenter, args)
	waitSettings(t, inNetns, "255 nfnetlink_log nfnetlink_log", exited)
	select {
	case err := <-exited:
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("diagnose did not end within 30s")
	}
	if got := inNetns(readInvalidLogSettings); got != before {
		t.Errorf("settings after diagnose: %s, want the old %s", got, before)
	}
}

// A real exporter process killed with SIGKILL leaves conntrack's log settings changed; a
// restarted one, killed again, then ended by SIGTERM, puts back the values the namespace had
// before the first start, which the state directory kept, not those the crashes left.
func TestInvalidReasonsRestoredAfterSIGKILL(t *testing.T) {
	inNetns, nsenter, before := invalidReasonsNetns(t)
	stateDir := filepath.Join(t.TempDir(), "proxyhealth")
	state := filepath.Join(stateDir, "conntrack-invalid-log.json")
	args := []string{"--web.listen-address=127.0.0.1:19100", "--web.shutdown-timeout=2s", "--conntrack.invalid-reasons",
		"--conntrack.invalid-reasons.state-dir=" + stateDir,
		"--no-collector.rules", "--no-collector.node", "--no-collector.kubeproxy", "--log.level=debug"}
	const ours = "255 nfnetlink_log nfnetlink_log"

	exporter, exited := startExporterProcess(t, nsenter, args)
	waitSettings(t, inNetns, ours, exited)
	for crash := 1; crash <= 2; crash++ {
		saved, err := os.Stat(state)
		if err != nil {
			t.Fatalf("no state file while the settings are changed: %v", err)
		}
		if err := exporter.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		<-exited
		if got := inNetns(readInvalidLogSettings); got != ours {
			t.Fatalf("settings after SIGKILL %d: %s, want them still changed (%s)", crash, got, ours)
		}
		// The restarted exporter writes the state file anew before it sets anything.
		exporter, exited = startExporterProcess(t, nsenter, args)
		deadline := time.Now().Add(30 * time.Second)
		for {
			fi, err := os.Stat(state)
			if err == nil && !os.SameFile(fi, saved) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("restart %d: the state file was not written anew: %v", crash, err)
			}
			select {
			case err := <-exited:
				t.Fatalf("restart %d: the exporter ended: %v", crash, err)
			case <-time.After(50 * time.Millisecond):
			}
		}
		waitSettings(t, inNetns, ours, exited)
	}

	if err := exporter.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("the exporter exited with %v after SIGTERM, want 0", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the exporter did not end within 10s of SIGTERM")
	}
	if got := inNetns(readInvalidLogSettings); got != before {
		t.Errorf("settings after two SIGKILLs, restarts and SIGTERM: %s, want those before the first start, %s", got, before)
	}
	if _, err := os.Stat(state); !os.IsNotExist(err) {
		t.Errorf("the state file outlives the clean exit: %v", err)
	}
}
