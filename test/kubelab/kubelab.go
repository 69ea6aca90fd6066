// Package kubelab is what the lab (test/e2e) and the benchmarks need to run a real Kubernetes
// control plane on this machine: where the binaries built by test/kube are, and kubeconfigs
// for the apiserver they start.
package kubelab

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
)

// Binaries are the control plane's programs and the Kubernetes version they were built at.
type Binaries struct {
	Version                string
	Etcd, APIServer, Proxy string
}

// VersionEnv picks the Kubernetes version the lab runs (e.g. v1.34.4); without it, the
// default that test/kube/VERSION names. Each version is built by test/kube/build.sh from its
// module test/kube/<version>.
const VersionEnv = "PROXYHEALTH_KUBE_VERSION"

var versionRE = regexp.MustCompile(`^v1\.[0-9]+\.[0-9]+$`)

// Version is the Kubernetes version the lab runs: $PROXYHEALTH_KUBE_VERSION, else the one
// test/kube/VERSION under repo names.
func Version(repo string) (string, error) {
	v := os.Getenv(VersionEnv)
	from := "$" + VersionEnv
	if v == "" {
		b, err := os.ReadFile(filepath.Join(repo, "test", "kube", "VERSION"))
		if err != nil {
			return "", err
		}
		v, from = strings.TrimSpace(string(b)), "test/kube/VERSION"
	}
	if !versionRE.MatchString(v) {
		return "", fmt.Errorf("%s: %q is not a Kubernetes version (v1.<minor>.<patch>)", from, v)
	}
	return v, nil
}

// FindBinaries locates kube-apiserver and kube-proxy ($PROXYHEALTH_KUBE_BIN, else
// test/kube/build.sh's cache, ${PROXYHEALTH_KUBE_CACHE:-~/.cache/proxyhealth/kube}/<version>,
// for the version Version picks) and etcd on PATH, or says what is missing and how to get it.
func FindBinaries(repo string) (Binaries, error) {
	var b Binaries
	v, err := Version(repo)
	if err != nil {
		return b, err
	}
	b.Version = v
	dir := os.Getenv("PROXYHEALTH_KUBE_BIN")
	if dir == "" {
		cache := os.Getenv("PROXYHEALTH_KUBE_CACHE")
		if cache == "" {
			home, err := os.UserHomeDir()
			if err != nil {
				return b, err
			}
			cache = filepath.Join(home, ".cache", "proxyhealth", "kube")
		}
		dir = filepath.Join(cache, b.Version)
	}
	b.APIServer, b.Proxy = filepath.Join(dir, "kube-apiserver"), filepath.Join(dir, "kube-proxy")
	for _, p := range []string{b.APIServer, b.Proxy} {
		if _, err := os.Stat(p); err != nil {
			return b, fmt.Errorf("%s missing; build it with test/kube/build.sh %s (or make kube KUBE_VERSION=%s; several minutes the first time)", p, b.Version, b.Version)
		}
	}
	if b.Etcd, err = exec.LookPath("etcd"); err != nil {
		return b, errors.New("etcd not found; install: apt-get install -y etcd-server")
	}
	return b, nil
}

// IPTablesShim makes dir/iptables-<backend>, a directory of links named iptables,
// iptables-save, iptables-restore (and ip6tables-*) to the backend's (legacy or nft) binaries.
// kube-proxy runs the iptables binaries on its PATH: with this directory first on it, it
// writes with that backend, as the iptables-wrapper of kube-proxy's image chooses on a node.
func IPTablesShim(dir, backend string) (string, error) {
	shim := filepath.Join(dir, "iptables-"+backend)
	if err := os.MkdirAll(shim, 0o755); err != nil {
		return "", err
	}
	for _, fam := range []string{"iptables", "ip6tables"} {
		for _, suffix := range []string{"", "-save", "-restore"} {
			target, err := exec.LookPath(fam + "-" + backend + suffix)
			if err != nil {
				return "", err
			}
			if err := os.Symlink(target, filepath.Join(shim, fam+suffix)); err != nil {
				return "", err
			}
		}
	}
	return shim, nil
}

// KubeconfigYAML is a kubeconfig for an apiserver at server (host:port, self-signed: TLS not
// verified) with a bearer token.
func KubeconfigYAML(server, user, token string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: lab
  cluster:
    server: https://%s
    insecure-skip-tls-verify: true
users:
- name: %s
  user:
    token: %s
contexts:
- name: lab
  context:
    cluster: lab
    user: %s
current-context: lab
`, server, user, token, user)
}
