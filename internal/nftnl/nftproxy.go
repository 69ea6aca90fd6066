package nftnl

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/proxyhealth/proxyhealth/internal/kubeproxynames"
	"github.com/proxyhealth/proxyhealth/internal/ruleset"
)

// kube-proxy's nftables mode (pkg/proxy/nftables/proxier.go) writes table `ip kube-proxy` and
// `ip6 kube-proxy`. A service port's chains are "service-HASH8-ns/name/proto/port" (cluster
// policy) and "local-..." (local policy); every chain named from a service port has a "/".
// Endpoints are written inline, `dnat ip to numgen random mod N map { 0 : ADDR . PORT, ... }`,
// an anonymous map (since v1.37 a single endpoint as a plain `dnat to ADDR:PORT`,
// writeServiceToEndpointDNATs), or, with ClientIP affinity, as per-endpoint chains
// "endpoint-..." ending in `dnat to ADDR:PORT`, reached by one `ip saddr @affinity-... goto
// endpoint-...` rule each and a `numgen random mod N vmap { 0 : goto endpoint-..., ... }`. The
// cluster IP dispatch is map service-ips: `ip daddr . meta l4proto . th dport vmap @service-ips`.
const kubeProxyTable = "kube-proxy"

// ReadKubeProxyNFT reads kube-proxy's nftables-mode table (`ip kube-proxy`, or `ip6
// kube-proxy` with ipv6). It returns nil, nil when the table does not exist. A service chain
// kube-proxy flushed (no rules) is left out. lim bounds each reply.
func ReadKubeProxyNFT(ctx context.Context, ipv6 bool, lim Limits) (*ruleset.ProxyTable, error) {
	var pt *ruleset.ProxyTable
	err := withSocket(lim, func(q querier) error {
		var err error
		pt, err = readKubeProxyNFT(ctx, q, nfproto(ipv6))
		return err
	})
	return pt, err
}

func readKubeProxyNFT(ctx context.Context, q querier, family uint8) (*ruleset.ProxyTable, error) {
	var pt *ruleset.ProxyTable
	err := consistently(ctx, q, func() error {
		ok, err := exists(ctx, q, family, kubeProxyTable, "")
		if err != nil || !ok {
			pt = nil
			return err
		}
		kr := &kpReader{in: interp{family: family}, chains: map[string]*kpChain{}, endpoints: map[string]netip.AddrPort{}}
		if err := dumpRules(ctx, q, family, kubeProxyTable, "", kr.rule); err != nil {
			return err
		}
		if err := kr.resolveMaps(ctx, q, nil); err != nil {
			return err
		}
		pt = &ruleset.ProxyTable{Chains: kr.endpointsByChain()}
		pt.Services, err = readServiceIPs(ctx, q, family)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("read %s %s table: %w", familyName(family), kubeProxyTable, err)
	}
	return pt, nil
}

// kpChain is what one service chain's rules lead to: inline endpoints, the anonymous maps
// that hold more, and the endpoint chains it jumps to, directly or through verdict maps.
type kpChain struct {
	eps      []netip.AddrPort
	dnatMaps []dnatMap
	vmaps    []string
	targets  []string
}

type dnatMap struct {
	set     string
	portOff int
}

type kpReader struct {
	in        interp
	chains    map[string]*kpChain
	endpoints map[string]netip.AddrPort // endpoint chain -> its DNAT destination
}

func (kr *kpReader) rule(r *ruleMsg) error {
	svc := kubeproxynames.IsNFTServiceChainBytes(r.chain)
	ep := kubeproxynames.IsNFTEndpointChainBytes(r.chain)
	if !svc && !ep {
		return nil
	}
	f, err := kr.in.rule(r.exprs)
	if err != nil {
		return fmt.Errorf("chain %s handle %d: %w", r.chain, r.handle, err)
	}
	if ep {
		if _, seen := kr.endpoints[string(r.chain)]; f.hasDNAT && !seen {
			kr.endpoints[string(r.chain)] = f.dnat
		}
		return nil
	}
	c := kr.chains[string(r.chain)]
	if c == nil {
		c = &kpChain{}
		kr.chains[string(r.chain)] = c
	}
	if f.hasDNAT {
		c.eps = append(c.eps, f.dnat)
	}
	if f.dnatMap != nil {
		c.dnatMaps = append(c.dnatMaps, dnatMap{set: string(f.dnatMap), portOff: f.dnatPortOff})
	}
	for _, v := range f.vmaps {
		c.vmaps = append(c.vmaps, string(v.set))
	}
	if (f.verdict == ruleset.Jump || f.verdict == ruleset.Goto) && kubeproxynames.IsNFTEndpointChainBytes(f.target) {
		c.targets = append(c.targets, string(f.target))
	}
	return nil
}

// resolveMaps reads the anonymous maps the service chains use: those of known (the maps the
// commits being followed created, FollowNFTMaps) from there, the others with one small dump per
// map (the kernel dumps elements of one named set at a time; one a commit cut is dumped
// again). A map that went away since its chain was read is skipped: the commit that removed
// it changed the chain, which a Follower reads again for that change, and moved the
// generation, which has a one-time read (readKubeProxyNFT) start over.
func (kr *kpReader) resolveMaps(ctx context.Context, q querier, known map[string]*anonSet) error {
	family := kr.in.family
	elements := func(set string, reset func(), fn func(e *element) error) error {
		if s := known[set]; s != nil {
			for i := range s.elems {
				if err := fn(&s.elems[i]); err != nil {
					return err
				}
			}
			return nil
		}
		err := wholeDump(reset, func() error { return dumpElements(ctx, q, family, kubeProxyTable, set, fn) })
		if isNotExist(err) {
			reset()
			return nil
		}
		return err
	}
	for _, c := range kr.chains {
		for _, m := range c.dnatMaps {
			n := len(c.eps)
			err := elements(m.set, func() { c.eps = c.eps[:n] }, func(e *element) error {
				if ap, ok := addrPort(family, e.value); ok && m.portOff == addrLen(family) {
					c.eps = append(c.eps, ap)
				}
				return nil
			})
			if err != nil {
				return err
			}
		}
		for _, set := range c.vmaps {
			n := len(c.targets)
			err := elements(set, func() { c.targets = c.targets[:n] }, func(e *element) error {
				if (e.verdict == ruleset.Jump || e.verdict == ruleset.Goto) && kubeproxynames.IsNFTEndpointChainBytes(e.target) {
					c.targets = append(c.targets, string(e.target))
				}
				return nil
			})
			if err != nil {
				return err
			}
		}
	}
	return nil
}

func (kr *kpReader) endpointsByChain() map[string][]netip.AddrPort {
	out := make(map[string][]netip.AddrPort, len(kr.chains))
	for name, c := range kr.chains {
		eps := c.eps
		for _, t := range c.targets {
			if ap, ok := kr.endpoints[t]; ok {
				eps = append(eps, ap)
			}
		}
		// The affinity form names each endpoint chain twice (its goto and its vmap element).
		slices.SortFunc(eps, netip.AddrPort.Compare)
		out[name] = slices.Compact(eps)
		if out[name] == nil {
			out[name] = []netip.AddrPort{}
		}
	}
	return out
}

// readServiceIPs reads map service-ips: `ADDR . PROTO . PORT : goto service-...`. Elements
// going elsewhere (external IPs and load balancer IPs go to "external-..." chains) are not
// cluster IP service ports.
func readServiceIPs(ctx context.Context, q querier, family uint8) ([]ruleset.Service, error) {
	var out []ruleset.Service
	element := func(e *element) error {
		if !e.hasVerdict || e.verdict != ruleset.Goto && e.verdict != ruleset.Jump || !kubeproxynames.IsNFTServiceChainBytes(e.target) {
			return nil
		}
		addr, proto, port, ok := serviceKey(family, e.key)
		if !ok {
			return nil
		}
		chain := string(e.target)
		s := ruleset.Service{ClusterIP: addr, Port: port, Protocol: proto, Chain: chain}
		s.Namespace, s.Name, s.PortName, _ = kubeproxynames.ParseNFTServiceChain(chain)
		out = append(out, s)
		return nil
	}
	// A map of a few thousand elements takes several parts, which a commit may cut.
	err := wholeDump(func() { out = out[:0] }, func() error {
		return dumpElements(ctx, q, family, kubeProxyTable, "service-ips", element)
	})
	if err != nil && !isNotExist(err) {
		return nil, err
	}
	slices.SortFunc(out, func(a, b ruleset.Service) int { return strings.Compare(a.Chain, b.Chain) })
	return out, nil
}
