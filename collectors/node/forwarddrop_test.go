package node

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// Config.ForwardDrop replaces the reading of every backend; the result is judged and published
// as the commands' would be, timed by Config.Now.
func TestForwardDropFromConfig(t *testing.T) {
	for _, tc := range []struct {
		name     string
		backends []Backend
		want     string // the gauge's line; "" when it is absent
		wantErr  string
	}{
		{"found in one backend", []Backend{
			{Name: "iptables-legacy"},
			{Name: "iptables-nft", DropPath: []string{"iptables-nft filter FORWARD", "-A FORWARD -j KUBE-FORWARD", "-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP"}},
			{Name: "nftables", Err: errors.New("nft: permission denied")},
		}, "proxyhealth_invalid_drop_rule_present 1\n", ""},
		{"none where read", []Backend{{Name: "iptables-legacy"}, {Name: "iptables-nft"}, {Name: "nftables", Missing: true}},
			"proxyhealth_invalid_drop_rule_present 0\n", ""},
		{"nothing readable", []Backend{{Name: "iptables", Missing: true, Err: errors.New("not found")}, {Name: "nftables", Err: errors.New("nft: permission denied")}},
			"", "no backend could be read"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := New(Config{ProcPath: "testdata/proc-full", RulesCheckInterval: time.Hour, CommandTimeout: time.Second,
				Run: func(context.Context, string, ...string) ([]byte, error) {
					t.Error("a command ran although Config.ForwardDrop is set")
					return nil, errors.New("no commands here")
				},
				ForwardDrop: func(context.Context) []Backend { return tc.backends },
				Now:         func() time.Time { return time.Unix(1700000000, 0) }}, nil)
			if err != nil {
				t.Fatal(err)
			}
			c.CheckRules(context.Background())
			a := &adapter{c: c}
			want := rulesHelp + "proxyhealth_node_rules_last_check_timestamp_seconds 1.7e+09\n" + tc.want
			if err := testutil.CollectAndCompare(a, strings.NewReader(want), "proxyhealth_invalid_drop_rule_present", "proxyhealth_node_rules_last_check_timestamp_seconds"); err != nil {
				t.Error(err)
			}
			if (a.err == nil) != (tc.wantErr == "") || a.err != nil && !strings.Contains(a.err.Error(), tc.wantErr) {
				t.Errorf("Update error %v, want %q", a.err, tc.wantErr)
			}
		})
	}
}
