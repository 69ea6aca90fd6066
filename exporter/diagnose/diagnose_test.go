package diagnose

import (
	"bytes"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/proxyhealth/proxyhealth/collectors/rules"
	"github.com/proxyhealth/proxyhealth/internal/cluster"
	"github.com/proxyhealth/proxyhealth/internal/hostrules"
	"github.com/proxyhealth/proxyhealth/internal/ipvs"
	"github.com/proxyhealth/proxyhealth/internal/verdict"
)

func TestWantsDiagnose(t *testing.T) {
	for args, want := range map[string]bool{
		"diagnose --window=1s":          true,
		"--kubeconfig=x diagnose":       true,
		"--web.listen-address=:9869":    false,
		"-- diagnose":                   false,
		"--kubeproxy.log-path=/x/*.log": false,
	} {
		if got := Wanted(strings.Fields(args)); got != want {
			t.Errorf("Wanted(%q) = %v", args, got)
		}
	}
}

// An endpoint the local chain lacks while the cluster chain still holds it (a NodePort with
// externalTrafficPolicy: Local after a partial restore) is missing, and --service says from
// which chain: the side-by-side view agrees with the stale_rules finding.
func TestDiagnoseServicePerChain(t *testing.T) {
	ap := netip.MustParseAddrPort
	local, remote := ap("10.244.1.4:8080"), ap("10.244.2.7:8080")
	d := &Diagnosis[struct{}]{Config: Config{Service: "shop/web"}, Service: func(namespace, name string) ([]rules.PortEndpoints, error) {
		return []rules.PortEndpoints{{
			Name:       cluster.ServicePortName{Namespace: "shop", Name: "web", Port: "http", Protocol: "TCP"},
			Port:       80,
			ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.20")},
			Expected:   []netip.AddrPort{local, remote},
			Programmed: []netip.AddrPort{local, remote},
			Missing:    []netip.AddrPort{local},
			Stale:      []netip.AddrPort{},
			Chains:     []string{"KUBE-SVC-AAAA", "KUBE-SVL-AAAA"},
			ByChain: []rules.ChainEndpoints{
				{Chain: rules.ClusterChain, Name: "KUBE-SVC-AAAA", Expected: []netip.AddrPort{local, remote}, Programmed: []netip.AddrPort{local, remote}},
				{Chain: rules.LocalChain, Name: "KUBE-SVL-AAAA", Expected: []netip.AddrPort{local}, Programmed: []netip.AddrPort{}, Missing: []netip.AddrPort{local}},
			},
		}}, nil
	}}
	ports, err := d.servicePorts(verdict.Input{})
	if err != nil {
		t.Fatal(err)
	}
	if len(ports) != 1 || strings.Join(ports[0].Missing, ",") != local.String() || len(ports[0].Stale) != 0 || len(ports[0].ByChain) != 2 {
		t.Fatalf("service ports %+v", ports)
	}
	var text bytes.Buffer
	if err := ports[0].writeText(&text, 15); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"2 endpoints in the API for this node, 2 programmed (now 1 missing, 0 stale)\n",
		"  10.244.1.4:8080  yes  yes    missing from the local chain\n",
		"  10.244.2.7:8080  yes  yes\n",
	} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text lacks %q:\n%s", want, text.String())
		}
	}
}

// In IPVS mode --service names the virtual servers: a NodePort with externalTrafficPolicy:
// Local whose node-port virtual server still holds a deleted remote endpoint, while the cluster
// IP's agrees with the API.
func TestDiagnoseServiceVirtualServers(t *testing.T) {
	ap := netip.MustParseAddrPort
	local, remote, gone := ap("10.244.1.4:8080"), ap("10.244.2.7:8080"), ap("10.244.2.9:8080")
	sp := &cluster.ServicePort{
		Name:       cluster.ServicePortName{Namespace: "shop", Name: "web", Port: "http", Protocol: "TCP"},
		Port:       80,
		NodePort:   30080,
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.20")},
		// externalTrafficPolicy: Local, this node running one of the two endpoints.
		ExternalLocal:    true,
		ClusterEndpoints: []netip.AddrPort{local, remote},
		LocalEndpoints:   []netip.AddrPort{local},
	}
	realServers := func(eps ...netip.AddrPort) []ipvs.RealServer {
		var out []ipvs.RealServer
		for _, ep := range eps {
			out = append(out, ipvs.RealServer{Addr: ep, Weight: 1})
		}
		return out
	}
	table := ipvs.NewTable(nil, []ipvs.VirtualServer{
		{Key: ipvs.Key{Addr: netip.MustParseAddr("10.96.0.20"), Port: 80, Protocol: "TCP"}, RealServers: realServers(local, remote)},
		{Key: ipvs.Key{Addr: netip.MustParseAddr("192.168.1.5"), Port: 30080, Protocol: "TCP"}, RealServers: realServers(local, gone)},
	}, []netip.Addr{netip.MustParseAddr("10.96.0.20")}, time.Unix(1000, 0))
	st := &hostrules.State{Mode: hostrules.ModeIPVS, Backend: hostrules.BackendIPVS, IPVS: table}
	d := &Diagnosis[struct{}]{Config: Config{Service: "shop/web"}, Service: func(namespace, name string) ([]rules.PortEndpoints, error) {
		return rules.ServiceEndpoints(&cluster.Snapshot{Ports: []*cluster.ServicePort{sp}}, st, namespace, name), nil
	}}
	ports, err := d.servicePorts(verdict.Input{Rules: verdict.RulesFacts{Mode: "ipvs"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(ports) != 1 || strings.Join(ports[0].Stale, ",") != gone.String() || len(ports[0].Missing) != 0 || len(ports[0].ByChain) != 2 {
		t.Fatalf("service ports %+v", ports)
	}
	var text bytes.Buffer
	if err := ports[0].writeText(&text, 15); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"stale in 192.168.1.5:30080/TCP (local)\n",
		"  virtual servers: 10.96.0.20:80/TCP, 192.168.1.5:30080/TCP\n",
	} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text lacks %q:\n%s", want, text.String())
		}
	}
}
