package iptlegacy

import (
	"net/netip"
	"slices"
	"sort"

	"github.com/proxyhealth/proxyhealth/internal/kubeproxynames"
	"github.com/proxyhealth/proxyhealth/internal/ruleset"
)

// decodeNAT reduces kube-proxy's nat table to a ProxyTable in one pass over the blob, keeping
// per rule only what the result needs: which KUBE-SEP chain each service chain rule jumps to
// (as a blob offset), each KUBE-SEP chain's DNAT destination, and the KUBE-SERVICES rules
// that jump to a service chain. Jumps name chains by offset and may point forward (KUBE-SVC
// chains come after KUBE-SERVICES), so they are resolved at the end. hasServices reports the
// KUBE-SERVICES chain, kube-proxy's mark on the table. release is passed on to walk.
//
// The result equals what collectors/rules reads from iptables-save's text: a service chain's
// endpoints are the first parseable DNAT destination (one address and one port) of each
// KUBE-SEP chain a rule of it jumps or goes to; service ports are read as
// internal/testsupport/iptables.KubeServices reads them.
func decodeNAT(info *Info, blob []byte, release func(int)) (pt *ruleset.ProxyTable, hasServices bool, err error) {
	d := natDecoder{l: layoutFor(info.IPv6)}
	if err := walk(info, blob, &d, release); err != nil {
		return nil, d.hasServices, err
	}
	return d.result(), d.hasServices, nil
}

type natChainKind uint8

const (
	natOther natChainKind = iota
	natServices
	natService  // KUBE-SVC-*, KUBE-SVL-*
	natEndpoint // KUBE-SEP-*
)

type natDecoder struct {
	l           *entryLayout
	kind        natChainKind
	hasServices bool

	svcs  blockList[svcChain] // service chains in blob order
	jumps blockList[svcJump]  // their rules' jumps
	seps  blockList[sepChain] // endpoint chains in blob order, so sorted by firstRule
	disp  blockList[dispatch] // KUBE-SERVICES rules that jump somewhere
}

type svcChain struct {
	name      string
	firstRule uint32
	rules     uint32
}

type svcJump struct {
	svc    uint32 // index in svcs
	target uint32 // blob offset
}

type sepChain struct {
	firstRule uint32
	dest      netip.AddrPort // valid once a DNAT was read
}

type dispatch struct {
	svc    ruleset.Service // without Chain
	target uint32
}

func (d *natDecoder) chain(name []byte, builtin bool, firstRule int) error {
	d.kind = natOther
	switch {
	case builtin:
	case string(name) == "KUBE-SERVICES":
		d.kind, d.hasServices = natServices, true
	case kubeproxynames.IsIPTablesServiceChainBytes(name):
		d.kind = natService
		d.svcs.add(svcChain{name: string(name), firstRule: uint32(firstRule)})
	case kubeproxynames.IsIPTablesEndpointChainBytes(name):
		d.kind = natEndpoint
		d.seps.add(sepChain{firstRule: uint32(firstRule)})
	}
	return nil
}

func (d *natDecoder) rule(e entry, _ int) error {
	switch d.kind {
	case natService:
		s := d.svcs.last()
		s.rules++
		if target, ok := jumpTarget(e); ok {
			d.jumps.add(svcJump{svc: uint32(d.svcs.len() - 1), target: target})
		}
	case natEndpoint:
		sep := d.seps.last()
		if sep.dest.IsValid() {
			return nil
		}
		if t := e.target(); string(t.name) == "DNAT" {
			sep.dest, _ = dnatDestination(t, e.l.ipv6)
		}
	case natServices:
		target, ok := jumpTarget(e)
		if !ok {
			return nil
		}
		svc, ok, err := servicePort(e)
		if err != nil {
			return err
		}
		if ok {
			d.disp.add(dispatch{svc: svc, target: target})
		}
	}
	return nil
}

// jumpTarget returns the offset a rule's standard target jumps or goes to. A verdict that
// names the next entry is no jump: it is how a rule without -j continues.
func jumpTarget(e entry) (uint32, bool) {
	v, ok := e.target().standardVerdict()
	if !ok || v < 0 || int(v) == e.off+len(e.raw) {
		return 0, false
	}
	return uint32(v), true
}

// result resolves the jumps: each service chain that has rules gets the sorted, distinct
// destinations of the endpoint chains it jumps to; each dispatch rule whose target is a
// service chain becomes a Service.
//
// The result is held until the next read, and is still held while that read's blob is mapped
// whole: it is built at its final size. The endpoint lists share one array, filled chain by
// chain (the jumps are in blob order, so grouped by service chain), where appending to a
// list per chain left each with up to twice its length's capacity (at 10,000 Services x 10
// endpoints, 2 MiB of a 7.5 MiB table).
func (d *natDecoder) result() *ruleset.ProxyTable {
	pt := &ruleset.ProxyTable{Chains: make(map[string][]netip.AddrPort, d.svcs.len())}
	all := make([]netip.AddrPort, 0, d.resolvedJumps())
	next := 0 // in jumps
	for i, s := range d.svcs.all {
		start := len(all)
		for ; next < d.jumps.len() && d.jumps.at(next).svc == uint32(i); next++ {
			if sep, ok := d.sepAt(d.jumps.at(next).target); ok && sep.dest.IsValid() {
				all = append(all, sep.dest)
			}
		}
		if s.rules == 0 {
			continue // kube-proxy flushes a chain it stops using before deleting it
		}
		var list []netip.AddrPort
		if len(all) > start {
			list = all[start:]
			slices.SortFunc(list, netip.AddrPort.Compare)
			list = slices.Clip(slices.Compact(list))
			all = all[:start+len(list)]
		}
		pt.Chains[s.name] = list
	}
	byStart := make(map[uint32]string, d.svcs.len())
	for _, s := range d.svcs.all {
		byStart[s.firstRule] = s.name
	}
	n := 0
	for _, dp := range d.disp.all {
		if _, ok := byStart[dp.target]; ok {
			n++
		}
	}
	if n > 0 {
		pt.Services = make([]ruleset.Service, 0, n)
	}
	for _, dp := range d.disp.all {
		if name, ok := byStart[dp.target]; ok {
			svc := dp.svc
			svc.Chain = name
			pt.Services = append(pt.Services, svc)
		}
	}
	return pt
}

// resolvedJumps counts the service chains' jumps that land on an endpoint chain with a
// destination: the endpoints result keeps, before duplicates are removed.
func (d *natDecoder) resolvedJumps() int {
	n := 0
	for _, j := range d.jumps.all {
		if sep, ok := d.sepAt(j.target); ok && sep.dest.IsValid() {
			n++
		}
	}
	return n
}

// sepAt finds the endpoint chain whose first rule is at off.
func (d *natDecoder) sepAt(off uint32) (*sepChain, bool) {
	n := d.seps.len()
	i := sort.Search(n, func(i int) bool { return d.seps.at(i).firstRule >= off })
	if i < n && d.seps.at(i).firstRule == off {
		return d.seps.at(i), true
	}
	return nil, false
}

// servicePort reads a KUBE-SERVICES rule the way internal/testsupport/iptables.KubeServices reads its text:
// the destination address (-d, not negated), protocol (-p tcp|udp|sctp, not negated), the
// destination port of its tcp, udp or sctp match (one port, not negated) and kube-proxy's
// "ns/name:port cluster IP" comment. ok is false when address, protocol or port is missing.
func servicePort(e entry) (_ ruleset.Service, ok bool, _ error) {
	var svc ruleset.Service
	h := ipHeaderOf(e)
	if h.dstSet && h.invflags&invDstIP == 0 {
		svc.ClusterIP = h.dst
	}
	if h.invflags&invProto == 0 {
		switch h.proto {
		case uint16(ruleset.ProtoTCP), uint16(ruleset.ProtoUDP), uint16(ruleset.ProtoSCTP):
			svc.Protocol = uint8(h.proto)
		}
	}
	it := e.matches()
	for m, ok := it.next(); ok; m, ok = it.next() {
		switch string(m.name) {
		case "comment":
			svc.Namespace, svc.Name, svc.PortName = kubeproxynames.ParseServiceCommentBytes(cString(m.data))
		case "tcp", "udp", "sctp":
			if p, ok := destPort(m); ok {
				svc.Port = p
			}
		}
	}
	if it.err != nil {
		return ruleset.Service{}, false, it.err
	}
	if !svc.ClusterIP.IsValid() || svc.Protocol == 0 || svc.Port == 0 {
		return ruleset.Service{}, false, nil
	}
	return svc, true, nil
}
