package rules

// The iptables-save text reader the drift check used before the rules were read in-process. It
// stays as a test fixture reader: the real kube-proxy captures in testdata are iptables-save
// text, and the drift engine's tests read them with it.

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"iter"
	"maps"
	"net/netip"

	"github.com/proxyhealth/proxyhealth/internal/cluster"
	"github.com/proxyhealth/proxyhealth/internal/kubeproxynames"
)

// iptablesRules is one read of kube-proxy's nat rules of one IP family: each KUBE-SVC-* and
// KUBE-SVL-* chain with the DNAT targets of the KUBE-SEP-* chains it jumps to.
type iptablesRules struct {
	chains map[string][]netip.AddrPort
}

// readIPTablesNAT reads `iptables-save -t nat` output line by line and keeps only what the
// drift check needs: which KUBE-SEP chains each service chain jumps to, and each KUBE-SEP
// chain's DNAT target. At 10,000 services the output is about 48 MB and 430,000 lines; a full
// parse into rules and options allocated three times that per check (and the legacy backend is
// read at every check), where this keeps a map of the endpoint chains and the result. The
// lines are kube-proxy's own, whose names hold no spaces or quotes, so plain field scanning
// is exact; anything else in the table is skipped. hasServices reports the KUBE-SERVICES
// chain, kube-proxy's mark on the table.
func readIPTablesNAT(r io.Reader) (rules *iptablesRules, hasServices bool, err error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	jumps := map[string][]string{} // service chain -> endpoint chains, in rule order
	sep := map[string]netip.AddrPort{}
	inNAT := false
	for sc.Scan() {
		// Lines are looked at as bytes; strings are made only for what is kept.
		line := sc.Bytes()
		switch {
		case len(line) > 0 && line[0] == '*':
			inNAT = string(line) == "*nat"
			continue
		case !inNAT:
			continue
		case len(line) > 0 && line[0] == ':':
			name, _, _ := bytes.Cut(line[1:], []byte(" "))
			switch {
			case string(name) == "KUBE-SERVICES":
				hasServices = true
			case kubeproxynames.IsIPTablesServiceChainBytes(name):
				if _, ok := jumps[string(name)]; !ok {
					jumps[string(name)] = nil
				}
			}
			continue
		case !bytes.HasPrefix(line, []byte("-A KUBE-S")):
			continue
		}
		chain, rest, _ := bytes.Cut(line[len("-A "):], []byte(" "))
		switch {
		case kubeproxynames.IsIPTablesServiceChainBytes(chain):
			if target := jumpTarget(rest); kubeproxynames.IsIPTablesEndpointChainBytes(target) {
				jumps[string(chain)] = append(jumps[string(chain)], string(target))
			}
		case kubeproxynames.IsIPTablesEndpointChainBytes(chain):
			if _, done := sep[string(chain)]; done || string(jumpTarget(rest)) != "DNAT" {
				continue
			}
			if ap, ok := dnatDestination(rest); ok {
				sep[string(chain)] = ap
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, false, fmt.Errorf("read iptables-save output: %w", err)
	}
	rules = &iptablesRules{chains: make(map[string][]netip.AddrPort, len(jumps))}
	for chain, targets := range jumps {
		eps := make([]netip.AddrPort, 0, len(targets))
		for _, t := range targets {
			if ap, ok := sep[t]; ok {
				eps = append(eps, ap)
			}
		}
		rules.chains[chain] = eps
	}
	return rules, hasServices, nil
}

// jumpTarget returns the target of a rule's "-j TARGET" (or "-g TARGET"), nil without one.
func jumpTarget(rule []byte) []byte {
	i := max(bytes.LastIndex(rule, []byte(" -j ")), bytes.LastIndex(rule, []byte(" -g ")))
	switch {
	case i >= 0:
		i += len(" -j ")
	case bytes.HasPrefix(rule, []byte("-j ")), bytes.HasPrefix(rule, []byte("-g ")):
		i = len("-j ")
	default:
		return nil
	}
	target, _, _ := bytes.Cut(rule[i:], []byte(" "))
	return target
}

// dnatDestination reads "--to-destination 10.244.1.3:8080" (or "[fd00::3]:8080").
func dnatDestination(rule []byte) (netip.AddrPort, bool) {
	_, after, ok := bytes.Cut(rule, []byte("--to-destination "))
	if !ok {
		return netip.AddrPort{}, false
	}
	value, _, _ := bytes.Cut(after, []byte(" "))
	ap, err := netip.ParseAddrPort(string(value))
	if err != nil {
		return netip.AddrPort{}, false
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), true
}

func (r *iptablesRules) endpoints(chain string) []netip.AddrPort { return r.chains[chain] }

func (r *iptablesRules) nftables() bool { return false }

func (r *iptablesRules) chain(name string) ([]netip.AddrPort, bool) {
	eps, ok := r.chains[name]
	return eps, ok
}

func (r *iptablesRules) chainCount() int { return len(r.chains) }
func (r *iptablesRules) identity() any   { return nil } // modified in place by some tests

// serviceChains lists the KUBE-SVC-*/KUBE-SVL-* chains, to find those no API service port
// accounts for.
func (r *iptablesRules) serviceChains() iter.Seq[string] { return maps.Keys(r.chains) }

func (r *iptablesRules) chainsFor(n cluster.ServicePortName) (string, string) {
	return chainsFor(n, false)
}
