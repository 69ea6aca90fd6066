package conntrack

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os/exec"
	"strings"
	"time"

	"github.com/proxyhealth/proxyhealth/internal/cluster"
	"github.com/proxyhealth/proxyhealth/internal/command"
	"github.com/proxyhealth/proxyhealth/internal/iptables"
)

// serviceMap is a ServiceMap held in memory.
type serviceMap map[serviceKey]Service

type serviceKey struct {
	addr  netip.Addr
	port  uint16
	proto uint8
}

func (m serviceMap) Lookup(addr netip.Addr, port uint16, proto uint8) (Service, bool) {
	s, ok := m[serviceKey{addr.Unmap(), port, proto}]
	return s, ok
}

func (m serviceMap) Len() int { return len(m) }

// apiServiceMap maps each cluster IP, port and protocol of the API view to its Service.
func apiServiceMap(snap *cluster.Snapshot) serviceMap {
	m := make(serviceMap, len(snap.Ports))
	for i := range snap.Ports {
		sp := &snap.Ports[i]
		proto, ok := protocolNumbers[strings.ToLower(sp.Name.Protocol)]
		if !ok {
			continue
		}
		for _, ip := range sp.ClusterIPs {
			m[serviceKey{ip.Unmap(), sp.Port, proto}] = Service{Namespace: sp.Name.Namespace, Name: sp.Name.Name, Port: sp.Port}
		}
	}
	return m
}

type emptyServiceMap struct{}

func (emptyServiceMap) Lookup(netip.Addr, uint16, uint8) (Service, bool) { return Service{}, false }
func (emptyServiceMap) Len() int                                         { return 0 }

// serviceSource loads the current ServiceMap.
type serviceSource interface {
	load(ctx context.Context) ServiceMap
}

// kubeProxyServices reads the Service map from kube-proxy's iptables rules: each KUBE-SERVICES
// rule gives a cluster IP, port and protocol, and its comment the namespace and name. Only that
// chain is listed (`iptables -t nat -S KUBE-SERVICES`), not the whole nat table, which is tens
// of megabytes on a large cluster. Every backend present is read, since kube-proxy writes to
// one of them and either may be the node's.
type kubeProxyServices struct {
	procPath string
	logger   *slog.Logger
	run      func(ctx context.Context, name string, args ...string) ([]byte, error)
	lookPath func(string) (string, error)
	lastNote string
}

func newKubeProxyServices(procPath string, logger *slog.Logger) *kubeProxyServices {
	return &kubeProxyServices{procPath: procPath, logger: logger, run: runCommand, lookPath: exec.LookPath}
}

func runCommand(ctx context.Context, name string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := command.Run(ctx, name, args...)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), err)
	}
	return out, nil
}

var iptablesBinaries = []string{"iptables-nft", "iptables-legacy", "ip6tables-nft", "ip6tables-legacy"}

func (k *kubeProxyServices) load(ctx context.Context) ServiceMap {
	m := serviceMap{}
	var found []string
	var problems []string
	for _, bin := range iptablesBinaries {
		path, err := k.lookPath(bin)
		if err != nil {
			continue
		}
		if strings.HasSuffix(bin, "-legacy") {
			exists, err := iptables.LegacyTableExists(k.procPath, strings.HasPrefix(bin, "ip6"), "nat")
			if err != nil {
				problems = append(problems, err.Error())
			}
			if !exists {
				continue
			}
		}
		out, err := k.run(ctx, path, "-w", "5", "-t", "nat", "-S", "KUBE-SERVICES")
		if err != nil {
			// A missing chain or table exits 1 with varying words ("No chain/target/match",
			// "incompatible, use 'nft' tool" when the nat table is not iptables-nft's);
			// only a refusal or a hang means the rules exist but cannot be read.
			if msg := err.Error(); strings.Contains(msg, "ermission denied") || strings.Contains(msg, "not permitted") || errors.Is(err, context.DeadlineExceeded) {
				problems = append(problems, msg)
			}
			continue
		}
		ports, err := parseChainListing(out)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", bin, err))
			continue
		}
		found = append(found, bin)
		for _, p := range ports {
			proto, ok := protocolNumbers[p.Protocol]
			if !ok {
				continue
			}
			m[serviceKey{p.ClusterIP.Unmap(), p.Port, proto}] = Service{Namespace: p.Namespace, Name: p.Name, Port: p.Port}
		}
	}
	var note string
	switch {
	case len(problems) > 0:
		note = "cannot read kube-proxy's KUBE-SERVICES rules; flows are attributed only to Services found elsewhere: " + strings.Join(problems, "; ")
	case len(found) == 0:
		note = "no KUBE-SERVICES chain in any iptables backend (no kube-proxy in iptables mode here, or no iptables binary): unreplied flows are reported with reason no_service and empty service labels"
	default:
		note = fmt.Sprintf("attributing flows to %d Service ports from kube-proxy's rules (%s)", len(m), strings.Join(found, ", "))
	}
	if note != k.lastNote {
		// Said once, and again only when it changes.
		if len(problems) > 0 {
			k.logger.Warn(note)
		} else {
			k.logger.Info(note)
		}
		k.lastNote = note
	}
	return m
}

var protocolNumbers = map[string]uint8{"tcp": 6, "udp": 17, "sctp": 132}

// parseChainListing parses `iptables -t nat -S KUBE-SERVICES` output, which is iptables-save's
// rule syntax without the table framing, by adding that framing.
func parseChainListing(out []byte) ([]iptables.ServicePort, error) {
	var b strings.Builder
	b.WriteString("*nat\n:KUBE-SERVICES - [0:0]\n")
	for line := range strings.SplitSeq(string(out), "\n") {
		if strings.HasPrefix(line, "-A ") {
			b.WriteString(line)
			b.WriteByte('\n')
		}
	}
	b.WriteString("COMMIT\n")
	rs, err := iptables.ParseString(b.String())
	if err != nil {
		return nil, err
	}
	return iptables.KubeServices(rs), nil
}
