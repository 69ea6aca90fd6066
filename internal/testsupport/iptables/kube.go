package iptables

import (
	"net/netip"
	"strconv"
	"strings"

	"github.com/proxyhealth/proxyhealth/internal/kubeproxynames"
)

// ServicePort is one service port's cluster IP entry in kube-proxy's nat KUBE-SERVICES chain:
//
//	-A KUBE-SERVICES -d 10.96.0.10/32 -p udp -m comment --comment "kube-system/kube-dns:dns cluster IP" -m udp --dport 53 -j KUBE-SVC-TCOU7JCQXEZGVUNU
type ServicePort struct {
	ClusterIP netip.Addr
	Port      uint16
	Protocol  string // "tcp", "udp" or "sctp"
	// Namespace, Name and PortName come from the comment ("ns/name:portname cluster IP"). All
	// three are empty when kube-proxy left comments out (it does above 1,000 endpoints); the
	// Chain name, a hash of the service port name and protocol, identifies the port then.
	// PortName is empty for an unnamed port too ("ns/name cluster IP").
	Namespace string
	Name      string
	PortName  string
	// Chain is the target: KUBE-SVC-<hash>, or KUBE-SVL-<hash> for internalTrafficPolicy Local.
	Chain string
	// Line is the rule's line in the iptables-save output.
	Line int
}

// KubeServices returns the cluster IP service ports kube-proxy (iptables mode) programmed in the
// nat table's KUBE-SERVICES chain, in rule order. Only rules jumping to a KUBE-SVC-* or
// KUBE-SVL-* chain are service ports; the KUBE-NODEPORTS jump, KUBE-MARK-MASQ rules and
// external/load-balancer IP rules (KUBE-EXT-*) are skipped, as are rules whose destination or
// port cannot be read. It returns nil when there is no such chain.
func KubeServices(rs *Ruleset) []ServicePort {
	c := rs.Table("nat").Chain("KUBE-SERVICES")
	if c == nil {
		return nil
	}
	var out []ServicePort
	for i := range c.Rules {
		r := &c.Rules[i]
		target := r.Target()
		if !kubeproxynames.IsIPTablesServiceChain(target) {
			continue
		}
		sp := ServicePort{Chain: target, Line: r.Line}
		ok := true
		for o := range r.Options() {
			if o.Target {
				continue
			}
			switch {
			case o.Module == "" && (o.Name == "-d" || o.Name == "--destination" || o.Name == "--dst") && !o.Negated:
				addr, err := parseAddrOrPrefix(o.Value())
				if err != nil {
					ok = false
				}
				sp.ClusterIP = addr
			case o.Module == "" && (o.Name == "-p" || o.Name == "--protocol") && !o.Negated:
				sp.Protocol = strings.ToLower(o.Value())
			case o.Name == "--dport" && !o.Negated:
				p, err := strconv.ParseUint(o.Value(), 10, 16)
				if err != nil {
					ok = false
				}
				sp.Port = uint16(p)
			case o.Module == "comment" && o.Name == "--comment":
				sp.Namespace, sp.Name, sp.PortName = kubeproxynames.ParseServiceComment(o.Value())
			}
		}
		if !ok || !sp.ClusterIP.IsValid() || sp.Port == 0 || sp.Protocol == "" {
			continue
		}
		out = append(out, sp)
	}
	return out
}

func parseAddrOrPrefix(s string) (netip.Addr, error) {
	if strings.IndexByte(s, '/') >= 0 {
		p, err := netip.ParsePrefix(s)
		return p.Addr(), err
	}
	return netip.ParseAddr(s)
}
