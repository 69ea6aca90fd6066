package kubeproxyrun

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/proxyhealth/proxyhealth/internal/testsupport/prereq"
)

// The shim's iptables, iptables-save, ... are links to the backend's binaries.
func TestIPTablesShim(t *testing.T) {
	want, err := exec.LookPath("iptables-legacy-save")
	if err != nil {
		prereq.Skip(t, "no iptables-legacy-save")
	}
	shim, err := IPTablesShim(t.TempDir(), "legacy")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"iptables", "iptables-save", "iptables-restore", "ip6tables", "ip6tables-save", "ip6tables-restore"} {
		if _, err := os.Lstat(filepath.Join(shim, name)); err != nil {
			t.Errorf("shim lacks %s: %v", name, err)
		}
	}
	if got, err := os.Readlink(filepath.Join(shim, "iptables-save")); err != nil || got != want {
		t.Errorf("iptables-save links to %q (%v), want %q", got, err, want)
	}
}

// The kubeconfig comes first, so that Args(...)[2:] is the command line without it.
func TestArgs(t *testing.T) {
	args := Args("/tmp/kp.kubeconfig", "nftables")
	if !slices.Equal(args[:2], []string{"--kubeconfig", "/tmp/kp.kubeconfig"}) || !slices.Contains(args, "nftables") || slices.Contains(args[2:], "/tmp/kp.kubeconfig") {
		t.Errorf("Args = %v", args)
	}
}
