package rules

import (
	"context"

	"github.com/proxyhealth/proxyhealth/internal/ruleset"
)

// Programmed is one read of kube-proxy's rules on this node, whatever read them: its mode and,
// per IP family, the endpoints of every service port chain. Config.Read returns it.
type Programmed struct {
	// Mode is "iptables", "nftables", "ipvs" or "none" (the proxyhealth_proxy_mode label).
	Mode string
	// Source says where the rules were read from, for the log.
	Source string
	// Tables holds, in iptables and nftables mode, each IP family's service port chains, by
	// IPv6 (chains named as Mode names them); a family that was not read is absent.
	Tables map[bool]*ruleset.ProxyTable
}

// readRules reads kube-proxy's mode and rules with Config.Read when set, else from the node.
func (c *Collector) readRules(ctx context.Context, wantIPv6 bool) (readResult, error) {
	if c.cfg.Read == nil {
		return c.reader.read(ctx, wantIPv6)
	}
	p, err := c.cfg.Read(ctx, wantIPv6)
	if err != nil {
		return readResult{}, err
	}
	rr := readResult{mode: p.Mode, backend: p.Source, rules: map[bool]programmedRules{}}
	for ipv6, t := range p.Tables {
		switch {
		case t == nil:
		case p.Mode == modeIPTables:
			rr.rules[ipv6] = &iptablesRules{chains: t.Chains}
		case p.Mode == modeNFTables:
			rr.rules[ipv6] = &nftRules{chains: t.Chains}
		}
	}
	return rr, nil
}
