package nftnl

// The Follower's nftables-mode side: kube-proxy's table ip/ip6 kube-proxy, read whole
// (fullNFT) and then kept up to date by re-reading the service and endpoint chains a change
// names, the service chains that use a map whose elements changed, and map service-ips
// (partialNFT).

import (
	"context"
	"net/netip"

	"github.com/proxyhealth/proxyhealth/internal/kubeproxynames"
)

// fullNFT reads kube-proxy's table whole, its dumps one after the other without asking that no
// commit come between them. The read costs the kernel the square of the table's maps (it finds
// each map by name in a list: BenchmarkKernelElementDumpByPosition), tens of seconds at 40,000
// Services; retried until no kube-proxy sync came during it, it might never end under churn.
// Each dump is whole (retried alone if a commit cut it), and what a commit between two dumps
// changed the changes that follow name: Apply reads it again, as it does for every change.
func (f *Follower) fullNFT(ctx context.Context, ft *followed) error {
	ft.reset()
	family := ft.table.Family
	ok, err := exists(ctx, f.q, family, kubeProxyTable, "")
	if err != nil || !ok {
		return err
	}
	var kr *kpReader
	reset := func() {
		kr = &kpReader{in: interp{family: family}, chains: map[string]*kpChain{}, endpoints: map[string]netip.AddrPort{}}
	}
	if err := wholeDump(reset, func() error { return dumpRules(ctx, f.q, family, kubeProxyTable, "", kr.rule) }); err != nil {
		return err
	}
	if err := kr.resolveMaps(ctx, f.q, nil); err != nil {
		return err
	}
	ft.endpoints = kr.endpoints
	for name, c := range kr.chains {
		ft.setChain(name, c)
	}
	if ft.services, err = readServiceIPs(ctx, f.q, family); err != nil {
		return err
	}
	ft.snap = ft.build(nil, nil)
	return nil
}

func (f *Follower) partialNFT(ctx context.Context, ft *followed, d *TableChange, gone map[string]bool, affected map[string]struct{}) (bool, error) {
	family := ft.table.Family
	var svcChains []string
	for _, chain := range uniq(d.Chains) {
		switch {
		case kubeproxynames.IsNFTServiceChain(chain):
			svcChains = append(svcChains, chain)
		case kubeproxynames.IsNFTEndpointChain(chain):
			var kr *kpReader
			reset := func() { kr = &kpReader{in: interp{family: family}, endpoints: map[string]netip.AddrPort{}} }
			reset()
			if !gone[chain] {
				if err := f.dumpChain(ctx, family, kubeProxyTable, chain, reset, func(r *ruleMsg) error { return kr.rule(r) }); err != nil {
					return false, err
				}
			}
			if ap, ok := kr.endpoints[chain]; ok {
				ft.endpoints[chain] = ap
			} else {
				delete(ft.endpoints, chain)
			}
			for _, s := range ft.byTarget[chain] {
				affected[s] = struct{}{}
			}
		}
	}
	servicesChanged := false
	for _, set := range uniq(d.Sets) {
		if set == "service-ips" {
			var err error
			if ft.services, err = readServiceIPs(ctx, f.q, family); err != nil {
				return false, err
			}
			servicesChanged = true
			continue
		}
		// A map's elements changed: re-read the service chains that use it.
		for _, s := range ft.bySet[set] {
			svcChains = append(svcChains, s)
		}
	}
	svcChains = uniq(svcChains)
	if len(svcChains) == 0 {
		return servicesChanged, nil
	}
	var kr *kpReader
	reset := func() {
		kr = &kpReader{in: interp{family: family}, chains: map[string]*kpChain{}, endpoints: map[string]netip.AddrPort{}}
	}
	reset()
	for _, chain := range svcChains {
		if gone[chain] {
			continue
		}
		// One reader for all: a retried dump must not leave the chain's earlier rules.
		forget := func() { delete(kr.chains, chain) }
		if err := f.dumpChain(ctx, family, kubeProxyTable, chain, forget, func(r *ruleMsg) error { return kr.rule(r) }); err != nil {
			return false, err
		}
	}
	if err := kr.resolveMaps(ctx, f.q, d.anonSets); err != nil {
		return false, err
	}
	for _, chain := range svcChains {
		ft.setChain(chain, kr.chains[chain])
		affected[chain] = struct{}{}
	}
	return servicesChanged, nil
}
