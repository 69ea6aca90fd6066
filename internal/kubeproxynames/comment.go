package kubeproxynames

import (
	"bytes"
	"strings"
)

const serviceCommentSuffix = " cluster IP"

var serviceCommentSuffixBytes = []byte(serviceCommentSuffix)

// ParseServiceComment splits the comment kube-proxy's iptables mode writes on a service port's
// KUBE-SERVICES rule, "ns/name:port cluster IP" ("ns/name cluster IP" for an unnamed port).
// Anything else yields empty strings.
func ParseServiceComment(c string) (namespace, name, portName string) {
	spn, ok := strings.CutSuffix(c, serviceCommentSuffix)
	if !ok {
		return "", "", ""
	}
	namespace, rest, ok := strings.Cut(spn, "/")
	if !ok || namespace == "" || rest == "" {
		return "", "", ""
	}
	name, portName, _ = strings.Cut(rest, ":")
	return namespace, name, portName
}

// ParseServiceCommentBytes is ParseServiceComment of a comment in a message. It allocates only
// for a comment of that form, once: the three strings share the comment's copy.
func ParseServiceCommentBytes(c []byte) (namespace, name, portName string) {
	if !bytes.HasSuffix(c, serviceCommentSuffixBytes) {
		return "", "", ""
	}
	return ParseServiceComment(string(c))
}
