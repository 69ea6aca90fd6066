package exporter

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
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

// A real exporter process with --conntrack.invalid-reasons changes conntrack's log settings of
// its network namespace while it runs, and puts them back when SIGTERM ends it.
func TestInvalidReasonsRestoredOnSIGTERM(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	for _, tool := range []string{"unshare", "nsenter", "sh"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed", tool)
		}
	}
	// The exporter's namespace is held by another process, so that it can be looked at
	// after the exporter is gone.
	holder := exec.Command("unshare", "--net", "sleep", "120")
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { holder.Process.Kill(); holder.Wait() })
	nsenter := []string{"nsenter", fmt.Sprintf("--net=/proc/%d/ns/net", holder.Process.Pid)}
	inNetns := func(script string) string {
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
	const readSettings = `cd /proc/sys/net/netfilter; echo $(cat nf_conntrack_log_invalid nf_log/2 nf_log/10)`
	// Values of the node's own, to be put back.
	before := inNetns(`ip link set lo up
modprobe nf_conntrack 2>/dev/null || true
cd /proc/sys/net/netfilter
echo 6 > nf_conntrack_log_invalid
echo NONE > nf_log/2
` + readSettings)

	args := []string{"--web.listen-address=127.0.0.1:19100", "--web.shutdown-timeout=2s", "--conntrack.invalid-reasons",
		"--no-collector.rules", "--no-collector.node", "--no-collector.kubeproxy", "--log.level=debug"}
	exporter := exec.Command(nsenter[0], append(nsenter[1:], os.Args[0], "-test.run=^TestExporterProcess$", "-test.count=1")...)
	exporter.Env = append(os.Environ(), exporterProcessEnv+"="+strings.Join(args, "\n"))
	var logs strings.Builder
	exporter.Stdout, exporter.Stderr = &logs, &logs
	if err := exporter.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- exporter.Wait() }()
	t.Cleanup(func() {
		exporter.Process.Kill()
		if t.Failed() {
			t.Logf("exporter's log:\n%s", logs.String())
		}
	})

	deadline := time.Now().Add(30 * time.Second)
	for got := inNetns(readSettings); got != "255 nfnetlink_log nfnetlink_log"; got = inNetns(readSettings) {
		if time.Now().After(deadline) {
			t.Fatalf("the exporter did not set conntrack's log settings: %s", got)
		}
		select {
		case err := <-exited:
			t.Fatalf("the exporter ended: %v", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
	// nsenter execs the exporter: its pid is the exporter's.
	if err := exporter.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatal(err)
		}
		if err != nil {
			t.Errorf("the exporter exited with %v after SIGTERM, want 0", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the exporter did not end within 10s of SIGTERM")
	}
	if got := inNetns(readSettings); got != before {
		t.Errorf("settings after SIGTERM: %s, want the old %s", got, before)
	}
}
