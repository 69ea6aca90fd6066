package nftnl

import (
	"bytes"
	"context"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/proxyhealth/proxyhealth/internal/ruleset"
	"github.com/proxyhealth/proxyhealth/internal/testsupport/iptables"
	"github.com/proxyhealth/proxyhealth/internal/testsupport/prereq"
)

// These tests decode the recorded kernel replies of the kernel tests (testdata/*.replay.json,
// rewritten by `go test ./internal/nftnl/ -run Kernel -args -update` as root), so they run
// without root.

func TestReplayIPTablesNAT(t *testing.T) {
	pt, err := readIPTablesNAT(context.Background(), loadReplay(t, "testdata/kube-proxy-v1.36.3-nat.replay.json"), nfproto(false))
	if err != nil {
		t.Fatal(err)
	}
	// The services the text reader finds in the same capture, with the same fields.
	rs, err := iptables.Parse(bytes.NewReader(readFile(t, natCapture)))
	if err != nil {
		t.Fatal(err)
	}
	var want []ruleset.Service
	for _, sp := range iptables.KubeServices(rs) {
		proto := map[string]uint8{"tcp": ruleset.ProtoTCP, "udp": ruleset.ProtoUDP, "sctp": ruleset.ProtoSCTP}[sp.Protocol]
		want = append(want, ruleset.Service{ClusterIP: sp.ClusterIP, Port: sp.Port, Protocol: proto,
			Namespace: sp.Namespace, Name: sp.Name, PortName: sp.PortName, Chain: sp.Chain})
	}
	sortServices(want)
	if !slices.Equal(pt.Services, want) {
		t.Errorf("services\n got %+v\nwant %+v", pt.Services, want)
	}
	if got := pt.Chains["KUBE-SVC-ZKJWP2ZV4NN5G7EZ"]; len(got) != 11 || got[0] != netip.MustParseAddrPort("10.244.3.3:8080") {
		t.Errorf("lab/backend: %v, want its 11 endpoints sorted", got)
	}
	if got := pt.Chains["KUBE-SVL-T4KSMH6CJWHYYXER"]; len(got) != 2 {
		t.Errorf("lab/local-only local chain: %v, want 2 endpoints", got)
	}
	if len(pt.Chains) != 9 {
		t.Errorf("%d service chains, want the capture's 9", len(pt.Chains))
	}
}

func TestReplayKubeProxyNFT(t *testing.T) {
	pt, err := readKubeProxyNFT(context.Background(), loadReplay(t, "testdata/kube-proxy-v1.36.3-nftables.replay.json"), nfproto(false))
	if err != nil {
		t.Fatal(err)
	}
	if len(pt.Chains) != 11 {
		t.Errorf("%d service chains, want 11: %v", len(pt.Chains), pt.Chains)
	}
	sticky := pt.Chains["service-Z3H4B3DO-lab/sticky/tcp/http"] // ClientIP affinity: endpoint chains
	if want := []netip.AddrPort{netip.MustParseAddrPort("10.244.1.3:8080"), netip.MustParseAddrPort("10.244.3.70:8080"), netip.MustParseAddrPort("10.244.3.71:8080")}; !slices.Equal(sticky, want) {
		t.Errorf("sticky: %v, want %v", sticky, want)
	}
	if got := pt.Chains["service-DHKNYPQA-lab/backend/tcp/http"]; len(got) != 11 {
		t.Errorf("backend (inline map): %v, want 11 endpoints", got)
	}
	if len(pt.Services) != 9 {
		t.Errorf("%d services, want the 9 cluster IP elements of service-ips: %+v", len(pt.Services), pt.Services)
	}
	for _, s := range pt.Services {
		if s.Chain == "service-FY5PMXPG-kube-system/kube-dns/udp/dns" {
			want := ruleset.Service{ClusterIP: netip.MustParseAddr("10.96.0.10"), Port: 53, Protocol: ruleset.ProtoUDP,
				Namespace: "kube-system", Name: "kube-dns", PortName: "dns", Chain: s.Chain}
			if s != want {
				t.Errorf("kube-dns udp: %+v, want %+v", s, want)
			}
		}
	}
}

func TestReplayForwardGraphsMatchTextReaders(t *testing.T) {
	for _, fx := range invalidDropFixtures(t) {
		t.Run(fx.name, func(t *testing.T) {
			path := "testdata/graph-" + fx.name + ".replay.json"
			if _, err := os.Stat(path); err != nil {
				prereq.Skipf(t, "no recording: %v", err)
			}
			gs, err := forwardGraphs(context.Background(), loadReplay(t, path))
			if err != nil {
				t.Fatal(err)
			}
			got, p := fx.found(gs)
			if want := fx.expected(t); got != want {
				t.Errorf("INVALID drop found = %v (path %q), the text reader says %v", got, p, want)
			}
			if fx.name == "iptables-kube-proxy" && (len(p) != 3 || !strings.HasPrefix(p[2], "ip filter KUBE-FORWARD handle")) {
				t.Errorf("kube-proxy's drop: path %q, want FORWARD -> KUBE-FORWARD rule", p)
			}
		})
	}
}
