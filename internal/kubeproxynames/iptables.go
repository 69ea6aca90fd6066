package kubeproxynames

import (
	"bytes"
	"crypto/sha256"
	"encoding/base32"
	"net/netip"
	"strings"
)

// kube-proxy's iptables-mode chain prefixes.
const (
	IPTablesClusterChainPrefix  = "KUBE-SVC-"
	IPTablesLocalChainPrefix    = "KUBE-SVL-"
	IPTablesEndpointChainPrefix = "KUBE-SEP-"
)

var (
	iptablesClusterChainPrefix  = []byte(IPTablesClusterChainPrefix)
	iptablesLocalChainPrefix    = []byte(IPTablesLocalChainPrefix)
	iptablesEndpointChainPrefix = []byte(IPTablesEndpointChainPrefix)
)

// portProtoHash is kube-proxy's: the first 16 characters of base32(sha256(servicePortName +
// protocol)). A chain is found from the API's service port by it, without reading rule
// comments, which kube-proxy leaves out above 1,000 endpoints.
func portProtoHash(servicePortName, protocol string) string {
	hash := sha256.Sum256([]byte(servicePortName + protocol))
	return base32.StdEncoding.EncodeToString(hash[:])[:16]
}

// servicePortName is kube-proxy's ServicePortName.String(): "namespace/name:port", or
// "namespace/name" when the port has no name.
func servicePortName(namespace, name, portName string) string {
	if portName == "" {
		return namespace + "/" + name
	}
	return namespace + "/" + name + ":" + portName
}

// IPTablesServiceChains names a service port's cluster and local chains in the iptables mode
// (servicePortPolicyClusterChain, servicePortPolicyLocalChainName): KUBE-SVC- and KUBE-SVL-
// with the same hash. protocol is as the API writes it ("TCP"); kube-proxy hashes it in lower
// case.
func IPTablesServiceChains(namespace, name, portName, protocol string) (cluster, local string) {
	hash := portProtoHash(servicePortName(namespace, name, portName), strings.ToLower(protocol))
	return IPTablesClusterChainPrefix + hash, IPTablesLocalChainPrefix + hash
}

// IPTablesEndpointChain names the KUBE-SEP chain of one endpoint of a service port
// (servicePortEndpointChainName), which hashes the endpoint's "ip:port" ("[ip]:port" for
// IPv6) after the protocol.
func IPTablesEndpointChain(namespace, name, portName, protocol string, endpoint netip.AddrPort) string {
	return IPTablesEndpointChainPrefix + portProtoHash(servicePortName(namespace, name, portName), strings.ToLower(protocol)+endpoint.String())
}

// IsIPTablesServiceChain tells a service port's chain, cluster or local policy (KUBE-SVC-*,
// KUBE-SVL-*), from kube-proxy's other chains.
func IsIPTablesServiceChain(name string) bool {
	return strings.HasPrefix(name, IPTablesClusterChainPrefix) || strings.HasPrefix(name, IPTablesLocalChainPrefix)
}

// IsIPTablesServiceChainBytes is IsIPTablesServiceChain of a name in a message.
func IsIPTablesServiceChainBytes(name []byte) bool {
	return bytes.HasPrefix(name, iptablesClusterChainPrefix) || bytes.HasPrefix(name, iptablesLocalChainPrefix)
}

// IsIPTablesEndpointChain tells an endpoint's chain (KUBE-SEP-*).
func IsIPTablesEndpointChain(name string) bool {
	return strings.HasPrefix(name, IPTablesEndpointChainPrefix)
}

// IsIPTablesEndpointChainBytes is IsIPTablesEndpointChain of a name in a message.
func IsIPTablesEndpointChainBytes(name []byte) bool {
	return bytes.HasPrefix(name, iptablesEndpointChainPrefix)
}
