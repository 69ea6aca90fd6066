package exporter

import (
	"testing"

	"github.com/alecthomas/kingpin/v2"
	"github.com/prometheus/common/promslog"

	"github.com/proxyhealth/proxyhealth/internal/iptlegacy"
	"github.com/proxyhealth/proxyhealth/internal/nftnl"
)

// The netfilter read limit flags are the netfilter reader's Config: their defaults are the
// readers' own, and a value given is handed on as it is.
func TestNetfilterLimitFlags(t *testing.T) {
	for _, tc := range []struct {
		name        string
		args        []string
		dump, table int64
	}{
		{"defaults", nil, nftnl.DefaultMaxDumpBytes, iptlegacy.DefaultMaxTableBytes},
		{"given", []string{"--netfilter.max-dump-bytes=4096", "--netfilter.legacy-max-table-bytes=8192"}, 4096, 8192},
	} {
		t.Run(tc.name, func(t *testing.T) {
			app := kingpin.New("test", "")
			_, _, host := registrations(app, addPathFlags(app))
			host.logger = promslog.NewNopLogger()
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
		})
	}
}
