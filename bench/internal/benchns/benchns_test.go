package benchns

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"testing"

	"github.com/proxyhealth/proxyhealth/internal/testsupport/prereq"
)

func TestDeleteRefusesOthersNamespaces(t *testing.T) {
	if err := Delete("ph-bench-", "ph-e2e-1-node"); err == nil {
		t.Error("deleted a namespace without the benchmark's prefix")
	}
}

func TestListAndDelete(t *testing.T) {
	if os.Geteuid() != 0 {
		prereq.Skip(t, "needs root to create a network namespace")
	}
	prefix := fmt.Sprintf("ph-benchns-test-%d-", os.Getpid())
	name := prefix + "a"
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		prereq.Skipf(t, "ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	// Something running inside, as a benchmark's child would be.
	sleeper := exec.Command("ip", "netns", "exec", name, "sleep", "30")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = sleeper.Wait(); close(done) }()

	if got := List(prefix); !slices.Equal(got, []string{name}) {
		t.Fatalf("List(%q) = %v, want [%s]", prefix, got, name)
	}
	if err := Delete(prefix, name); err != nil {
		t.Fatal(err)
	}
	<-done // killed
	if got := List(prefix); len(got) != 0 {
		t.Errorf("after Delete: %v", got)
	}
}

func TestCPU(t *testing.T) {
	if NumCPU() < 1 || CPUModel() == "" {
		t.Errorf("NumCPU %d, CPUModel %q", NumCPU(), CPUModel())
	}
}
