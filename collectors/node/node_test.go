package node

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/proxyhealth/proxyhealth/collectors/collectortest"
	"github.com/proxyhealth/proxyhealth/internal/hostrules"
	"github.com/proxyhealth/proxyhealth/internal/ruleset"
)

func newTestCollector(t *testing.T, proc string) *Collector {
	t.Helper()
	c, err := New(Config{ProcPath: proc}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestSysctls(t *testing.T) {
	tests := []struct {
		proc    string
		want    string
		wantErr string
	}{
		{"proc-full", `
proxyhealth_bridge_nf_call_ip6tables 1
proxyhealth_bridge_nf_call_iptables 1
`, ""},
		{"proc-no-br-netfilter", `
proxyhealth_bridge_nf_call_ip6tables -1
proxyhealth_bridge_nf_call_iptables -1
`, ""},
		// conntrack's settings are the conntrack collector's: nf_conntrack not loaded is no
		// failure here.
		{"proc-no-conntrack", `
proxyhealth_bridge_nf_call_ip6tables 0
proxyhealth_bridge_nf_call_iptables 0
`, ""},
		{"proc-garbage", `
proxyhealth_bridge_nf_call_ip6tables 1
`, `testdata/proc-garbage/sys/net/bridge/bridge-nf-call-iptables: not an integer: "yes"`},
	}
	for _, tt := range tests {
		t.Run(tt.proc, func(t *testing.T) {
			got, err := collectortest.Collect(t, newTestCollector(t, filepath.Join("testdata", tt.proc)))
			if err := got.Compare(tt.want); err != nil {
				t.Error(err)
			}
			if tt.wantErr == "" && err != nil {
				t.Errorf("unexpected error %v", err)
			}
			if tt.wantErr != "" && (err == nil || err.Error() != tt.wantErr) {
				t.Errorf("error = %v, want %q", err, tt.wantErr)
			}
		})
	}
}

func TestConfigValidation(t *testing.T) {
	if _, err := New(Config{}, nil); err == nil || !strings.Contains(err.Error(), "--path.procfs") {
		t.Errorf("New without a procfs mountpoint: %v, want an error naming --path.procfs", err)
	}
}

// fakeRules serves one read of the node's netfilter state.
type fakeRules struct{ st *hostrules.State }

func (f fakeRules) State() *hostrules.State { return f.st }

// kubeProxyForward is iptables' filter table as kube-proxy leaves it when be_liberal is off:
// FORWARD jumps to KUBE-FORWARD, whose first rule drops INVALID packets.
func kubeProxyForward(name string) *ruleset.Graph {
	return &ruleset.Graph{Name: name, Entries: []string{"FORWARD"}, Chains: map[string]*ruleset.Chain{
		"FORWARD": {Name: "FORWARD", Rules: []ruleset.Rule{
			{Desc: "-A FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD", Verdict: ruleset.Verdict{Kind: ruleset.Jump, Target: "KUBE-FORWARD"}},
		}},
		"KUBE-FORWARD": {Name: "KUBE-FORWARD", Rules: []ruleset.Rule{
			{Desc: "-A KUBE-FORWARD -m conntrack --ctstate INVALID -m nfacct --nfacct-name ct_state_invalid_dropped_pkts -j DROP", Ct: ruleset.CtInvalid, Verdict: ruleset.Verdict{Kind: ruleset.Drop}},
		}},
	}}
}

func acceptAll(name string) *ruleset.Graph {
	return &ruleset.Graph{Name: name, Entries: []string{"forward"}, Chains: map[string]*ruleset.Chain{
		"forward": {Name: "forward", Rules: []ruleset.Rule{{Desc: "accept", Verdict: ruleset.Verdict{Kind: ruleset.Accept}}}},
	}}
}

func TestInvalidDropRule(t *testing.T) {
	refused := errors.New("operation not permitted (needs CAP_NET_ADMIN)")
	forward := func(legacy, iptNFT, native hostrules.Forward) *hostrules.State {
		legacy.Backend, iptNFT.Backend, native.Backend = hostrules.BackendLegacy, hostrules.BackendIPTablesNFT, hostrules.BackendNFTables
		return &hostrules.State{At: time.Unix(1700000000, 500000000), Forward: []hostrules.Forward{legacy, iptNFT, native}}
	}
	g := func(gs ...*ruleset.Graph) hostrules.Forward { return hostrules.Forward{Graphs: gs} }
	failed := hostrules.Forward{Err: refused}
	tests := []struct {
		name    string
		st      *hostrules.State
		value   string // "" when the metric must be absent
		wantErr string // substring; "" for no error
	}{
		{name: "kube-proxy's drop in iptables-nft", st: forward(g(), g(kubeProxyForward("iptables-nft filter")), g(acceptAll("inet fw"))), value: "1"},
		{name: "drop in iptables-legacy only", st: forward(g(kubeProxyForward("iptables-legacy filter")), g(), g()), value: "1"},
		{name: "drop in a native table only", st: forward(g(), g(acceptAll("iptables-nft filter")), g(acceptAll("inet a"), kubeProxyForward("inet b"))), value: "1"},
		{name: "no drop anywhere", st: forward(g(), g(acceptAll("iptables-nft filter")), g()), value: "0"},
		// internal/hostrules says so of a kernel without nf_tables: its backends are not in use.
		{name: "no nf_tables: the legacy table alone answers", st: forward(g(acceptAll("iptables-legacy filter")), g(), g()), value: "0"},
		{name: "nothing could be read", st: forward(failed, failed, failed), wantErr: "no backend could be read: iptables-legacy: operation not permitted"},
		{name: "one backend unreadable: no drop elsewhere is not certain", st: forward(failed, g(), g()), value: "0",
			wantErr: "invalid drop rule check incomplete, no drop found in what could be read: iptables-legacy: operation not permitted"},
		{name: "a drop found is certain whatever else failed", st: forward(failed, g(kubeProxyForward("iptables-nft filter")), failed), value: "1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := New(Config{ProcPath: "testdata/proc-full", Rules: fakeRules{tt.st}}, nil)
			if err != nil {
				t.Fatal(err)
			}
			got, err := collectortest.Collect(t, c)
			want := "proxyhealth_node_rules_last_check_timestamp_seconds 1.7000000005e+09\n"
			if tt.value != "" {
				want += "proxyhealth_invalid_drop_rule_present " + tt.value + "\n"
			}
			if err := got.Compare(want, "proxyhealth_invalid_drop_rule_present", "proxyhealth_node_rules_last_check_timestamp_seconds"); err != nil {
				t.Error(err)
			}
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("unexpected error: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("error = %v, want it to contain %q", err, tt.wantErr)
			}
		})
	}
	// Not read yet: neither metric, no error.
	c, _ := New(Config{ProcPath: "testdata/proc-full", Rules: fakeRules{}}, nil)
	got, err := collectortest.Collect(t, c)
	if n := got.Count("proxyhealth_invalid_drop_rule_present", "proxyhealth_node_rules_last_check_timestamp_seconds"); n != 0 || err != nil {
		t.Errorf("before the first read: %d series, error %v", n, err)
	}
}

// stuckRules is a netfilter reader whose loop has stopped.
type stuckRules struct{ fakeRules }

func (stuckRules) Stalled() error { return errors.New("the netfilter reader is stuck") }

// A stuck reader's last read is not served as current: the drop gauge goes, the reason stays.
func TestInvalidDropRuleReaderStuck(t *testing.T) {
	st := &hostrules.State{At: time.Unix(1700000000, 0), Forward: []hostrules.Forward{{Backend: hostrules.BackendIPTablesNFT,
		Graphs: []*ruleset.Graph{kubeProxyForward("iptables-nft filter")}}}}
	c, err := New(Config{ProcPath: "testdata/proc-full", Rules: stuckRules{fakeRules{st}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := collectortest.Collect(t, c)
	if n := got.Count("proxyhealth_invalid_drop_rule_present"); n != 0 || err == nil || !strings.Contains(err.Error(), "stuck") {
		t.Errorf("stuck reader: %d drop series, error %v; want none and the reason", n, err)
	}
}
