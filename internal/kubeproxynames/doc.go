// Package kubeproxynames holds kube-proxy's naming of what it programs, for both of its
// modes, so the exporter's readers and the tests' fixtures name and recognise its chains in
// one way:
//
//   - iptables mode (pkg/proxy/iptables/proxier.go): a service port's chains KUBE-SVC-<hash>
//     (cluster traffic policy) and KUBE-SVL-<hash> (local), its endpoints' KUBE-SEP-<hash>,
//     and the "ns/name:port cluster IP" comment of its KUBE-SERVICES rule;
//   - nftables mode (pkg/proxy/nftables/proxier.go): a service port's chains
//     service-<hash>-ns/name/proto/port and local-..., its endpoints' endpoint-...__ip/port,
//     and the service port name those chain names spell out.
//
// Names are computed from a service port given as plain strings (namespace, name, port name,
// protocol as the API writes it), so this package imports nothing of the exporter's. What runs
// once per rule in the netlink and socket-option readers has a []byte variant: the predicates
// do not allocate, and the comment parser allocates once, for a comment it splits.
package kubeproxynames
