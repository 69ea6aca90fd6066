package rules

import (
	"encoding/json"
	"net/netip"
	"os"
	"slices"
	"sort"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/proxyhealth/proxyhealth/internal/cluster"
	"github.com/proxyhealth/proxyhealth/internal/proxyversion"
)

// realCapture is a real kube-proxy v1.36.3 nat table and the API objects it was programmed from.
func realCapture(t *testing.T) (*iptablesRules, *cluster.Snapshot) {
	t.Helper()
	return loadRules(t, "kube-proxy-v1.36.3/iptables-save-nat.txt"), apiSnapshot(t, "testdata/kube-proxy-v1.36.3/api-objects.json")
}

// apiSnapshot is a fresh view of the API objects a capture was programmed from, each service
// port's expected endpoints computed by cluster.ServicePorts.
func apiSnapshot(t *testing.T, path string) *cluster.Snapshot {
	t.Helper()
	return apiSnapshotFor(t, path, proxyversion.Version{})
}

// apiSnapshotFor is apiSnapshot as kube-proxy of version proxy computes the expected
// endpoints (cluster.ServicePortsFor; the zero Version: the newest tested).
func apiSnapshotFor(t *testing.T, path string, proxy proxyversion.Version) *cluster.Snapshot {
	t.Helper()
	var objs struct {
		Node           corev1.Node                 `json:"node"`
		Services       []corev1.Service            `json:"services"`
		EndpointSlices []discoveryv1.EndpointSlice `json:"endpointSlices"`
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &objs); err != nil {
		t.Fatal(err)
	}
	snap := &cluster.Snapshot{Synced: true, Fresh: true, LastHeard: heardAtEveryCheck}
	zone := objs.Node.Labels["topology.kubernetes.io/zone"]
	for i := range objs.Services {
		svc := &objs.Services[i]
		var slices []*discoveryv1.EndpointSlice
		for j := range objs.EndpointSlices {
			s := &objs.EndpointSlices[j]
			if s.Namespace == svc.Namespace && s.Labels[discoveryv1.LabelServiceName] == svc.Name {
				slices = append(slices, s)
			}
		}
		snap.Ports = append(snap.Ports, cluster.ServicePortsFor(proxy, svc, slices, objs.Node.Name, zone)...)
	}
	sort.Slice(snap.Ports, func(i, j int) bool {
		return snap.Ports[i].Name.String()+snap.Ports[i].Name.Protocol < snap.Ports[j].Name.String()+snap.Ports[j].Name.Protocol
	})
	return snap
}

// A converged node: the API view, computed the way kube-proxy computes it, matches what the
// real kube-proxy programmed for every service port: cluster chains, local chains
// (internalTrafficPolicy and externalTrafficPolicy Local), zone hints, two protocols on one
// port, a Service without endpoints.
func TestRealKubeProxyOutputHasNoDrift(t *testing.T) {
	rules, snap := realCapture(t)
	if len(snap.Ports) < 8 {
		t.Fatalf("only %d service ports in the capture", len(snap.Ports))
	}
	res := newDriftEngine(0).check(snap, map[bool]programmedRules{false: byChains{rules}}, time.Unix(1, 0))
	if len(res.drifting) != 0 || res.orphans != 0 || res.checked != len(snap.Ports) {
		t.Errorf("checked %d of %d, drifting %+v, orphans %d: want no drift", res.checked, len(snap.Ports), res.drifting, res.orphans)
	}
	// And it really compared something: the zonal service's chain holds only the zone-a
	// endpoints, the local-only one has a local chain and no cluster chain.
	for _, sp := range snap.Ports {
		clusterChain, localChain := rules.chainsFor(sp.Name)
		switch sp.Name.Name {
		case "zonal":
			if got := rules.endpoints(clusterChain); len(got) != 2 {
				t.Errorf("zonal: %v programmed, want the 2 zone-a endpoints", got)
			}
		case "local-only":
			if rules.endpoints(clusterChain) != nil || len(rules.endpoints(localChain)) != 2 {
				t.Errorf("local-only: cluster %v local %v, want no cluster chain and 2 local endpoints",
					rules.endpoints(clusterChain), rules.endpoints(localChain))
			}
		}
	}
}

// Incident 3 on real output: the API moves on (an endpoint deleted, two added), the rules do not.
func TestRealKubeProxyOutputStale(t *testing.T) {
	rules, snap := realCapture(t)
	var backend *cluster.ServicePort
	for _, sp := range snap.Ports {
		if sp.Name.Name == "backend" {
			backend = sp
		}
	}
	if backend == nil || len(backend.ClusterEndpoints) != 11 {
		t.Fatalf("backend service port: %+v", backend)
	}
	gone := backend.ClusterEndpoints[0]
	backend.ClusterEndpoints = append(slices.Clone(backend.ClusterEndpoints[1:]),
		netip.MustParseAddrPort("10.244.3.200:8080"), netip.MustParseAddrPort("10.244.3.201:8080"))
	e := newDriftEngine(time.Minute)
	e.check(snap, map[bool]programmedRules{false: byChains{rules}}, time.Unix(0, 0))
	res := e.check(snap, map[bool]programmedRules{false: byChains{rules}}, time.Unix(61, 0))
	if len(res.drifting) != 1 || res.drifting[0].stale != 1 || res.drifting[0].missing != 2 || res.drifting[0].name.Name != "backend" {
		t.Errorf("drifting %+v, want backend with 1 stale (%s) and 2 missing", res.drifting, gone)
	}
}
