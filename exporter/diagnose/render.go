package diagnose

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/proxyhealth/proxyhealth/internal/verdict"
)

// Result is what diagnose prints.
type Result struct {
	verdict.Report
	// ServicePorts is the --service Service side by side; absent without --service.
	ServicePorts []ServicePort `json:"service_ports,omitempty"`
}

// ServicePort is one port of the --service Service, side by side.
type ServicePort struct {
	Service    verdict.Service `json:"service"`
	ClusterIPs []string        `json:"cluster_ips"`
	// Expected are the endpoints the API wants kube-proxy to program on this node,
	// Programmed those its rules hold; Missing and Stale the differences now (a difference
	// counts as stale rules only when it lasts, see findings).
	Expected   []string    `json:"expected"`
	Programmed []string    `json:"programmed"`
	Missing    []string    `json:"missing"`
	Stale      []string    `json:"stale"`
	Chains     []string    `json:"chains"`
	ByChain    []ChainSide `json:"by_chain,omitempty"`
	// VirtualServers is set in kube-proxy's IPVS mode: Chains and ByChain are then its
	// virtual servers, each holding the cluster or the local list.
	VirtualServers bool                     `json:"virtual_servers,omitempty"`
	UnrepliedFlows []verdict.UnrepliedCount `json:"unreplied_flows"`
}

// ChainSide is one of the port's chains side by side: each chain is compared with what it
// should hold, so an endpoint can be missing from the local chain while the cluster chain
// still holds it.
type ChainSide struct {
	Chain      string   `json:"chain"` // cluster or local
	Name       string   `json:"name,omitempty"`
	Expected   []string `json:"expected"`
	Programmed []string `json:"programmed"`
	Missing    []string `json:"missing"`
	Stale      []string `json:"stale"`
}

// chainsWhere names the chains whose list (of) holds ep, as " from the local chain" (prep
// "from"), or "" when the port's chains were not compared one by one.
func (p ServicePort) chainsWhere(ep string, of func(ChainSide) []string, prep string) string {
	if p.VirtualServers {
		return p.serversWhere(ep, of, prep)
	}
	var chains []string
	for _, c := range p.ByChain {
		if slices.Contains(of(c), ep) {
			chains = append(chains, c.Chain)
		}
	}
	switch len(chains) {
	case 0:
		return ""
	case 1:
		return " " + prep + " the " + chains[0] + " chain"
	}
	return " " + prep + " the " + strings.Join(chains, " and ") + " chains"
}

// serversWhere is chainsWhere in IPVS mode: " in 10.96.0.10:53/UDP (cluster)".
func (p ServicePort) serversWhere(ep string, of func(ChainSide) []string, prep string) string {
	var servers []string
	for _, c := range p.ByChain {
		if slices.Contains(of(c), ep) {
			servers = append(servers, c.Name+" ("+c.Chain+")")
		}
	}
	if len(servers) == 0 {
		return ""
	}
	return " " + prep + " " + strings.Join(servers, ", ")
}

// ExitCode is diagnose's verdict for scripts.
func ExitCode(r verdict.Report) int { return r.Verdict.ExitCode() }

// Write prints res in format (text or json).
func (res Result) Write(w io.Writer, format string) error {
	if format == "json" {
		b, err := json.MarshalIndent(res, "", "  ")
		if err != nil {
			return err
		}
		_, err = w.Write(append(b, '\n'))
		return err
	}
	if err := verdict.WriteText(w, res.Report); err != nil {
		return err
	}
	for _, p := range res.ServicePorts {
		if err := p.writeText(w, res.WindowSeconds); err != nil {
			return err
		}
	}
	return nil
}

func (p ServicePort) writeText(w io.Writer, window float64) error {
	var b strings.Builder
	fmt.Fprintf(&b, "\nservice %s", p.Service)
	if len(p.ClusterIPs) > 0 {
		fmt.Fprintf(&b, ", cluster IP %s", strings.Join(p.ClusterIPs, ", "))
	}
	fmt.Fprintf(&b, ": %d endpoints in the API for this node, %d programmed", len(p.Expected), len(p.Programmed))
	if len(p.Missing)+len(p.Stale) > 0 {
		fmt.Fprintf(&b, " (now %d missing, %d stale)", len(p.Missing), len(p.Stale))
	}
	b.WriteString("\n")
	var table bytes.Buffer
	tw := tabwriter.NewWriter(&table, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  endpoint\tAPI\trules\t")
	all := slices.Concat(p.Expected, p.Stale)
	slices.SortFunc(all, func(a, b string) int {
		return netip.MustParseAddrPort(a).Compare(netip.MustParseAddrPort(b))
	})
	for _, ep := range slices.Compact(all) {
		api, prog := "yes", "yes"
		var notes []string
		if slices.Contains(p.Missing, ep) {
			if !slices.Contains(p.Programmed, ep) {
				prog = "-"
			}
			notes = append(notes, "missing"+p.chainsWhere(ep, func(c ChainSide) []string { return c.Missing }, "from"))
		}
		if slices.Contains(p.Stale, ep) {
			if !slices.Contains(p.Expected, ep) {
				api = "-"
			}
			notes = append(notes, "stale"+p.chainsWhere(ep, func(c ChainSide) []string { return c.Stale }, "in"))
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", ep, api, prog, strings.Join(notes, ", "))
	}
	tw.Flush()
	for line := range strings.Lines(table.String()) {
		b.WriteString(strings.TrimRight(line, " \n") + "\n")
	}
	holders := "chains"
	if p.VirtualServers {
		holders = "virtual servers"
	}
	if len(p.Chains) > 0 {
		fmt.Fprintf(&b, "  %s: %s\n", holders, strings.Join(p.Chains, ", "))
	} else {
		fmt.Fprintf(&b, "  %s: none found in the rules\n", holders)
	}
	if len(p.UnrepliedFlows) == 0 {
		b.WriteString("  unreplied flows: none\n")
	}
	for _, u := range p.UnrepliedFlows {
		fmt.Fprintf(&b, "  unreplied flows, %s: %d ended unreplied in the last %s, %d waiting for a reply now\n",
			u.Reason, u.Ended, verdict.FormatDuration(time.Duration(window*float64(time.Second))), u.Open)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// NotCheckedMessage says, for stderr, what could not be checked.
func NotCheckedMessage(r verdict.Report) string {
	var b strings.Builder
	b.WriteString("proxyhealth diagnose: could not check everything:\n")
	for _, n := range r.NotChecked {
		causes := make([]string, 0, len(n.Causes))
		for _, c := range n.Causes {
			causes = append(causes, string(c))
		}
		fmt.Fprintf(&b, "  %s: %s\n", strings.Join(causes, ", "), n.Reason)
	}
	return b.String()
}
