package rules

import (
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"strings"

	"github.com/proxyhealth/proxyhealth/internal/cluster"
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
// The table is read over netlink by internal/hostrules (internal/nftnl), which resolves both
// forms to each service chain's endpoints; this file only names the chains.

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
