package rules

import (
	"bytes"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/proxyhealth/proxyhealth/internal/cluster"
	"github.com/proxyhealth/proxyhealth/internal/hostrules"
)

// generateCluster writes kube-proxy iptables-mode nat rules for services x endpoints, the way
// kube-proxy v1.36 writes them, and the matching API view.
func generateCluster(services, endpoints int) ([]byte, *cluster.Snapshot) {
	var b bytes.Buffer
	snap := &cluster.Snapshot{Synced: true, Fresh: true}
	b.WriteString("*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n:KUBE-MARK-MASQ - [0:0]\n:KUBE-SERVICES - [0:0]\n")
	var rules strings.Builder
	for s := range services {
		name := cluster.ServicePortName{Namespace: fmt.Sprintf("ns%d", s%100), Name: fmt.Sprintf("svc%d", s), Port: "http", Protocol: "TCP"}
		vip := netip.AddrFrom4([4]byte{10, 96, byte(s >> 8), byte(s)})
		sp := cluster.ServicePort{Name: name, ClusterIPs: []netip.Addr{vip}, Port: 80}
		svc := clusterChain(name)
		fmt.Fprintf(&b, ":%s - [0:0]\n", svc)
		fmt.Fprintf(&rules, "-A KUBE-SERVICES -d %s/32 -p tcp -m comment --comment \"%s cluster IP\" -m tcp --dport 80 -j %s\n", vip, name, svc)
		for e := range endpoints {
			ep := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(128 + s>>13), byte(s >> 5), byte(s<<3 | e&7)}), uint16(8080+e))
			sp.ClusterEndpoints = append(sp.ClusterEndpoints, ep)
			sep := "KUBE-SEP-" + portProtoHash(name.String(), "tcp"+ep.String())
			fmt.Fprintf(&b, ":%s - [0:0]\n", sep)
			fmt.Fprintf(&rules, "-A %s -m comment --comment \"%s -> %s\" -m statistic --mode random --probability %.11f -j %s\n", svc, name, ep, 1/float64(endpoints-e), sep)
			fmt.Fprintf(&rules, "-A %s -s %s/32 -m comment --comment \"%s\" -j KUBE-MARK-MASQ\n", sep, ep.Addr(), name)
			fmt.Fprintf(&rules, "-A %s -p tcp -m comment --comment \"%s\" -m tcp -j DNAT --to-destination %s\n", sep, name, ep)
		}
		snap.Ports = append(snap.Ports, sp)
	}
	b.WriteString(rules.String())
	b.WriteString("COMMIT\n")
	return b.Bytes(), snap
}

func TestGeneratedClusterHasNoDrift(t *testing.T) {
	nat, snap := generateCluster(50, 10)
	rules, _, err := readIPTablesNAT(bytes.NewReader(nat))
	if err != nil {
		t.Fatal(err)
	}
	res := newDriftEngine(0).check(snap, map[bool]programmedRules{false: rules}, time.Unix(1, 0))
	if res.checked != 50 || len(res.drifting) != 0 || res.orphans != 0 {
		t.Errorf("checked %d drifting %d orphans %d, want 50, 0, 0", res.checked, len(res.drifting), res.orphans)
	}
}

// BenchmarkParseAndCompare measures the exporter's side of a drift check: reading the nat
// table and comparing it with the API view. Run at scale with
// go test -bench ParseAndCompare -benchtime 3x ./collectors/rules (-services=10000 is the default).
func BenchmarkParseAndCompare(b *testing.B) {
	services := 10000
	if testing.Short() {
		services = 200
	}
	nat, snap := generateCluster(services, 10)
	b.SetBytes(int64(len(nat)))
	b.ReportAllocs()
	e := newDriftEngine(time.Minute)
	for b.Loop() {
		rules, _, err := readIPTablesNAT(bytes.NewReader(nat))
		if err != nil {
			b.Fatal(err)
		}
		res := e.check(snap, map[bool]programmedRules{false: rules}, time.Unix(1, 0))
		if res.checked != services {
			b.Fatalf("checked %d", res.checked)
		}
	}
}

// BenchmarkCompareOnly is a check whose rules did not change: the comparison against the API
// still runs (incident 3 is "rules unchanged, API changed"), the read and parse do not. The
// rules are handed in as the collector does, from the netfilter reader's state.
func BenchmarkCompareOnly(b *testing.B) {
	services := 10000
	if testing.Short() {
		services = 200
	}
	nat, snap := generateCluster(services, 10)
	read, _, err := readIPTablesNAT(bytes.NewReader(nat))
	if err != nil {
		b.Fatal(err)
	}
	e := newDriftEngine(time.Minute)
	rules := programmedByFamily(stateOf(hostrules.ModeIPTables, read.chains), e.names)
	b.ReportAllocs()
	for b.Loop() {
		if res := e.check(snap, rules, time.Unix(1, 0)); res.checked != services || len(res.drifting) != 0 {
			b.Fatalf("checked %d, drifting %d; want %d, 0", res.checked, len(res.drifting), services)
		}
	}
}

func FuzzProgrammedRules(f *testing.F) {
	nat, _ := generateCluster(2, 2)
	f.Add(string(nat))
	f.Add("*nat\n:KUBE-SVC-X - [0:0]\n:KUBE-SEP-Y - [0:0]\n-A KUBE-SVC-X -j KUBE-SEP-Y\n-A KUBE-SEP-Y -j DNAT --to-destination [fd00::1]:80\nCOMMIT\n")
	f.Fuzz(func(t *testing.T, s string) {
		r, _, err := readIPTablesNAT(strings.NewReader(s))
		if err != nil {
			return
		}
		// Whatever the input, the result is usable by the drift engine.
		newDriftEngine(0).check(&cluster.Snapshot{Fresh: true, Ports: []cluster.ServicePort{dnsPort("10.244.1.5:53")}},
			map[bool]programmedRules{false: r}, time.Unix(1, 0))
	})
}
