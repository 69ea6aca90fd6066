package cluster

import (
	"net/netip"
	"slices"
	"testing"
)

// The cases are kube-proxy v1.36's TestCategorizeEndpoints (pkg/proxy/topology_test.go), with
// the feature-gate-disabled one left out (PreferSameTrafficDistribution is locked on). nil
// expectations mean "no chain of that kind" (kube-proxy's test tells nil from empty; both
// give no chain, so both are nil here).

func tep(addr string, mod ...func(*endpoint)) endpoint {
	ep := endpoint{addr: netip.MustParseAddrPort(addr)}
	for _, m := range mod {
		m(&ep)
	}
	return ep
}

var (
	ready       = func(e *endpoint) { e.ready, e.serving = true, true }
	unready     = func(e *endpoint) { e.ready = false }
	servingTerm = func(e *endpoint) { e.ready, e.serving, e.terminating = false, true, true }
	isLocal     = func(e *endpoint) { e.local = true }
)

func zones(z ...string) func(*endpoint) { return func(e *endpoint) { e.zoneHints = z } }
func nodes(n ...string) func(*endpoint) { return func(e *endpoint) { e.nodeHints = n } }

func addrs(s ...string) []netip.AddrPort {
	var out []netip.AddrPort
	for _, a := range s {
		out = append(out, netip.MustParseAddrPort(a))
	}
	return sortAddrs(out)
}

func TestCategorizeEndpoints(t *testing.T) {
	nodePort := trafficPolicy{externallyAccessible: true}
	cases := []struct {
		name      string
		nodeName  string
		zone      string
		policy    trafficPolicy
		endpoints []endpoint
		cluster   []netip.AddrPort
		local     []netip.AddrPort
	}{{
		name: "topology used: all endpoints hinted, node has a zone, endpoints for its zone",
		zone: "zone-a",
		endpoints: []endpoint{
			tep("10.1.2.3:80", ready, zones("zone-a")),
			tep("10.1.2.4:80", ready, zones("zone-b")),
			tep("10.1.2.5:80", ready, zones("zone-c")),
			tep("10.1.2.6:80", ready, zones("zone-a")),
		},
		cluster: addrs("10.1.2.3:80", "10.1.2.6:80"),
	}, {
		name:   "externalTrafficPolicy Local: topology ignored for local endpoints",
		zone:   "zone-a",
		policy: trafficPolicy{externalLocal: true, externallyAccessible: true},
		endpoints: []endpoint{
			tep("10.1.2.3:80", ready, isLocal, zones("zone-a")),
			tep("10.1.2.4:80", ready, isLocal, zones("zone-b")),
			tep("10.1.2.5:80", ready, zones("zone-c")),
			tep("10.1.2.6:80", ready, zones("zone-a")),
		},
		cluster: addrs("10.1.2.3:80", "10.1.2.6:80"),
		local:   addrs("10.1.2.3:80", "10.1.2.4:80"),
	}, {
		name:   "internalTrafficPolicy Local with a node port: topology ignored for local endpoints",
		zone:   "zone-a",
		policy: trafficPolicy{internalLocal: true, externallyAccessible: true},
		endpoints: []endpoint{
			tep("10.1.2.3:80", ready, isLocal, zones("zone-a")),
			tep("10.1.2.4:80", ready, isLocal, zones("zone-b")),
			tep("10.1.2.5:80", ready, zones("zone-c")),
			tep("10.1.2.6:80", ready, zones("zone-a")),
		},
		cluster: addrs("10.1.2.3:80", "10.1.2.6:80"),
		local:   addrs("10.1.2.3:80", "10.1.2.4:80"),
	}, {
		name:      "node without zone label: hints ignored",
		endpoints: []endpoint{tep("10.1.2.3:80", ready, zones("zone-a"))},
		cluster:   addrs("10.1.2.3:80"),
	}, {
		name:      "node in a zone no endpoint is hinted for: hints ignored",
		zone:      "zone-b",
		endpoints: []endpoint{tep("10.1.2.3:80", ready, zones("zone-a"))},
		cluster:   addrs("10.1.2.3:80"),
	}, {
		name: "unready endpoint in this zone is left out",
		zone: "zone-a",
		endpoints: []endpoint{
			tep("10.1.2.3:80", ready, zones("zone-a")),
			tep("10.1.2.4:80", ready, zones("zone-b")),
			tep("10.1.2.5:80", ready, zones("zone-c")),
			tep("10.1.2.6:80", unready, zones("zone-a")),
		},
		cluster: addrs("10.1.2.3:80"),
	}, {
		name: "only unready endpoints in this zone: hints ignored",
		zone: "zone-a",
		endpoints: []endpoint{
			tep("10.1.2.3:80", unready, zones("zone-a")),
			tep("10.1.2.4:80", ready, zones("zone-b")),
			tep("10.1.2.5:80", ready, zones("zone-c")),
			tep("10.1.2.6:80", unready, zones("zone-a")),
		},
		cluster: addrs("10.1.2.4:80", "10.1.2.5:80"),
	}, {
		name: "one ready endpoint without hints: hints ignored",
		zone: "zone-a",
		endpoints: []endpoint{
			tep("10.1.2.3:80", ready, zones("zone-a")),
			tep("10.1.2.4:80", ready, zones("zone-b")),
			tep("10.1.2.5:80", ready),
			tep("10.1.2.6:80", ready, zones("zone-a")),
		},
		cluster: addrs("10.1.2.3:80", "10.1.2.4:80", "10.1.2.5:80", "10.1.2.6:80"),
	}, {
		name: "several zone hints per endpoint: any naming this zone",
		zone: "zone-c",
		endpoints: []endpoint{
			tep("10.1.2.3:80", ready, zones("zone-a", "zone-b", "zone-c")),
			tep("10.1.2.4:80", ready, zones("zone-b", "zone-c")),
			tep("10.1.2.5:80", ready, zones("zone-b", "zone-d")),
			tep("10.1.2.6:80", ready, zones("zone-c")),
		},
		cluster: addrs("10.1.2.3:80", "10.1.2.4:80", "10.1.2.6:80"),
	}, {
		name:     "node hints: PreferSameNode",
		nodeName: "node-1",
		zone:     "zone-a",
		endpoints: []endpoint{
			tep("10.1.2.3:80", ready, zones("zone-a"), nodes("node-1")),
			tep("10.1.2.4:80", ready, zones("zone-b"), nodes("node-2")),
			tep("10.1.2.5:80", ready, zones("zone-c"), nodes("node-3")),
			tep("10.1.2.6:80", ready, zones("zone-a"), nodes("node-4")),
		},
		cluster: addrs("10.1.2.3:80"),
	}, {
		name:     "node hints ignored when an endpoint has none (and so are zone hints here)",
		nodeName: "node-1",
		zone:     "zone-a",
		endpoints: []endpoint{
			tep("10.1.2.3:80", ready, zones("zone-a"), nodes("node-1")),
			tep("10.1.2.4:80", ready),
			tep("10.1.2.5:80", ready, zones("zone-c"), nodes("node-3")),
			tep("10.1.2.6:80", ready, zones("zone-a"), nodes("node-4")),
		},
		cluster: addrs("10.1.2.3:80", "10.1.2.4:80", "10.1.2.5:80", "10.1.2.6:80"),
	}, {
		name:     "no node hint for this node: falls back to zone hints",
		nodeName: "node-0",
		zone:     "zone-a",
		endpoints: []endpoint{
			tep("10.1.2.3:80", ready, zones("zone-a"), nodes("node-1")),
			tep("10.1.2.4:80", ready, zones("zone-b"), nodes("node-2")),
			tep("10.1.2.5:80", ready, zones("zone-c"), nodes("node-3")),
			tep("10.1.2.6:80", ready, zones("zone-a"), nodes("node-4")),
		},
		cluster: addrs("10.1.2.3:80", "10.1.2.6:80"),
	}, {
		name:   "topology and localness conflict",
		zone:   "zone-a",
		policy: trafficPolicy{externalLocal: true, externallyAccessible: true},
		endpoints: []endpoint{
			tep("10.0.0.0:80", ready, isLocal, zones("zone-a")),
			tep("10.0.0.1:80", ready, isLocal, zones("zone-b")),
			tep("10.0.0.2:80", ready, zones("zone-a")),
			tep("10.0.0.3:80", ready, zones("zone-b")),
		},
		cluster: addrs("10.0.0.0:80", "10.0.0.2:80"),
		local:   addrs("10.0.0.0:80", "10.0.0.1:80"),
	}, {
		name:   "internalTrafficPolicy Local, no endpoints",
		policy: trafficPolicy{internalLocal: true},
	}, {
		name:   "internalTrafficPolicy Local, all endpoints remote",
		policy: trafficPolicy{internalLocal: true},
		endpoints: []endpoint{
			tep("10.0.0.0:80", ready),
			tep("10.0.0.1:80", ready),
		},
	}, {
		name:   "internalTrafficPolicy Local, all endpoints local",
		policy: trafficPolicy{internalLocal: true},
		endpoints: []endpoint{
			tep("10.0.0.0:80", ready, isLocal),
			tep("10.0.0.1:80", ready, isLocal),
		},
		local: addrs("10.0.0.0:80", "10.0.0.1:80"),
	}, {
		name:   "internalTrafficPolicy Local, some endpoints local",
		policy: trafficPolicy{internalLocal: true},
		endpoints: []endpoint{
			tep("10.0.0.0:80", ready, isLocal),
			tep("10.0.0.1:80", ready),
		},
		local: addrs("10.0.0.0:80"),
	}, {
		name: "cluster policy, no endpoint ready",
		endpoints: []endpoint{
			tep("10.0.0.0:80", unready),
			tep("10.0.0.1:80", unready),
		},
	}, {
		name: "cluster policy, some endpoints ready",
		endpoints: []endpoint{
			tep("10.0.0.0:80", unready),
			tep("10.0.0.1:80", ready),
		},
		cluster: addrs("10.0.0.1:80"),
	}, {
		name: "cluster policy, all endpoints serving and terminating",
		endpoints: []endpoint{
			tep("10.0.0.0:80", servingTerm, isLocal),
			tep("10.0.0.1:80", servingTerm),
		},
		cluster: addrs("10.0.0.0:80", "10.0.0.1:80"),
	}, {
		name:   "iTP Local, eTP Cluster, some endpoints local",
		policy: nodePort.with(func(p *trafficPolicy) { p.internalLocal = true }),
		endpoints: []endpoint{
			tep("10.0.0.0:80", ready, isLocal),
			tep("10.0.0.1:80", ready),
		},
		cluster: addrs("10.0.0.0:80", "10.0.0.1:80"),
		local:   addrs("10.0.0.0:80"),
	}, {
		name:   "iTP Cluster, eTP Local, some endpoints local",
		policy: nodePort.with(func(p *trafficPolicy) { p.externalLocal = true }),
		endpoints: []endpoint{
			tep("10.0.0.0:80", ready, isLocal),
			tep("10.0.0.1:80", ready),
		},
		cluster: addrs("10.0.0.0:80", "10.0.0.1:80"),
		local:   addrs("10.0.0.0:80"),
	}, {
		name:   "iTP Local, eTP Local, some endpoints local",
		policy: nodePort.with(func(p *trafficPolicy) { p.internalLocal, p.externalLocal = true, true }),
		endpoints: []endpoint{
			tep("10.0.0.0:80", ready, isLocal),
			tep("10.0.0.1:80", ready),
		},
		cluster: addrs("10.0.0.0:80", "10.0.0.1:80"),
		local:   addrs("10.0.0.0:80"),
	}, {
		name:   "iTP Local, eTP Local, all endpoints remote",
		policy: nodePort.with(func(p *trafficPolicy) { p.internalLocal, p.externalLocal = true, true }),
		endpoints: []endpoint{
			tep("10.0.0.0:80", ready),
			tep("10.0.0.1:80", ready),
		},
		cluster: addrs("10.0.0.0:80", "10.0.0.1:80"),
	}, {
		name:   "iTP Local, eTP Local, all endpoints remote and terminating",
		policy: nodePort.with(func(p *trafficPolicy) { p.internalLocal, p.externalLocal = true, true }),
		endpoints: []endpoint{
			tep("10.0.0.0:80", servingTerm),
			tep("10.0.0.1:80", servingTerm),
		},
		cluster: addrs("10.0.0.0:80", "10.0.0.1:80"),
	}, {
		name:   "iTP Cluster, eTP Local, terminating fallback decided per list",
		policy: nodePort.with(func(p *trafficPolicy) { p.externalLocal = true }),
		endpoints: []endpoint{
			tep("10.0.0.0:80", ready),
			tep("10.0.0.1:80", isLocal, func(e *endpoint) { e.ready, e.serving = false, false }),
			tep("10.0.0.2:80", servingTerm, isLocal),
			tep("10.0.0.3:80", servingTerm),
		},
		cluster: addrs("10.0.0.0:80"),
		local:   addrs("10.0.0.2:80"),
	}, {
		name:   "externalTrafficPolicy ignored when not externally accessible",
		policy: trafficPolicy{externalLocal: true},
		endpoints: []endpoint{
			tep("10.0.0.0:80", ready),
			tep("10.0.0.1:80", ready, isLocal),
		},
		cluster: addrs("10.0.0.0:80", "10.0.0.1:80"),
	}, {
		name:   "no cluster endpoints for an internal-only iTP Local port",
		policy: trafficPolicy{internalLocal: true},
		endpoints: []endpoint{
			tep("10.0.0.0:80", ready),
			tep("10.0.0.1:80", ready, isLocal),
		},
		local: addrs("10.0.0.1:80"),
	}, {
		name: "no endpoints",
	}, {
		name:      "single endpoint neither ready, serving nor terminating",
		zone:      "zone-a",
		endpoints: []endpoint{tep("10.0.0.0:80", func(e *endpoint) { e.ready, e.serving = false, false })},
	}, {
		// Not in kube-proxy's table: ready endpoints elsewhere keep terminating local ones
		// out of the cluster list, but the local list still falls back to them.
		name:   "iTP Local: local list falls back to terminating while remote endpoints are ready",
		policy: trafficPolicy{internalLocal: true, externallyAccessible: true},
		endpoints: []endpoint{
			tep("10.0.0.0:80", ready),
			tep("10.0.0.1:80", servingTerm, isLocal),
			tep("10.0.0.2:80", func(e *endpoint) { e.ready, e.serving, e.terminating = false, false, true }, isLocal),
		},
		cluster: addrs("10.0.0.0:80"),
		local:   addrs("10.0.0.1:80"),
	}, {
		name:     "node hints: unready endpoints do not count for all-hinted",
		nodeName: "node-1",
		endpoints: []endpoint{
			tep("10.0.0.0:80", ready, nodes("node-1")),
			tep("10.0.0.1:80", ready, nodes("node-2")),
			tep("10.0.0.2:80", unready),
		},
		cluster: addrs("10.0.0.0:80"),
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cluster, local := categorizeEndpoints(tc.endpoints, tc.policy, tc.nodeName, tc.zone)
			if got := sortAddrs(appendAddrs(nil, cluster)); !slices.Equal(got, tc.cluster) {
				t.Errorf("cluster endpoints = %v, want %v", got, tc.cluster)
			}
			if got := sortAddrs(appendAddrs(nil, local)); !slices.Equal(got, tc.local) {
				t.Errorf("local endpoints = %v, want %v", got, tc.local)
			}
		})
	}
}

func (p trafficPolicy) with(f func(*trafficPolicy)) trafficPolicy {
	f(&p)
	return p
}
