package kubelab

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestFindBinaries(t *testing.T) {
	repo := t.TempDir()
	if err := os.MkdirAll(filepath.Join(repo, "test", "kube"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(repo, "test", "kube", "go.mod"), []byte("module x\n\nrequire k8s.io/kubernetes v1.36.3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	t.Setenv("PROXYHEALTH_KUBE_BIN", bin)
	if _, err := FindBinaries(repo); err == nil || !strings.Contains(err.Error(), "make kube") {
		t.Errorf("without binaries: %v, want it to say how to build them", err)
	}
	for _, name := range []string{"kube-apiserver", "kube-proxy"} {
		if err := os.WriteFile(filepath.Join(bin, name), nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	b, err := FindBinaries(repo)
	if b.Version != "v1.36.3" || b.APIServer != filepath.Join(bin, "kube-apiserver") {
		t.Errorf("FindBinaries = %+v", b)
	}
	if err != nil && !strings.Contains(err.Error(), "etcd") {
		t.Errorf("error %v: only etcd may be missing", err)
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
