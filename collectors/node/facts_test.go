package node

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/proxyhealth/proxyhealth/internal/hostrules"
	"github.com/proxyhealth/proxyhealth/internal/ruleset"
)

func TestSettings(t *testing.T) {
	st := func(fwd ...hostrules.Forward) *hostrules.State {
		return &hostrules.State{At: time.Unix(1, 0), Forward: fwd}
	}
	withDrop := st(hostrules.Forward{Backend: hostrules.BackendIPTablesNFT, Graphs: []*ruleset.Graph{kubeProxyForward("iptables-nft filter")}})
	noDrop := st(hostrules.Forward{Backend: hostrules.BackendIPTablesNFT, Graphs: []*ruleset.Graph{acceptAll("iptables-nft filter")}})
	partial := st(hostrules.Forward{Backend: hostrules.BackendLegacy, Err: errors.New("operation not permitted")},
		hostrules.Forward{Backend: hostrules.BackendIPTablesNFT, Graphs: []*ruleset.Graph{acceptAll("iptables-nft filter")}})

	c, _ := New(Config{ProcPath: "testdata/proc-full", Rules: fakeRules{withDrop}}, nil)
	s := c.Settings()
	if s.Err != nil || *s.BridgeNFCallIptables != 1 || *s.TCPBeLiberal != 0 || *s.ConntrackEvents != 2 {
		t.Errorf("proc-full: %+v", s)
	}
	if s.InvalidDrop == nil || !*s.InvalidDrop || !strings.HasPrefix(s.InvalidDropPath, "iptables-nft: ") || s.RulesErr != nil {
		t.Errorf("drop: %v %q %v", s.InvalidDrop, s.InvalidDropPath, s.RulesErr)
	}

	c, _ = New(Config{ProcPath: "testdata/proc-full", Rules: fakeRules{noDrop}}, nil)
	if s := c.Settings(); s.InvalidDrop == nil || *s.InvalidDrop {
		t.Errorf("no drop: %v", s.InvalidDrop)
	}
	// Not every backend read and no drop found: unknown, not absent.
	c, _ = New(Config{ProcPath: "testdata/proc-full", Rules: fakeRules{partial}}, nil)
	if s := c.Settings(); s.InvalidDrop != nil || s.RulesErr == nil || !strings.Contains(s.RulesErr.Error(), "operation not permitted") {
		t.Errorf("partial read: %v %v", s.InvalidDrop, s.RulesErr)
	}
	c, _ = New(Config{ProcPath: "testdata/proc-full", Rules: fakeRules{}}, nil)
	if s := c.Settings(); s.InvalidDrop != nil || s.RulesErr == nil {
		t.Errorf("rules not read yet: %v %v", s.InvalidDrop, s.RulesErr)
	}

	c, _ = New(Config{ProcPath: "testdata/proc-no-br-netfilter"}, nil)
	s = c.Settings()
	if *s.BridgeNFCallIptables != -1 || *s.TCPBeLiberal != 1 || *s.ConntrackEvents != 0 || s.Err != nil || s.RulesErr == nil {
		t.Errorf("no br_netfilter: %+v", s)
	}
	c, _ = New(Config{ProcPath: "testdata/proc-no-conntrack"}, nil)
	s = c.Settings()
	if *s.BridgeNFCallIptables != 0 || s.TCPBeLiberal != nil || s.ConntrackEvents != nil || s.Err == nil {
		t.Errorf("no conntrack: %+v", s)
	}
	c, _ = New(Config{ProcPath: "testdata/proc-garbage"}, nil)
	if s := c.Settings(); s.BridgeNFCallIptables != nil || s.Err == nil || *s.TCPBeLiberal != 0 {
		t.Errorf("garbage: %+v", s)
	}
}
