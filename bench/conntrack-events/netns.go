//go:build linux

package main

import (
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/proxyhealth/proxyhealth/internal/kubeproxynames"
)

// Addresses inside the benchmark namespace. The client "pods" (the sources of the flows) are
// local addresses on the namespace's loopback; the service VIPs and the endpoints are routed
// to a veth whose peer (in the same namespace) is down, so every datagram is dropped by the
// veth after conntrack has confirmed its flow: no packet ever leaves the namespace, and no
// receive path or ICMP error adds to the generator's cost.
const (
	nsPrefix       = "ph-bench-"
	defaultVIP     = "10.96.0.10"
	defaultPort    = 53
	defaultClients = "10.244.128.0/17"
	loClientAddr   = "10.244.128.1/17"
	clusterCIDR    = "10.244.0.0/16"
	podRoute       = "10.244.0.0/17"
	serviceCIDR    = "10.96.0.0/16"
	vethOut        = "ph0"
	vethPeer       = "ph1"
)

// endpoints of the benchmarked service (kube-dns shaped: three pods, UDP 53).
var endpoints = []string{"10.244.1.2", "10.244.1.3", "10.244.1.4"}

// run runs a command with a deadline and returns its combined output in the error.
func run(ctx context.Context, stdin string, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// setupNS creates the namespace and programs it: loopback addresses, conntrack sysctls and
// kube-proxy shaped iptables rules.
func setupNS(ctx context.Context, name string, udpTimeout, fillerServices, listenPort int) error {
	if _, err := run(ctx, "", "ip", "netns", "add", name); err != nil {
		return err
	}
	steps := [][]string{
		{"ip", "-n", name, "link", "set", "lo", "up"},
		{"ip", "-n", name, "addr", "add", loClientAddr, "dev", "lo"},
		{"ip", "-n", name, "link", "add", vethOut, "type", "veth", "peer", "name", vethPeer},
		{"ip", "-n", name, "link", "set", vethOut, "up"},
		{"ip", "-n", name, "route", "add", podRoute, "dev", vethOut},
		{"ip", "-n", name, "route", "add", serviceCIDR, "dev", vethOut},
	}
	for i, ep := range endpoints {
		steps = append(steps, []string{"ip", "-n", name, "neigh", "replace", ep, "lladdr",
			fmt.Sprintf("02:00:0a:f4:01:%02x", i+2), "dev", vethOut, "nud", "permanent"})
	}
	for _, s := range steps {
		if _, err := run(ctx, "", s[0], s[1:]...); err != nil {
			return err
		}
	}
	if _, err := run(ctx, kubeProxyRules(fillerServices, listenPort), "ip", "netns", "exec", name, "iptables-restore"); err != nil {
		return err
	}
	// The conntrack sysctls exist once the rules above have made the namespace track.
	sysctls := map[string]string{
		"net.netfilter.nf_conntrack_udp_timeout":        strconv.Itoa(udpTimeout),
		"net.netfilter.nf_conntrack_udp_timeout_stream": strconv.Itoa(max(udpTimeout, 2)),
	}
	for k, v := range sysctls {
		if _, err := run(ctx, "", "ip", "netns", "exec", name, "sysctl", "-q", "-w", k+"="+v); err != nil {
			return err
		}
	}
	return nil
}

// nsSysctl reads a sysctl inside the namespace.
func nsSysctl(ctx context.Context, ns, key string) string {
	out, err := run(ctx, "", "ip", "netns", "exec", ns, "sysctl", "-n", key)
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(out)
}

// kubeProxyRules renders the nat table the way kube-proxy's iptables mode writes
// them for the benchmarked UDP service (three endpoints, random probability chain) plus
// fillerServices TCP services in front of it in KUBE-SERVICES. The raw table leaves the
// exporter's port (listenPort) untracked.
func kubeProxyRules(fillerServices, listenPort int) string {
	var nat, chains strings.Builder
	svc := func(namespace, service, portName, vip, proto string, port int, eps []string) {
		name := namespace + "/" + service + ":" + portName
		svcChain, _ := kubeproxynames.IPTablesServiceChains(namespace, service, portName, proto)
		comment := name + " cluster IP"
		fmt.Fprintf(&chains, ":%s - [0:0]\n", svcChain)
		fmt.Fprintf(&nat, "-A KUBE-SERVICES -d %s/32 -p %s -m comment --comment %q -m %s --dport %d -j %s\n", vip, proto, comment, proto, port, svcChain)
		fmt.Fprintf(&nat, "-A %s ! -s %s -d %s/32 -p %s -m comment --comment %q -m %s --dport %d -j KUBE-MARK-MASQ\n", svcChain, clusterCIDR, vip, proto, comment, proto, port)
		for i, ep := range eps {
			sepChain := kubeproxynames.IPTablesEndpointChain(namespace, service, portName, proto, netip.AddrPortFrom(netip.MustParseAddr(ep), uint16(port)))
			fmt.Fprintf(&chains, ":%s - [0:0]\n", sepChain)
			rule := fmt.Sprintf("-A %s -m comment --comment \"%s -> %s:%d\"", svcChain, name, ep, port)
			if left := len(eps) - i; left > 1 {
				rule += fmt.Sprintf(" -m statistic --mode random --probability %.11f", 1/float64(left))
			}
			fmt.Fprintf(&nat, "%s -j %s\n", rule, sepChain)
			fmt.Fprintf(&nat, "-A %s -s %s/32 -m comment --comment %q -j KUBE-MARK-MASQ\n", sepChain, ep, name)
			fmt.Fprintf(&nat, "-A %s -p %s -m comment --comment %q -m %s -j DNAT --to-destination %s:%d\n", sepChain, proto, name, proto, ep, port)
		}
	}
	for i := 0; i < fillerServices; i++ {
		svc("bench", fmt.Sprintf("filler-%d", i), "http", fmt.Sprintf("10.96.%d.%d", 1+i/250, 1+i%250), "tcp", 80,
			[]string{fmt.Sprintf("10.244.%d.%d", 2+i/250, 1+i%250)})
	}
	svc("kube-system", "kube-dns", "dns", defaultVIP, "udp", defaultPort, endpoints)

	var b strings.Builder
	b.WriteString("*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n")
	b.WriteString(":KUBE-SERVICES - [0:0]\n:KUBE-NODEPORTS - [0:0]\n:KUBE-POSTROUTING - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n")
	b.WriteString(chains.String())
	b.WriteString("-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n")
	b.WriteString("-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n")
	b.WriteString("-A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING\n")
	b.WriteString("-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000\n")
	b.WriteString("-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN\n")
	b.WriteString("-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0\n")
	b.WriteString("-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully\n")
	b.WriteString(nat.String())
	b.WriteString("-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS\n")
	b.WriteString("COMMIT\n")
	// Scrapes of the exporter are not tracked: they would add events and linger in TIME_WAIT.
	b.WriteString("*raw\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n")
	for _, chain := range []string{"PREROUTING", "OUTPUT"} {
		for _, dir := range []string{"--dport", "--sport"} {
			fmt.Fprintf(&b, "-A %s -p tcp -m tcp %s %d -j CT --notrack\n", chain, dir, listenPort)
		}
	}
	b.WriteString("COMMIT\n")
	return b.String()
}
