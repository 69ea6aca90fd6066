package node

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/proxyhealth/proxyhealth/internal/hostrules"
	"github.com/proxyhealth/proxyhealth/internal/ruleset"
)

// adapter lets testutil collect a proxyhealth collector; it records Update's error.
type adapter struct {
	c   *Collector
	err error
}

func (a *adapter) Describe(chan<- *prometheus.Desc) {}
func (a *adapter) Collect(ch chan<- prometheus.Metric) {
	a.err = a.c.Update(ch)
}

const sysctlHelp = `# HELP proxyhealth_bridge_nf_call_ip6tables net.bridge.bridge-nf-call-ip6tables, read from <procfs>/sys/net/bridge/bridge-nf-call-ip6tables: 1 when bridged IPv6 traffic passes ip6tables, 0 when it does not, -1 when the file does not exist (br_netfilter not loaded).
# TYPE proxyhealth_bridge_nf_call_ip6tables gauge
# HELP proxyhealth_bridge_nf_call_iptables net.bridge.bridge-nf-call-iptables, read from <procfs>/sys/net/bridge/bridge-nf-call-iptables: 1 when bridged IPv4 traffic passes iptables, 0 when it does not (replies between pods on the same bridge then escape un-NATed), -1 when the file does not exist (br_netfilter not loaded, same effect as 0).
# TYPE proxyhealth_bridge_nf_call_iptables gauge
# HELP proxyhealth_conntrack_events_setting net.netfilter.nf_conntrack_events, read from <procfs>/sys/net/netfilter/nf_conntrack_events: 0 off (the conntrack event listener sees nothing), 1 on, 2 on while a listener exists.
# TYPE proxyhealth_conntrack_events_setting gauge
# HELP proxyhealth_conntrack_tcp_be_liberal net.netfilter.nf_conntrack_tcp_be_liberal, read from <procfs>/sys/net/netfilter/nf_conntrack_tcp_be_liberal: 1 when conntrack does not mark out-of-window TCP packets INVALID.
# TYPE proxyhealth_conntrack_tcp_be_liberal gauge
`

const rulesHelp = `# HELP proxyhealth_invalid_drop_rule_present 1 when a rule dropping conntrack INVALID packets is reachable from the forward path in any active backend: the filter FORWARD chain of iptables-legacy or iptables-nft, or a native nftables base chain on the forward hook. Followed as the rules change.
# TYPE proxyhealth_invalid_drop_rule_present gauge
# HELP proxyhealth_node_rules_last_check_timestamp_seconds Unix time when the node's netfilter rules behind proxyhealth_invalid_drop_rule_present were last read.
# TYPE proxyhealth_node_rules_last_check_timestamp_seconds gauge
`

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
proxyhealth_conntrack_events_setting 2
proxyhealth_conntrack_tcp_be_liberal 0
`, ""},
		{"proc-no-br-netfilter", `
proxyhealth_bridge_nf_call_ip6tables -1
proxyhealth_bridge_nf_call_iptables -1
proxyhealth_conntrack_events_setting 0
proxyhealth_conntrack_tcp_be_liberal 1
`, ""},
		{"proc-no-conntrack", `
proxyhealth_bridge_nf_call_ip6tables 0
proxyhealth_bridge_nf_call_iptables 0
`, "conntrack sysctls not found under testdata/proc-no-conntrack/sys/net/netfilter (nf_conntrack_tcp_be_liberal, nf_conntrack_events): is nf_conntrack loaded?"},
		{"proc-garbage", `
proxyhealth_bridge_nf_call_ip6tables 1
proxyhealth_conntrack_events_setting 1
proxyhealth_conntrack_tcp_be_liberal 0
`, `testdata/proc-garbage/sys/net/bridge/bridge-nf-call-iptables: not an integer: "yes"`},
	}
	for _, tt := range tests {
		t.Run(tt.proc, func(t *testing.T) {
			a := &adapter{c: newTestCollector(t, filepath.Join("testdata", tt.proc))}
			if err := testutil.CollectAndCompare(a, strings.NewReader(sysctlHelp+tt.want)); err != nil {
				t.Error(err)
			}
			if tt.wantErr == "" && a.err != nil {
				t.Errorf("unexpected error %v", a.err)
			}
			if tt.wantErr != "" && (a.err == nil || a.err.Error() != tt.wantErr) {
				t.Errorf("error = %v, want %q", a.err, tt.wantErr)
			}
		})
	}
}

func TestNewDefaults(t *testing.T) {
	c, err := New(Config{}, nil)
	if err != nil || c.cfg.ProcPath != "/proc" {
		t.Errorf("defaults not applied: %+v %v", c, err)
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
			a := &adapter{c: c}
			want := rulesHelp + "proxyhealth_node_rules_last_check_timestamp_seconds 1.7000000005e+09\n"
			if tt.value != "" {
				want += "proxyhealth_invalid_drop_rule_present " + tt.value + "\n"
			}
			if err := testutil.CollectAndCompare(a, strings.NewReader(want), "proxyhealth_invalid_drop_rule_present", "proxyhealth_node_rules_last_check_timestamp_seconds"); err != nil {
				t.Error(err)
			}
			switch {
			case tt.wantErr == "" && a.err != nil:
				t.Errorf("unexpected error: %v", a.err)
			case tt.wantErr != "" && (a.err == nil || !strings.Contains(a.err.Error(), tt.wantErr)):
				t.Errorf("error = %v, want it to contain %q", a.err, tt.wantErr)
			}
		})
	}
	// Not read yet: neither metric, no error.
	c, _ := New(Config{ProcPath: "testdata/proc-full", Rules: fakeRules{}}, nil)
	a := &adapter{c: c}
	if n := testutil.CollectAndCount(a, "proxyhealth_invalid_drop_rule_present", "proxyhealth_node_rules_last_check_timestamp_seconds"); n != 0 || a.err != nil {
		t.Errorf("before the first read: %d series, error %v", n, a.err)
	}
}

func TestParseSysctl(t *testing.T) {
	for in, want := range map[string]int64{"1\n": 1, "0": 0, " 2 \n": 2, "-1\n": -1} {
		if got, err := parseSysctl([]byte(in)); err != nil || got != want {
			t.Errorf("%q: %d %v", in, got, err)
		}
	}
	for _, in := range []string{"", "x", "1 2", "1.5"} {
		if _, err := parseSysctl([]byte(in)); err == nil {
			t.Errorf("%q: want error", in)
		}
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
	a := &adapter{c: c}
	if n := testutil.CollectAndCount(a, "proxyhealth_invalid_drop_rule_present"); n != 0 || a.err == nil || !strings.Contains(a.err.Error(), "stuck") {
		t.Errorf("stuck reader: %d drop series, error %v; want none and the reason", n, a.err)
	}
}
