package conntrack

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/common/promslog"

	"github.com/proxyhealth/proxyhealth/collectors/collectortest"
)

// conntrack's settings, read from procfs on every scrape: served when read, an error naming
// what is missing or unreadable otherwise, and the rest of the collector serves either way.
func TestSettings(t *testing.T) {
	garbage := t.TempDir()
	netfilter := filepath.Join(garbage, "sys/net/netfilter")
	if err := os.MkdirAll(netfilter, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range map[string]string{"nf_conntrack_tcp_be_liberal": "1\n", "nf_conntrack_events": "yes\n"} {
		if err := os.WriteFile(filepath.Join(netfilter, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	noConntrack := t.TempDir()
	for _, tt := range []struct {
		name, proc, want, wantErr string
	}{
		{"nf_conntrack loaded", "testdata/proc-full", `
proxyhealth_conntrack_events_setting 2
proxyhealth_conntrack_tcp_be_liberal 0
`, ""},
		{"nf_conntrack not loaded", noConntrack, "", "conntrack sysctls not found under " + filepath.Join(noConntrack, "sys/net/netfilter") +
			" (nf_conntrack_tcp_be_liberal, nf_conntrack_events): is nf_conntrack loaded?"},
		{"unreadable setting", garbage, `
proxyhealth_conntrack_tcp_be_liberal 1
`, filepath.Join(netfilter, "nf_conntrack_events") + `: not an integer: "yes"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, err := New(Config{ProcPath: tt.proc, TableStats: true, UnrepliedAfter: time.Second, MaxTrackedFlows: 10, SocketBufferBytes: 1,
				ServiceRefreshInterval: time.Hour}, promslog.NewNopLogger())
			if err != nil {
				t.Fatal(err)
			}
			c.stats = func() (tableStats, error) { return tableStats{entries: 1}, nil }
			got, err := collectortest.Collect(t, c)
			if err := got.Compare(tt.want, "proxyhealth_conntrack_events_setting", "proxyhealth_conntrack_tcp_be_liberal"); err != nil {
				t.Error(err)
			}
			if v, ok := got.Value("proxyhealth_conntrack_entries"); !ok || v != 1 {
				t.Errorf("the table's fill: %v, %v; want it served whatever the settings", v, ok)
			}
			if got := fmt.Sprint(err); (err != nil || tt.wantErr != "") && got != tt.wantErr {
				t.Errorf("error = %s, want %q", got, tt.wantErr)
			}
		})
	}
}
