package kubelab

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/proxyhealth/proxyhealth/internal/testsupport/prereq"
)

func TestFindBinaries(t *testing.T) {
	repo := t.TempDir()
	if err := os.MkdirAll(filepath.Join(repo, "test", "kube"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(repo, "test", "kube", "VERSION"), []byte("v1.37.2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv(VersionEnv, "")
	bin := t.TempDir()
	t.Setenv("PROXYHEALTH_KUBE_BIN", bin)
	if _, err := FindBinaries(repo); err == nil || !strings.Contains(err.Error(), "make kube KUBE_VERSION=v1.37.2") {
		t.Errorf("without binaries: %v, want it to say how to build them", err)
	}
	for _, name := range []string{"kube-apiserver", "kube-proxy"} {
		if err := os.WriteFile(filepath.Join(bin, name), nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	b, err := FindBinaries(repo)
	if b.Version != "v1.37.2" || b.APIServer != filepath.Join(bin, "kube-apiserver") {
		t.Errorf("FindBinaries = %+v", b)
	}
	if err != nil && !strings.Contains(err.Error(), "etcd") {
		t.Errorf("error %v: only etcd may be missing", err)
	}
}

func TestFindBinariesVersionFromEnv(t *testing.T) {
	repo := t.TempDir()
	if err := os.MkdirAll(filepath.Join(repo, "test", "kube"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(repo, "test", "kube", "VERSION"), []byte("v1.37.2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cache := t.TempDir()
	t.Setenv("PROXYHEALTH_KUBE_BIN", "")
	t.Setenv("PROXYHEALTH_KUBE_CACHE", cache)
	t.Setenv(VersionEnv, "v1.34.4")
	_, err := FindBinaries(repo)
	if want := filepath.Join(cache, "v1.34.4", "kube-apiserver") + " missing"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("FindBinaries with %s=v1.34.4: %v, want %q", VersionEnv, err, want)
	}
	for _, bad := range []string{"1.34.4", "v1.34", "v1.34.4; rm -rf /", "../v1.34.4"} {
		t.Setenv(VersionEnv, bad)
		if _, err := FindBinaries(repo); err == nil || !strings.Contains(err.Error(), "not a Kubernetes version") {
			t.Errorf("%s=%q: %v, want it refused", VersionEnv, bad, err)
		}
	}
}

func TestKubeconfigYAML(t *testing.T) {
	y := KubeconfigYAML("127.0.0.1:6443", "admin", "s3cret")
	for _, want := range []string{"server: https://127.0.0.1:6443", "token: s3cret", "user: admin"} {
		if !strings.Contains(y, want) {
			t.Errorf("kubeconfig lacks %q:\n%s", want, y)
		}
	}
}

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
