package kubeproxy

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestStatus(t *testing.T) {
	body := `# TYPE kubeproxy_sync_proxy_rules_last_timestamp_seconds gauge
kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"} 1000
kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv6"} 1100
# TYPE kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds gauge
kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family="IPv4"} 1050
`
	srv := fakeKubeProxyBody(t, body, 200, 200)
	c := newTestCollector(t, srv.URL, time.Unix(1200, 0))
	if s := c.Status(); s.Polled || s.Up {
		t.Errorf("before a poll: %+v", s)
	}
	c.Poll(context.Background())
	s := c.Status()
	if !s.Polled || !s.At.Equal(time.Unix(1200, 0)) || !s.Up || !s.HealthChecked || !s.Healthy ||
		!s.LastSync.Equal(time.Unix(1000, 0)) || !s.PendingSince.Equal(time.Unix(1050, 0)) {
		t.Errorf("status %+v", s)
	}

	// Absent: not up, with the reason; nothing known of its syncs.
	c = newTestCollector(t, "http://127.0.0.1:1", time.Unix(1200, 0))
	c.Poll(context.Background())
	if s := c.Status(); !s.Polled || s.Up || s.UpReason == "" || !s.LastSync.IsZero() || s.Healthy {
		t.Errorf("absent: %+v", s)
	}
}

func TestStatusCountsTheFollowersErrors(t *testing.T) {
	srv := fakeKubeProxy(t, "kube-proxy-v1.36.3-metrics.txt", 200, 200)
	c := newTestCollector(t, srv.URL, testNow)
	log := filepath.Join(filepath.Dir(c.cfg.LogPaths[0]), "0.log")
	appendFile(t, log, "")
	fl := c.newFollower()
	defer fl.close()
	fl.poll()
	data, err := os.ReadFile(filepath.Join("testdata", "kube-proxy-v1.36.3-watch-errors.log"))
	if err != nil {
		t.Fatal(err)
	}
	appendFile(t, log, string(data))
	fl.poll()
	s := c.Status()
	want := []ListErrors{{"endpointslices", "watch", 1}, {"nodes", "watch", 1}, {"servicecidrs", "watch", 1}, {"services", "watch", 1}}
	slices.SortFunc(s.ListErrors, func(a, b ListErrors) int { return strings.Compare(a.Resource, b.Resource) })
	if !s.LogsRead || !slices.Equal(s.LogFiles, []string{log}) || !slices.Equal(s.ListErrors, want) ||
		s.LastListError.Format(time.DateTime) != "2026-11-21 21:00:47" {
		t.Errorf("status %+v", s)
	}
}

// A one-shot scan reads what was logged before it, within its time and size bounds.
func TestScanLog(t *testing.T) {
	c := newTestCollector(t, "http://127.0.0.1:1", testNow)
	dir := filepath.Dir(c.cfg.LogPaths[0])
	data, err := os.ReadFile(filepath.Join("testdata", "kube-proxy-v1.36.3-watch-errors.log"))
	if err != nil {
		t.Fatal(err)
	}
	old := strings.ReplaceAll(string(data), "I1121 21:00:47", "I1121 20:00:47")
	noise := strings.Repeat("I1121 21:00:50.000000   10834 proxier.go:800] \"Syncing iptables rules\"\n", 100)
	log := filepath.Join(dir, "0.log")
	if err := os.WriteFile(log, []byte(old+string(data)+noise+"I1121 21:00:51.0 unfinished"), 0o644); err != nil {
		t.Fatal(err)
	}
	since := time.Date(2026, 11, 21, 20, 30, 0, 0, time.UTC)
	scan := c.ScanLog(since, 1<<20)
	if scan.Err != nil || !slices.Equal(scan.Files, []string{log}) || len(scan.ListErrors) != 4 ||
		scan.LastListError.Format(time.DateTime) != "2026-11-21 21:00:47" {
		t.Errorf("scan %+v", scan)
	}
	for _, l := range scan.ListErrors {
		if l.Count != 1 || l.Verb != "watch" {
			t.Errorf("%+v: want one watch failure each (the older ones are before since)", l)
		}
	}
	// Everything since an hour earlier: both sets.
	scan = c.ScanLog(since.Add(-time.Hour), 1<<20)
	if len(scan.ListErrors) != 4 || scan.ListErrors[0].Count != 2 {
		t.Errorf("all: %+v", scan.ListErrors)
	}
	// Only the tail: the noise, and a cut first line that is not read as a line.
	scan = c.ScanLog(since.Add(-time.Hour), int64(len(noise))+20)
	if len(scan.ListErrors) != 0 || len(scan.Files) != 1 {
		t.Errorf("tail only: %+v", scan)
	}
	// No file: nothing read, no error.
	if err := os.Remove(log); err != nil {
		t.Fatal(err)
	}
	if scan := c.ScanLog(since, 1<<20); len(scan.Files) != 0 || scan.Err != nil {
		t.Errorf("no file: %+v", scan)
	}
}
