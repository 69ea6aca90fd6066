package nftnl

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/proxyhealth/proxyhealth/internal/kubeproxynames"
	"github.com/proxyhealth/proxyhealth/internal/ruleset"
)

func nfproto(ipv6 bool) uint8 {
	if ipv6 {
		return unix.NFPROTO_IPV6
	}
	return unix.NFPROTO_IPV4
}

// ReadIPTablesNAT reads kube-proxy's iptables-mode rules that iptables-nft wrote into table
// `ip nat` (`ip6 nat` with ipv6). It returns nil, nil when the table or its KUBE-SERVICES
// chain (kube-proxy's mark on it) does not exist. lim bounds each reply.
func ReadIPTablesNAT(ctx context.Context, ipv6 bool, lim Limits) (*ruleset.ProxyTable, error) {
	var pt *ruleset.ProxyTable
	err := withSocket(lim, func(q querier) error {
		var err error
		pt, err = readIPTablesNAT(ctx, q, nfproto(ipv6))
		return err
	})
	return pt, err
}

func readIPTablesNAT(ctx context.Context, q querier, family uint8) (*ruleset.ProxyTable, error) {
	var pt *ruleset.ProxyTable
	err := consistently(ctx, q, func() error {
		ok, err := exists(ctx, q, family, "nat", "KUBE-SERVICES")
		if err != nil || !ok {
			pt = nil
			return err
		}
		nr := newNATReader(family)
		if err := dumpRules(ctx, q, family, "nat", "", nr.rule); err != nil {
			return err
		}
		pt = nr.result()
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read %s nat table: %w", familyName(family), err)
	}
	return pt, nil
}

// natReader keeps, while the nat table streams by, only what the ProxyTable needs: each
// service chain's endpoint chain jumps (as indexes into one list of endpoint chain names, so a
// name is held once however many chains jump to it), each endpoint chain's DNAT destination,
// and the dispatch rules of KUBE-SERVICES. It also counts each service and endpoint chain's
// rules: a Follower takes a chain's new rules from the watch's messages only when the commit
// deleted as many as the chain had.
type natReader struct {
	in       interp
	sepIndex map[string]int32
	sepDNAT  []netip.AddrPort // by sepIndex; invalid until the chain's DNAT rule is seen
	sepRules []int32          // by sepIndex: the endpoint chain's rules
	jumps    map[string]svcJumps
	services []ruleset.Service
	handles  []uint64 // the rule handle of each of services
}

// svcJumps is one service chain's jumps to endpoint chains (sepIndex values) and its rules.
type svcJumps struct {
	seps  []int32
	rules int32
}

func newNATReader(family uint8) *natReader {
	return &natReader{in: interp{family: family}, sepIndex: map[string]int32{}, jumps: map[string]svcJumps{}}
}

var (
	chainServices = []byte("KUBE-SERVICES")
	prefixKubeS   = []byte("KUBE-S") // of KUBE-SERVICES and every service and endpoint chain
)

// sep returns the index of endpoint chain name, adding it.
func (nr *natReader) sep(name []byte) int32 {
	if i, ok := nr.sepIndex[string(name)]; ok {
		return i
	}
	i := int32(len(nr.sepDNAT))
	nr.sepIndex[string(name)] = i
	nr.sepDNAT = append(nr.sepDNAT, netip.AddrPort{})
	nr.sepRules = append(nr.sepRules, 0)
	return i
}

// sepNames names endpoint chains by their indexes; names is sepIndex inverted.
func sepNames(seps []int32, names []string) []string {
	out := make([]string, len(seps))
	for k, i := range seps {
		out[k] = names[i]
	}
	return out
}

func (nr *natReader) rule(r *ruleMsg) error {
	if !bytes.HasPrefix(r.chain, prefixKubeS) {
		return nil // KUBE-MARK-MASQ, KUBE-POSTROUTING, KUBE-NODEPORTS, KUBE-EXT-*, ...
	}
	svc := kubeproxynames.IsIPTablesServiceChainBytes(r.chain)
	sep := kubeproxynames.IsIPTablesEndpointChainBytes(r.chain)
	services := bytes.Equal(r.chain, chainServices)
	if !svc && !sep && !services {
		return nil
	}
	f, err := nr.in.rule(r.exprs)
	if err != nil {
		return fmt.Errorf("chain %s handle %d: %w", r.chain, r.handle, err)
	}
	switch {
	case svc:
		j := nr.jumps[string(r.chain)] // a chain with rules is listed even when none jumps to an endpoint
		if t := sepTarget(f); t != nil {
			j.seps = append(j.seps, nr.sep(t))
		}
		j.rules++
		nr.jumps[string(r.chain)] = j
	case sep:
		i := nr.sep(r.chain)
		nr.sepRules[i]++
		if f.hasDNAT && !nr.sepDNAT[i].IsValid() {
			nr.sepDNAT[i] = f.dnat
		}
	case services:
		if s, ok := serviceOf(r, f); ok {
			nr.services = append(nr.services, s)
			nr.handles = append(nr.handles, r.handle)
		}
	}
	return nil
}

// sepTarget is the endpoint chain a rule jumps to, nil when it jumps to none.
func sepTarget(f *ruleFacts) []byte {
	if (f.verdict == ruleset.Jump || f.verdict == ruleset.Goto) && kubeproxynames.IsIPTablesEndpointChainBytes(f.target) {
		return f.target
	}
	return nil
}

// serviceOf reads a KUBE-SERVICES rule that dispatches a cluster IP service port:
// `-d VIP/32 -p PROTO -m PROTO --dport PORT -j KUBE-SVC-...|KUBE-SVL-...`.
func serviceOf(r *ruleMsg, f *ruleFacts) (ruleset.Service, bool) {
	if f.verdict != ruleset.Jump && f.verdict != ruleset.Goto || !kubeproxynames.IsIPTablesServiceChainBytes(f.target) {
		return ruleset.Service{}, false
	}
	if f.otherDispatch || !f.daddr.IsValid() || !f.hasProto || !f.hasDport || f.dport == 0 {
		return ruleset.Service{}, false
	}
	s := ruleset.Service{ClusterIP: f.daddr, Port: f.dport, Protocol: f.proto, Chain: string(f.target)}
	comment, ok := ruleComment(r.userdata)
	if !ok {
		comment = f.comment
	}
	s.Namespace, s.Name, s.PortName = kubeproxynames.ParseServiceCommentBytes(comment)
	return s, true
}

func (nr *natReader) result() *ruleset.ProxyTable {
	sortServices(nr.services)
	pt := &ruleset.ProxyTable{Chains: make(map[string][]netip.AddrPort, len(nr.jumps)), Services: nr.services}
	for chain, j := range nr.jumps {
		eps := make([]netip.AddrPort, 0, len(j.seps))
		for _, i := range j.seps {
			if ap := nr.sepDNAT[i]; ap.IsValid() {
				eps = append(eps, ap)
			}
		}
		slices.SortFunc(eps, netip.AddrPort.Compare)
		pt.Chains[chain] = slices.Compact(eps)
	}
	return pt
}

func familyName(family uint8) string {
	switch family {
	case unix.NFPROTO_IPV4:
		return "ip"
	case unix.NFPROTO_IPV6:
		return "ip6"
	case unix.NFPROTO_INET:
		return "inet"
	case unix.NFPROTO_ARP:
		return "arp"
	case unix.NFPROTO_BRIDGE:
		return "bridge"
	case unix.NFPROTO_NETDEV:
		return "netdev"
	}
	return fmt.Sprintf("family%d", family)
}
