package kubelab

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/proxyhealth/proxyhealth/internal/testsupport/prereq"
)

// fakeRepo is a repository with test/kube/VERSION and test/etcd/go.mod as FindBinaries reads
// them.
func fakeRepo(t *testing.T, kubeVersion, etcdGoMod string) string {
	t.Helper()
	repo := t.TempDir()
	for name, content := range map[string]string{"kube/VERSION": kubeVersion + "\n", "etcd/go.mod": etcdGoMod} {
		p := filepath.Join(repo, "test", name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return repo
}

const etcdGoMod = "module example.com/etcd\n\ngo 1.26.0\n\nrequire go.etcd.io/etcd/server/v3 v3.6.16\n"

func TestFindBinaries(t *testing.T) {
	repo := fakeRepo(t, "v1.37.2", etcdGoMod)
	t.Setenv(VersionEnv, "")
	t.Setenv(EtcdEnv, "")
	bin, etcdCache := t.TempDir(), t.TempDir()
	t.Setenv("PROXYHEALTH_KUBE_BIN", bin)
	t.Setenv("PROXYHEALTH_ETCD_CACHE", etcdCache)
	if _, err := FindBinaries(repo); err == nil || !strings.Contains(err.Error(), "make kube KUBE_VERSION=v1.37.2") {
		t.Errorf("without binaries: %v, want it to say how to build them", err)
	}
	for _, name := range []string{"kube-apiserver", "kube-proxy"} {
		if err := os.WriteFile(filepath.Join(bin, name), nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	etcd := filepath.Join(etcdCache, "v3.6.16", "etcd")
	if _, err := FindBinaries(repo); err == nil || !strings.Contains(err.Error(), etcd+" missing") || !strings.Contains(err.Error(), "make etcd") {
		t.Errorf("without etcd: %v, want it to name %s and say how to build it", err, etcd)
	}
	if err := os.MkdirAll(filepath.Dir(etcd), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(etcd, nil, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := FindBinaries(repo)
	if err != nil {
		t.Fatal(err)
	}
	want := Binaries{Version: "v1.37.2", EtcdVersion: "v3.6.16", Etcd: etcd, APIServer: filepath.Join(bin, "kube-apiserver"), Proxy: filepath.Join(bin, "kube-proxy")}
	if b != want {
		t.Errorf("FindBinaries = %+v, want %+v", b, want)
	}

	// $PROXYHEALTH_ETCD names the binary; its version is then not known.
	other := filepath.Join(t.TempDir(), "etcd")
	t.Setenv(EtcdEnv, other)
	if _, err := FindBinaries(repo); err == nil || !strings.Contains(err.Error(), other+" missing") {
		t.Errorf("%s=%s, absent: %v, want it named missing", EtcdEnv, other, err)
	}
	if err := os.WriteFile(other, nil, 0o755); err != nil {
		t.Fatal(err)
	}
	if b, err := FindBinaries(repo); err != nil || b.Etcd != other || b.EtcdVersion != "" {
		t.Errorf("%s=%s: %+v, %v", EtcdEnv, other, b, err)
	}
}

func TestEtcdVersion(t *testing.T) {
	if v, err := EtcdVersion(fakeRepo(t, "v1.37.2", etcdGoMod)); err != nil || v != "v3.6.16" {
		t.Errorf("EtcdVersion = %q, %v; want v3.6.16", v, err)
	}
	for _, bad := range []string{"module m\n", "require go.etcd.io/etcd/server/v3 v3.6\n", "require go.etcd.io/etcd/server/v3 ../x\n"} {
		if v, err := EtcdVersion(fakeRepo(t, "v1.37.2", bad)); err == nil {
			t.Errorf("go.mod %q: version %q, want an error", bad, v)
		}
	}
}

// The repository's own test/etcd/go.mod is one EtcdVersion reads (go mod tidy keeps the one
// direct requirement on a line of its own).
func TestEtcdVersionOfRepo(t *testing.T) {
	if _, err := EtcdVersion(filepath.Join("..", "..")); err != nil {
		t.Fatal(err)
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
