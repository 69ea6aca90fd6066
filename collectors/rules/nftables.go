package rules

import (
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/proxyhealth/proxyhealth/internal/cluster"
	"github.com/proxyhealth/proxyhealth/internal/nft"
)

// kube-proxy's nftables mode (pkg/proxy/nftables/proxier.go) writes one table per IP family,
// `ip kube-proxy` and `ip6 kube-proxy`. A service port's cluster chain is
// "service-" + servicePortChainNameBase and its local chain "local-" + the same base, where the
// base is hashAndTruncate("<namespace>/<name>/<protocol>/<port name>"): the first 8 characters
// of base32(sha256(s)), "-", and s itself, cut to 240 characters (never reached: each part is at
// most 63). Like the iptables mode, the name is computed from the API's service port, not read
// from comments.
//
// Its endpoints are written in one of two forms (writeServiceToEndpointDNATs and
// writeServiceToEndpointJumps):
//
//   - without session affinity, inline in the service chain:
//     `meta l4proto tcp dnat ip to numgen random mod 2 map { 0 : 10.244.3.3 . 8080, 1 : ... }`;
//   - with ClientIP affinity, one chain per endpoint, "endpoint-<hash>-...__<ip>/<port>", ending
//     in `dnat to 10.244.3.3:8080`, reached from the service chain by an
//     `ip saddr @affinity-... goto endpoint-...` rule per endpoint and a
//     `numgen random mod 2 vmap { 0 : goto endpoint-..., 1 : ... }`.
//
// A chain kube-proxy stops using is flushed at once and deleted on a later sync, so an empty
// service chain is one that is on its way out: it has no endpoints and is not listed.
//
// The table is read as `nft -j list table ip kube-proxy` and parsed with internal/nft, not over
// netlink (github.com/google/nftables): one parser serves both this and the INVALID-drop check,
// what is read is exactly what an operator sees running the same command by hand, and nothing
// has to decode nftables' expression bytecode back into maps and verdicts. The cost is paid only
// when nftables' ruleset generation moved (generation.go). Measured on 2 busy cores with 5,000
// service ports of 5 endpoints each: nft printed the 3.8 MB of JSON in 1.7-1.9 s at 118 MB peak
// RSS (the text form: 1.3 s, 62 MB), and parsing it and reading the endpoints took 0.33 s and
// allocated 80 MB (BenchmarkNFTRules5000x5). That is the same order as iptables-save of such a
// nat table. Netlink would save the child process, its memory and the JSON; it is the next step
// if a cluster's churn moves the generation at every check at that size or beyond.

const (
	nftClusterChainPrefix = "service-"
	nftLocalChainPrefix   = "local-"
	nftChainNameBaseMax   = 256 - 16 // knftables.NameLengthMax - chainNamePrefixLengthMax
)

// nftChainNameBase is kube-proxy's servicePortChainNameBase.
func nftChainNameBase(n cluster.ServicePortName) string {
	name := fmt.Sprintf("%s/%s/%s/%s", n.Namespace, n.Name, strings.ToLower(n.Protocol), n.Port)
	hash := sha256.Sum256([]byte(name))
	name = base32.StdEncoding.EncodeToString(hash[:])[:8] + "-" + name
	if len(name) > nftChainNameBaseMax {
		name = name[:nftChainNameBaseMax-3] + "..."
	}
	return name
}

// isNFTServiceChain tells kube-proxy's service port chains (cluster and local policy) from its
// fixed chains: every chain named from a service port has a "/" (isServiceChainName).
func isNFTServiceChain(name string) bool {
	return (strings.HasPrefix(name, nftClusterChainPrefix) || strings.HasPrefix(name, nftLocalChainPrefix)) &&
		strings.Contains(name, "/")
}

// nftRules is one read of kube-proxy's nftables table of one IP family: each service port chain
// (service-*, local-*) that has rules, with the endpoints it DNATs to, inline or through the
// endpoint chains it jumps to.
type nftRules struct {
	chains map[string][]netip.AddrPort
}

// newNFTRules reads table tb (ip or ip6 kube-proxy); a nil table gives no chains.
func newNFTRules(tb *nft.Table) *nftRules {
	r := &nftRules{chains: map[string][]netip.AddrPort{}}
	if tb == nil {
		return r
	}
	for _, c := range tb.Chains {
		if !isNFTServiceChain(c.Name) || len(c.Rules) == 0 {
			continue
		}
		eps := []netip.AddrPort{}
		for _, rule := range c.Rules {
			eps = append(eps, rule.DNATTargets()...)
			for _, target := range rule.JumpTargets() {
				ec := tb.Chain(target)
				if ec == nil || ec == c {
					continue
				}
				for _, er := range ec.Rules {
					eps = append(eps, er.DNATTargets()...)
				}
			}
		}
		// The inline form lists each endpoint once; the affinity form names each endpoint
		// chain twice (its affinity goto and its vmap element).
		slices.SortFunc(eps, netip.AddrPort.Compare)
		eps = slices.Compact(eps)
		r.chains[c.Name] = eps
	}
	return r
}

func (r *nftRules) chainsFor(n cluster.ServicePortName) (string, string) {
	base := nftChainNameBase(n)
	return nftClusterChainPrefix + base, nftLocalChainPrefix + base
}

func (r *nftRules) endpoints(chain string) []netip.AddrPort { return r.chains[chain] }

// serviceChains lists the service-*/local-* chains that have rules, to find those no API
// service port accounts for.
func (r *nftRules) serviceChains() []string {
	out := make([]string, 0, len(r.chains))
	for name := range r.chains {
		out = append(out, name)
	}
	return out
}
