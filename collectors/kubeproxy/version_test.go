package kubeproxy

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/proxyhealth/proxyhealth/collectors/collectortest"
	"github.com/proxyhealth/proxyhealth/internal/proxyversion"
	"github.com/proxyhealth/proxyhealth/internal/testsupport/logbuf"
)

func buildInfoBody(version string) string {
	return `# TYPE kubernetes_build_info gauge
kubernetes_build_info{build_date="2026-10-01T00:00:00Z",compiler="gc",git_commit="abc",git_tree_state="clean",git_version="` + version + `",go_version="go1.26.8",major="1",minor="37",platform="linux/amd64"} 1
`
}

// kube-proxy's version: exported as proxyhealth_kubeproxy_build_info, in Status, handed to
// OnVersion and logged once per change, with a warning when proxyhealth is not tested with it.
func TestVersion(t *testing.T) {
	var body struct {
		sync.Mutex
		s string
	}
	set := func(s string) { body.Lock(); body.s = s; body.Unlock() }
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) {
		body.Lock()
		defer body.Unlock()
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		io.WriteString(w, body.s)
	})
	mux.HandleFunc("/livez", func(http.ResponseWriter, *http.Request) {})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	c := newTestCollector(t, srv.URL, time.Unix(2000, 0))
	logs := &logbuf.Buffer{}
	c.logger = slog.New(slog.NewTextHandler(logs, nil))
	var told []proxyversion.Version
	c.cfg.OnVersion = func(v proxyversion.Version) { told = append(told, v) }

	for _, step := range []struct {
		name, body string
		up         bool
		want       string // the build_info series; "" for none
		status     string
		told       []proxyversion.Version
		log        string // in the log since the last step; "" for nothing
	}{
		{
			name: "tested", body: buildInfoBody("v1.37.2"), up: true,
			want:   `proxyhealth_kubeproxy_build_info{version="v1.37.2"} 1` + "\n",
			status: "v1.37.2", told: []proxyversion.Version{{Major: 1, Minor: 37}},
			log: `level=INFO msg="kube-proxy's version" version=v1.37.2`,
		},
		{
			name: "the same again", body: buildInfoBody("v1.37.2"), up: true,
			want:   `proxyhealth_kubeproxy_build_info{version="v1.37.2"} 1` + "\n",
			status: "v1.37.2", told: []proxyversion.Version{{Major: 1, Minor: 37}},
		},
		{
			name: "not answering: the last version stays", body: "<html>", up: false,
			want:   `proxyhealth_kubeproxy_build_info{version="v1.37.2"} 1` + "\n",
			status: "v1.37.2", told: []proxyversion.Version{{Major: 1, Minor: 37}},
		},
		{
			name: "newer than tested", body: buildInfoBody("v1.38.1-gke.200"), up: true,
			want:   `proxyhealth_kubeproxy_build_info{version="v1.38.1-gke.200"} 1` + "\n",
			status: "v1.38.1-gke.200", told: []proxyversion.Version{{Major: 1, Minor: 37}, {Major: 1, Minor: 38}},
			log: `level=WARN msg="kube-proxy's version is outside the versions proxyhealth is tested with: drift may be misjudged where kube-proxy changed how it picks endpoints" version=v1.38.1-gke.200 tested="v1.34 to v1.37"`,
		},
		{
			// What the lab's binaries, built from the module without version stamps, report.
			name: "without version information", body: buildInfoBody("v0.0.0-master+$Format:%H$"), up: true,
			want:   `proxyhealth_kubeproxy_build_info{version="v0.0.0-master+$Format:%H$"} 1` + "\n",
			status: "v0.0.0-master+$Format:%H$", told: []proxyversion.Version{{Major: 1, Minor: 37}, {Major: 1, Minor: 38}, {}},
			log: `level=WARN msg="kube-proxy's version is not known (a build without version information?): what it programs is computed as the newest tested version does" version=v0.0.0-master+$Format:%H$ tested="v1.34 to v1.37" as=v1.37`,
		},
		{
			name: "no build info", body: "# no metrics\n", up: true,
			status: "", told: []proxyversion.Version{{Major: 1, Minor: 37}, {Major: 1, Minor: 38}, {}, {}},
			log: `level=WARN msg="kube-proxy reports no version (no kubernetes_build_info in its metrics): what it programs is computed as the newest tested version does" tested="v1.34 to v1.37" as=v1.37`,
		},
	} {
		t.Run(step.name, func(t *testing.T) {
			before := len(logs.String())
			set(step.body)
			c.pollOnce(context.Background())
			if got := c.Status(); got.Up != step.up || got.Version != step.status {
				t.Errorf("Status() up %v version %q, want %v %q", got.Up, got.Version, step.up, step.status)
			}
			if err := collectortest.CollectOK(t, c).Compare(step.want, "proxyhealth_kubeproxy_build_info"); err != nil {
				t.Error(err)
			}
			if !equalVersions(told, step.told) {
				t.Errorf("OnVersion told %v, want %v", told, step.told)
			}
			var versionLines []string
			for _, l := range strings.Split(logs.String()[before:], "\n") {
				if strings.Contains(l, "version") {
					_, l, _ = strings.Cut(l, " ") // the time
					versionLines = append(versionLines, l)
				}
			}
			switch {
			case step.log == "" && len(versionLines) > 0:
				t.Errorf("logged %q, want nothing of the version", versionLines)
			case step.log != "" && (len(versionLines) != 1 || versionLines[0] != step.log):
				t.Errorf("logged %q, want\n%s", versionLines, step.log)
			}
		})
	}
}

func equalVersions(a, b []proxyversion.Version) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
