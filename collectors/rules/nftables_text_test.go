package rules

// The nft -j reader the drift check used before the rules were read in-process; it stays as a
// test fixture reader for the real kube-proxy capture in testdata (nft JSON), on
// internal/testsupport/fixture's reading of the chains, which the exporter's nftables golden scrape uses.

import (
	"iter"
	"maps"
	"net/netip"

	"github.com/proxyhealth/proxyhealth/internal/cluster"
	"github.com/proxyhealth/proxyhealth/internal/testsupport/fixture"
	"github.com/proxyhealth/proxyhealth/internal/testsupport/nft"
)

// nftRules is one read of kube-proxy's nftables table of one IP family: each service port chain
// (service-*, local-*) that has rules, with the endpoints it DNATs to, inline or through the
// endpoint chains it jumps to.
type nftRules struct {
	chains map[string][]netip.AddrPort
}

// newNFTRules reads table tb (ip or ip6 kube-proxy); a nil table gives no chains.
func newNFTRules(tb *nft.Table) *nftRules {
	return &nftRules{chains: fixture.NFTablesChains(tb)}
}

func (r *nftRules) chainsFor(n cluster.ServicePortName) (string, string) { return chainsFor(n, true) }

func (r *nftRules) endpoints(chain string) []netip.AddrPort { return r.chains[chain] }

func (r *nftRules) nftables() bool { return true }

func (r *nftRules) chain(name string) ([]netip.AddrPort, bool) {
	eps, ok := r.chains[name]
	return eps, ok
}

func (r *nftRules) chainCount() int { return len(r.chains) }
func (r *nftRules) identity() any   { return nil } // modified in place by some tests

// serviceChains lists the service-*/local-* chains that have rules, to find those no API
// service port accounts for.
func (r *nftRules) serviceChains() iter.Seq[string] { return maps.Keys(r.chains) }
