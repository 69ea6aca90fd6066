package kubeproxynames

import (
	"bytes"
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"net/netip"
	"strings"
)

// kube-proxy's nftables-mode chain prefixes. Each is followed by a base that hashAndTruncate
// made of the names the chain is for, with "/" between them; none of kube-proxy's fixed
// chains has a "/" (isServiceChainName), though some start alike ("service-endpoints-check").
const (
	NFTClusterChainPrefix  = "service-"
	NFTLocalChainPrefix    = "local-"
	NFTEndpointChainPrefix = "endpoint-"
)

var (
	nftClusterChainPrefix  = []byte(NFTClusterChainPrefix)
	nftLocalChainPrefix    = []byte(NFTLocalChainPrefix)
	nftEndpointChainPrefix = []byte(NFTEndpointChainPrefix)
)

// nftChainNameBaseMax is knftables.NameLengthMax - chainNamePrefixLengthMax.
const nftChainNameBaseMax = 256 - 16

// hashAndTruncate is kube-proxy's: the first 8 characters of base32(sha256(name)), "-", and
// name itself, cut to 240 characters.
func hashAndTruncate(name string) string {
	hash := sha256.Sum256([]byte(name))
	name = base32.StdEncoding.EncodeToString(hash[:])[:8] + "-" + name
	if len(name) > nftChainNameBaseMax {
		name = name[:nftChainNameBaseMax-3] + "..."
	}
	return name
}

// nftChainNameBase is kube-proxy's servicePortChainNameBase: hashAndTruncate of
// "<namespace>/<name>/<protocol>/<port name>". The cut is never reached: each part is at most
// 63 characters.
func nftChainNameBase(namespace, name, portName, protocol string) string {
	return hashAndTruncate(fmt.Sprintf("%s/%s/%s/%s", namespace, name, strings.ToLower(protocol), portName))
}

// NFTServiceChains names a service port's cluster and local chains in the nftables mode:
// "service-" and "local-" with the same base. protocol is as the API writes it ("TCP");
// kube-proxy writes it in lower case.
func NFTServiceChains(namespace, name, portName, protocol string) (cluster, local string) {
	base := nftChainNameBase(namespace, name, portName, protocol)
	return NFTClusterChainPrefix + base, NFTLocalChainPrefix + base
}

// NFTEndpointChain names the chain of one endpoint of a service port
// (servicePortEndpointChainNameBase), which kube-proxy writes with ClientIP affinity:
// "endpoint-" and hashAndTruncate of "<namespace>/<name>/<protocol>/<port name>__<ip>/<port>",
// an IPv6 address's colons written as dots.
func NFTEndpointChain(namespace, name, portName, protocol string, endpoint netip.AddrPort) string {
	ip := strings.ReplaceAll(endpoint.Addr().String(), ":", ".")
	return NFTEndpointChainPrefix + hashAndTruncate(fmt.Sprintf("%s/%s/%s/%s__%s/%d",
		namespace, name, strings.ToLower(protocol), portName, ip, endpoint.Port()))
}

// IsNFTServiceChain tells a service port's chain, cluster or local policy (service-*,
// local-*), from kube-proxy's fixed chains: every chain named from a service port has a "/".
func IsNFTServiceChain(name string) bool {
	return (strings.HasPrefix(name, NFTClusterChainPrefix) || strings.HasPrefix(name, NFTLocalChainPrefix)) &&
		strings.IndexByte(name, '/') >= 0
}

// IsNFTServiceChainBytes is IsNFTServiceChain of a name in a message.
func IsNFTServiceChainBytes(name []byte) bool {
	return (bytes.HasPrefix(name, nftClusterChainPrefix) || bytes.HasPrefix(name, nftLocalChainPrefix)) &&
		bytes.IndexByte(name, '/') >= 0
}

// IsNFTEndpointChain tells an endpoint's chain (endpoint-*).
func IsNFTEndpointChain(name string) bool {
	return strings.HasPrefix(name, NFTEndpointChainPrefix)
}

// IsNFTEndpointChainBytes is IsNFTEndpointChain of a name in a message.
func IsNFTEndpointChainBytes(name []byte) bool {
	return bytes.HasPrefix(name, nftEndpointChainPrefix)
}

// ParseNFTServiceChain splits a service port chain's name, "service-HASH8-ns/name/proto/port"
// (or "local-..."), into the service port's name. It does not check the prefix:
// IsNFTServiceChain does.
func ParseNFTServiceChain(chain string) (namespace, name, portName string, ok bool) {
	_, rest, ok := strings.Cut(chain, "-")
	if !ok {
		return "", "", "", false
	}
	_, base, ok := strings.Cut(rest, "-") // the hash
	if !ok {
		return "", "", "", false
	}
	parts := strings.Split(base, "/")
	if len(parts) != 4 {
		return "", "", "", false
	}
	return parts[0], parts[1], parts[3], true
}
