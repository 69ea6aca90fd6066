package rules

import (
	"crypto/sha256"
	"encoding/base32"
	"strings"

	"github.com/proxyhealth/proxyhealth/internal/cluster"
)

// kube-proxy's iptables mode names a service port's chains by a hash of its name and protocol
// (pkg/proxy/iptables/proxier.go: portProtoHash, servicePortPolicyClusterChain,
// servicePortPolicyLocalChainName), so a chain is found from the API's service port without
// reading rule comments, which kube-proxy leaves out above 1,000 endpoints.
func portProtoHash(servicePortName, protocol string) string {
	hash := sha256.Sum256([]byte(servicePortName + protocol))
	return base32.StdEncoding.EncodeToString(hash[:])[:16]
}

func clusterChain(n cluster.ServicePortName) string {
	return "KUBE-SVC-" + portProtoHash(n.String(), strings.ToLower(n.Protocol))
}

func localChain(n cluster.ServicePortName) string {
	return "KUBE-SVL-" + portProtoHash(n.String(), strings.ToLower(n.Protocol))
}
