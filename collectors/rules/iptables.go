package rules

import (
	"crypto/sha256"
	"encoding/base32"
	"net/netip"
	"strings"

	"github.com/proxyhealth/proxyhealth/internal/cluster"
	"github.com/proxyhealth/proxyhealth/internal/iptables"
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

// iptablesRules is one read of kube-proxy's nat rules of one IP family: each KUBE-SVC-* and
// KUBE-SVL-* chain with the DNAT targets of the KUBE-SEP-* chains it jumps to.
type iptablesRules struct {
	chains map[string][]netip.AddrPort
}

// newIPTablesRules reads the nat table of rs.
func newIPTablesRules(rs *iptables.Ruleset) *iptablesRules {
	r := &iptablesRules{chains: map[string][]netip.AddrPort{}}
	nat := rs.Table("nat")
	if nat == nil {
		return r
	}
	// Each endpoint chain's DNAT target.
	sep := map[string]netip.AddrPort{}
	for _, c := range nat.Chains {
		if !strings.HasPrefix(c.Name, "KUBE-SEP-") {
			continue
		}
		for i := range c.Rules {
			if ap, ok := dnatTarget(&c.Rules[i]); ok {
				sep[c.Name] = ap
				break
			}
		}
	}
	for _, c := range nat.Chains {
		if !strings.HasPrefix(c.Name, "KUBE-SVC-") && !strings.HasPrefix(c.Name, "KUBE-SVL-") {
			continue
		}
		eps := []netip.AddrPort{}
		for i := range c.Rules {
			if ap, ok := sep[c.Rules[i].Target()]; ok {
				eps = append(eps, ap)
			}
		}
		r.chains[c.Name] = eps
	}
	return r
}

// dnatTarget reads "-j DNAT --to-destination 10.244.1.3:8080" (or "[fd00::3]:8080").
func dnatTarget(rule *iptables.Rule) (netip.AddrPort, bool) {
	if rule.Target() != "DNAT" {
		return netip.AddrPort{}, false
	}
	o, ok := rule.Option("DNAT", "--to-destination")
	if !ok {
		return netip.AddrPort{}, false
	}
	ap, err := netip.ParseAddrPort(o.Value())
	if err != nil {
		return netip.AddrPort{}, false
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), true
}

func (r *iptablesRules) endpoints(chain string) []netip.AddrPort { return r.chains[chain] }

// serviceChains lists the KUBE-SVC-*/KUBE-SVL-* chains, to find those no API service port
// accounts for.
func (r *iptablesRules) serviceChains() []string {
	out := make([]string, 0, len(r.chains))
	for name := range r.chains {
		out = append(out, name)
	}
	return out
}

func (r *iptablesRules) chainsFor(n cluster.ServicePortName) (string, string) {
	hash := portProtoHash(n.String(), strings.ToLower(n.Protocol))
	return "KUBE-SVC-" + hash, "KUBE-SVL-" + hash
}
