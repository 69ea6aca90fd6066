package nftnl

import "strings"

// parseServiceComment splits kube-proxy's KUBE-SERVICES comment "ns/name:port cluster IP"
// ("ns/name cluster IP" for an unnamed port). Anything else yields empty strings, as in
// internal/testsupport/iptables.
func parseServiceComment(c string) (namespace, name, port string) {
	spn, ok := strings.CutSuffix(c, " cluster IP")
	if !ok {
		return "", "", ""
	}
	namespace, rest, ok := strings.Cut(spn, "/")
	if !ok || namespace == "" || rest == "" {
		return "", "", ""
	}
	name, port, _ = strings.Cut(rest, ":")
	return namespace, name, port
}

// parseNFTServiceChain splits kube-proxy's nftables service chain name
// "service-HASH8-ns/name/proto/portname" (or "local-...") into its service port name.
func parseNFTServiceChain(chain string) (namespace, name, port string, ok bool) {
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
