package exporter

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/proxyhealth/proxyhealth/internal/testsupport/prereq"
)

// prepare-state-dir makes the state directory the exporter's user's, 0700, whether the kubelet
// created it (root's, 0755) or not.
func TestPrepareStateDir(t *testing.T) {
	if os.Geteuid() != 0 {
		prereq.Skip(t, "needs root to give a directory away")
	}
	existing := filepath.Join(t.TempDir(), "run", "proxyhealth")
	if err := os.MkdirAll(existing, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{existing, filepath.Join(t.TempDir(), "new", "proxyhealth")} {
		if code := Main([]string{"prepare-state-dir", "--owner=65534:65533", "--conntrack.invalid-reasons.state-dir=" + dir}); code != 0 {
			t.Fatalf("%s: exit %d", dir, code)
		}
		fi, err := os.Stat(dir)
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if fi.Mode() != os.ModeDir|0o700 || st.Uid != 65534 || st.Gid != 65533 {
			t.Errorf("%s: mode %v owner %d:%d, want 0700 of 65534:65533", dir, fi.Mode(), st.Uid, st.Gid)
		}
	}
	for _, owner := range []string{"65534", "nobody:nogroup", "-1:0", ":"} {
		if code := Main([]string{"prepare-state-dir", "--owner=" + owner, "--conntrack.invalid-reasons.state-dir=" + existing}); code == 0 {
			t.Errorf("--owner=%s accepted", owner)
		}
	}
}
