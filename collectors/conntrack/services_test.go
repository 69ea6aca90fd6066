package conntrack

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/prometheus/common/promslog"
	"github.com/proxyhealth/proxyhealth/internal/hostrules"
	"github.com/proxyhealth/proxyhealth/internal/ruleset"
)

// rulesAt serves one read of the node's netfilter state.
type rulesAt struct{ st *hostrules.State }

func (r *rulesAt) State() *hostrules.State { return r.st }

func TestRulesServicesLoad(t *testing.T) {
	// kube-proxy's KUBE-SERVICES as read: kube-dns named by its comments, the kubernetes
	// Service without one (kube-proxy drops them above 1,000 endpoints).
	dns := netip.MustParseAddr("10.96.0.10")
	rules := &rulesAt{&hostrules.State{Seq: 1, Mode: hostrules.ModeIPTables, Backend: hostrules.BackendIPTablesNFT,
		Proxy: map[bool]*ruleset.ProxyTable{false: {Services: []ruleset.Service{
			{ClusterIP: dns, Port: 53, Protocol: ruleset.ProtoUDP, Namespace: "kube-system", Name: "kube-dns", PortName: "dns"},
			{ClusterIP: dns, Port: 53, Protocol: ruleset.ProtoTCP, Namespace: "kube-system", Name: "kube-dns", PortName: "dns-tcp"},
			{ClusterIP: netip.MustParseAddr("10.96.0.1"), Port: 443, Protocol: ruleset.ProtoTCP},
		}}}}}
	k := newRulesServices(rules, promslog.NewNopLogger(), false)
	m, _, changed := k.load()
	if !changed || m.Len() != 3 {
		t.Fatalf("first load: Len() = %d, changed %v; want 3, true", m.Len(), changed)
	}
	if svc, ok := m.Lookup(dns, 53, ruleset.ProtoUDP); !ok || svc != (Service{"kube-system", "kube-dns", 53}) {
		t.Errorf("Lookup(dns udp) = %+v, %v", svc, ok)
	}
	if svc, ok := m.Lookup(netip.MustParseAddr("10.96.0.1"), 443, ruleset.ProtoTCP); !ok || svc.Port != 443 || svc.Name != "" {
		t.Errorf("Lookup(uncommented) = %+v, %v", svc, ok)
	}
	if _, _, changed := k.load(); changed {
		t.Error("the same read loaded twice reports a change")
	}
	if !strings.Contains(k.lastNote, "3 Service ports") {
		t.Errorf("note %q", k.lastNote)
	}
	// A refusal is passed on in the log, not taken for "no kube-proxy".
	rules.st = &hostrules.State{Seq: 2, Mode: hostrules.ModeNone, ProxyErr: errors.New("operation not permitted")}
	if m, _, changed := k.load(); !changed || m.Len() != 0 || !strings.Contains(k.lastNote, "operation not permitted") {
		t.Errorf("refused: Len() %d, changed %v, note %q", m.Len(), changed, k.lastNote)
	}
	// No reader at all: flows stay unattributed until the API view syncs.
	k = newRulesServices(nil, promslog.NewNopLogger(), false)
	if m, _, _ := k.load(); m.Len() != 0 || !strings.Contains(k.lastNote, "not read") {
		t.Errorf("no reader: Len() %d, note %q", m.Len(), k.lastNote)
	}
}
