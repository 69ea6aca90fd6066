// Package kubelab is what the lab (test/e2e) and the benchmarks need to run a real Kubernetes
// control plane on this machine: where the binaries built by test/kube are, and kubeconfigs
// for the apiserver they start.
package kubelab

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
)

// Binaries are the control plane's programs and the versions they were built at.
type Binaries struct {
	Version                string // Kubernetes'
	EtcdVersion            string // empty when $PROXYHEALTH_ETCD names the binary
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

// EtcdEnv names an etcd binary the lab runs instead of test/etcd/build.sh's.
const EtcdEnv = "PROXYHEALTH_ETCD"

// EtcdVersion is the etcd version test/etcd/go.mod under repo pins, the one test/etcd/build.sh
// builds.
func EtcdVersion(repo string) (string, error) {
	p := filepath.Join(repo, "test", "etcd", "go.mod")
	b, err := os.ReadFile(p)
	if err != nil {
		return "", err
	}
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) == 3 && f[0] == "require" && f[1] == "go.etcd.io/etcd/server/v3" && etcdVersionRE.MatchString(f[2]) {
			return f[2], nil
		}
	}
	return "", fmt.Errorf("%s: no line require go.etcd.io/etcd/server/v3 v3.<minor>.<patch>", p)
}

var etcdVersionRE = regexp.MustCompile(`^v3\.[0-9]+\.[0-9]+$`)

// FindBinaries locates kube-apiserver and kube-proxy ($PROXYHEALTH_KUBE_BIN, else
// test/kube/build.sh's cache, ${PROXYHEALTH_KUBE_CACHE:-~/.cache/proxyhealth/kube}/<version>,
// for the version Version picks) and etcd ($PROXYHEALTH_ETCD, else test/etcd/build.sh's
// cache, ${PROXYHEALTH_ETCD_CACHE:-~/.cache/proxyhealth/etcd}/<version>/etcd, for the version
// EtcdVersion reads), or says what is missing and how to get it.
func FindBinaries(repo string) (Binaries, error) {
	var b Binaries
	v, err := Version(repo)
	if err != nil {
		return b, err
	}
	b.Version = v
	dir := os.Getenv("PROXYHEALTH_KUBE_BIN")
	if dir == "" {
		cache, err := cacheDir("PROXYHEALTH_KUBE_CACHE", "kube")
		if err != nil {
			return b, err
		}
		dir = filepath.Join(cache, b.Version)
	}
	b.APIServer, b.Proxy = filepath.Join(dir, "kube-apiserver"), filepath.Join(dir, "kube-proxy")
	for _, p := range []string{b.APIServer, b.Proxy} {
		if _, err := os.Stat(p); err != nil {
			return b, fmt.Errorf("%s missing; build it with test/kube/build.sh %s (or make kube KUBE_VERSION=%s; several minutes the first time)", p, b.Version, b.Version)
		}
	}
	if b.Etcd = os.Getenv(EtcdEnv); b.Etcd == "" {
		if b.EtcdVersion, err = EtcdVersion(repo); err != nil {
			return b, err
		}
		cache, err := cacheDir("PROXYHEALTH_ETCD_CACHE", "etcd")
		if err != nil {
			return b, err
		}
		b.Etcd = filepath.Join(cache, b.EtcdVersion, "etcd")
	}
	if _, err := os.Stat(b.Etcd); err != nil {
		return b, fmt.Errorf("etcd %s missing; build it with test/etcd/build.sh (or make etcd; minutes the first time)", b.Etcd)
	}
	return b, nil
}

// cacheDir is $env, else ~/.cache/proxyhealth/<name>: where a build script of test/ puts
// what it builds.
func cacheDir(env, name string) (string, error) {
	if dir := os.Getenv(env); dir != "" {
		return dir, nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("the cache of %s: %w", name, err)
	}
	return filepath.Join(home, ".cache", "proxyhealth", name), nil
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
