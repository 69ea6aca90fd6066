package nftnl

import (
	"bytes"
	"net/netip"

	"github.com/proxyhealth/proxyhealth/internal/kubeproxynames"
	"github.com/proxyhealth/proxyhealth/internal/ruleset"
)

// natRule is what one rule of kube-proxy's iptables-nft chains means to a Follower, whichever
// chain holds it: the service port it dispatches (read in KUBE-SERVICES), the endpoint chain
// it jumps to (read in a service chain), its DNAT destination (read in an endpoint chain).
// The watch's decoder hands out one natRule per rule body; it is never modified.
type natRule struct {
	svc  *ruleset.Service // nil: not a dispatch rule
	sep  string           // "": no jump to an endpoint chain
	dnat netip.AddrPort   // invalid: no DNAT
}

// natRuleDecoder decodes the kept chains' rule messages on the watch's goroutine. kube-proxy
// writes the same rules again and again (KUBE-SERVICES at every sync, the endpoint chains of
// a changed service), so each rule body (its expressions and user data, the bytes after
// table, chain and handle) is decoded once and remembered.
type natRuleDecoder struct {
	interps map[uint8]*interp // by family
	bodies  map[string]*decodedBody
	commit  uint64 // commits seen
	used    int    // bodies used in the current commit
}

type decodedBody struct {
	rule     *natRule
	lastUsed uint64 // the commit that last used it
}

func newNATRuleDecoder() *natRuleDecoder {
	return &natRuleDecoder{interps: map[uint8]*interp{}, bodies: map[string]*decodedBody{}}
}

// keeps selects the iptables-nft chains whose rule messages a Follower applies: KUBE-SERVICES,
// which kube-proxy rewrites whole at every sync, and the service and endpoint chains, which it
// rewrites whole when their service changed.
func (dd *natRuleDecoder) keeps(t Table, chain []byte) bool {
	return t.Name == "nat" && (bytes.Equal(chain, chainServices) || kubeproxynames.IsIPTablesServiceChainBytes(chain) || kubeproxynames.IsIPTablesEndpointChainBytes(chain))
}

func (dd *natRuleDecoder) decode(t Table, attrs []byte) (*natRule, error) {
	r, err := parseRule(attrs)
	if err != nil {
		return nil, err
	}
	if b, ok := dd.bodies[string(r.body)]; ok && r.body != nil {
		if b.lastUsed != dd.commit {
			b.lastUsed = dd.commit
			dd.used++
		}
		return b.rule, nil
	}
	in := dd.interps[t.Family]
	if in == nil {
		in = &interp{family: t.Family}
		dd.interps[t.Family] = in
	}
	f, err := in.rule(r.exprs)
	if err != nil {
		return nil, err
	}
	rule := &natRule{}
	if s, ok := serviceOf(&r, f); ok {
		rule.svc = &s
	}
	if target := sepTarget(f); target != nil {
		rule.sep = string(target)
	}
	if f.hasDNAT {
		rule.dnat = f.dnat
	}
	if r.body != nil {
		dd.bodies[string(r.body)] = &decodedBody{rule: rule, lastUsed: dd.commit}
		dd.used++
	}
	return rule, nil
}

// commitEnd forgets the bodies of rules long gone once they outnumber the commit's own,
// generously: a commit that rewrote KUBE-SERVICES used every body of the rules it holds now.
func (dd *natRuleDecoder) commitEnd() {
	if dd.used > 0 && len(dd.bodies) > 2*dd.used+64 {
		for k, b := range dd.bodies {
			if b.lastUsed != dd.commit {
				delete(dd.bodies, k)
			}
		}
	}
	dd.commit++
	dd.used = 0
}
