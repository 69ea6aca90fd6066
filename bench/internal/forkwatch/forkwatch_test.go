//go:build linux

package forkwatch

import (
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/proxyhealth/proxyhealth/internal/testsupport/prereq"
)

// A Watcher counts the processes a watched process creates, and names their programs.
func TestForkWatchCountsChildren(t *testing.T) {
	if os.Geteuid() != 0 {
		prereq.Skip(t, "the proc connector needs root")
	}
	w, err := New()
	if err != nil {
		prereq.Skipf(t, "no proc connector: %v", err)
	}
	defer w.Close()
	// Go's first exec in a process probes clone(CLONE_PIDFD) with a child that exits at once
	// (syscall.checkClonePidfd): a process too, but not one to count here.
	if err := exec.Command("true").Run(); err != nil {
		t.Fatal(err)
	}
	// Its events must be read before this process is watched, or they count.
	time.Sleep(300 * time.Millisecond)
	w.Watch("self", os.Getpid())
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
		k, c := w.Take("self")
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
	// "?" (how many are depends on how busy the machine is). The count is exact.
	if n != 5 {
		t.Errorf("counted %d processes (%s), want 5: true 3, sh 1, sleep 1", n, cmds)
	}
	for part := range strings.SplitSeq(strings.ReplaceAll(strings.TrimSuffix(cmds, "; "), "; ", ", "), ", ") {
		if name, _, _ := strings.Cut(part, " "); name != "" && !slices.Contains([]string{"true", "sh", "sleep", "?"}, name) {
			t.Errorf("named %q among %s: not one of the programs run", name, cmds)
		}
	}
	if k, _ := w.Take("other"); k != 0 {
		t.Errorf("an unwatched group counted %d", k)
	}
}
