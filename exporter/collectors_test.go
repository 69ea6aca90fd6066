package exporter

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/alecthomas/kingpin/v2"

	"github.com/proxyhealth/proxyhealth/internal/iptlegacy"
	"github.com/proxyhealth/proxyhealth/internal/nftnl"
	"github.com/proxyhealth/proxyhealth/internal/proxyversion"
)

// fakeProcSelf is a /proc/self whose process is in a cgroup v2 of memory.max limit ("max":
// none), on a node of memTotal ("" for a /proc without meminfo).
func fakeProcSelf(t *testing.T, limit, memTotal string) string {
	t.Helper()
	root := t.TempDir()
	files := map[string]string{
		"self/cgroup":    "0::/\n",
		"self/mountinfo": "29 22 0:26 / " + filepath.Join(root, "cg") + " rw - cgroup2 cgroup2 rw\n",
		"cg/memory.max":  limit + "\n",
	}
	if memTotal != "" {
		files["meminfo"] = "MemTotal:       " + memTotal + "\nMemFree:         1203884 kB\n"
	}
	for name, content := range files {
		if err := os.MkdirAll(filepath.Join(root, filepath.Dir(name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return filepath.Join(root, "self")
}

// The netfilter read limit flags are the netfilter reader's Config: a value given is handed on
// as it is. Without one, the legacy table limit is what the container's memory limit, or the
// node's memory when smaller, leaves after the exporter's own memory (a table the limit lets
// through must not get the container OOM-killed), and never more than the fixed default; the
// log says which.
func TestNetfilterLimitFlags(t *testing.T) {
	const node = "24605316 kB" // this machine's 24 GiB
	for _, tc := range []struct {
		name        string
		args        []string
		memoryMax   string
		memTotal    string
		dump, table int64
		logged      string
	}{
		{"defaults without a memory limit", nil, "max", node, nftnl.DefaultMaxDumpBytes, iptlegacy.DefaultMaxTableBytes, "the fixed default, below what memory limit 25195843584 bytes (the node's MemTotal)"},
		// (384 MiB - 64 MiB) / 1.1
		{"defaults under the chart's memory limit", nil, "402653184", node, nftnl.DefaultMaxDumpBytes, 305040290, "memory limit 402653184 bytes"},
		{"a memory limit below the exporter's own", nil, "33554432", node, nftnl.DefaultMaxDumpBytes, 1, "level=WARN"},
		// A huge but finite limit (1 TiB) does not lift the limit past the fixed default.
		{"a memory limit of 1 TiB", nil, "1099511627776", node, nftnl.DefaultMaxDumpBytes, iptlegacy.DefaultMaxTableBytes, "the fixed default"},
		{"a memory limit of 1 GiB", nil, "1073741824", node, nftnl.DefaultMaxDumpBytes, iptlegacy.DefaultMaxTableBytes, "the fixed default"},
		// A node of 256 MiB: (256 MiB - 64 MiB) / 1.1, whatever the cgroup's limit.
		{"a node smaller than the memory limit", nil, "1099511627776", "262144 kB", nftnl.DefaultMaxDumpBytes, 183024174, "the node's MemTotal"},
		{"a node smaller than the fixed default, no memory limit", nil, "max", "262144 kB", nftnl.DefaultMaxDumpBytes, 183024174, "the node's MemTotal"},
		{"no meminfo", nil, "402653184", "", nftnl.DefaultMaxDumpBytes, 305040290, "cannot read the node's memory"},
		{"given", []string{"--netfilter.max-dump-bytes=4096", "--netfilter.legacy-max-table-bytes=8192"}, "402653184", node, 4096, 8192,
			"from=--netfilter.legacy-max-table-bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			app := kingpin.New("test", "")
			host := addCollectorFlags(app, addPathFlags(app)).host
			var logs bytes.Buffer
			host.logger = slog.New(slog.NewTextHandler(&logs, nil))
			host.procSelf = fakeProcSelf(t, tc.memoryMax, tc.memTotal)
			if _, err := app.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			if _, err := host.get(t.TempDir()); err != nil {
				t.Fatal(err)
			}
			if host.cfg.MaxDumpBytes != tc.dump || host.cfg.LegacyMaxTableBytes != tc.table {
				t.Errorf("hostrules.Config limits: dump %d, legacy table %d; want %d, %d",
					host.cfg.MaxDumpBytes, host.cfg.LegacyMaxTableBytes, tc.dump, tc.table)
			}
			if got := strings.Count(logs.String(), `msg="iptables-legacy table read limit"`); got != 1 || !strings.Contains(logs.String(), tc.logged) {
				t.Errorf("log: %d lines of the limit, want 1 saying %q:\n%s", got, tc.logged, logs.String())
			}
		})
	}
}

// The chart's memory limit leaves the largest kube-proxy table of BENCHMARKS.md's node cost
// (10,000 Services x 10 endpoints, 183 MiB with its comments) readable.
func TestLegacyLimitUnderTheChartFitsTheBenchmarkTable(t *testing.T) {
	if got := iptlegacy.MaxTableBytesWithin(384<<20, ownMemoryBytes); got < 183<<20 {
		t.Errorf("a 384 MiB memory limit leaves %d MiB for a legacy table, less than the 183 MiB table at 10,000 x 10", got>>20)
	}
}

// kube-proxy's version, read from its metrics by the kubeproxy collector, reaches the API view.
func TestKubeProxyVersionReachesTheAPIView(t *testing.T) {
	kp := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, `kubernetes_build_info{git_version="v1.34.4",major="1",minor="34"} 1`+"\n")
	}))
	defer kp.Close()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	// The view is built from it but never started: nothing contacts this server.
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	app := kingpin.New("test", "")
	flags := addCollectorFlags(app, addPathFlags(app))
	api := flags.api
	api.logger = slog.New(slog.DiscardHandler)
	if _, err := app.Parse([]string{"--kubeconfig=" + kubeconfig, "--node-name=worker-1",
		"--kubeproxy.metrics-url=" + kp.URL + "/metrics", "--kubeproxy.health-url="}); err != nil {
		t.Fatal(err)
	}
	view, err := api.get()
	if err != nil {
		t.Fatal(err)
	}
	c, err := flags.buildKubeProxy(slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	c.Poll(context.Background())
	if got := view.KubeProxyVersion(); got != (proxyversion.Version{Major: 1, Minor: 34}) {
		t.Errorf("the API view computes for kube-proxy %v, want v1.34", got)
	}
}
