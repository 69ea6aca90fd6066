package cluster

import (
	corev1 "k8s.io/api/core/v1"
	"slices"
	"testing"
)

func TestBitset(t *testing.T) {
	var b bitset
	for _, i := range []int{0, 3, 63, 64, 130} {
		b.add(i)
	}
	for i := range 140 {
		if want := slices.Contains([]int{0, 3, 63, 64, 130}, i); b.has(i) != want {
			t.Errorf("has(%d) = %v, want %v", i, b.has(i), want)
		}
	}
	if (bitset)(nil).has(0) {
		t.Error("an empty set has 0")
	}
}

// A port's published lists are the slice's own address list, or a run of it, when they can
// be; never an array anyone could append into.
func TestPublishedListsShareTheSlices(t *testing.T) {
	node := thisNode{name: "node-a"}
	svc := newServiceInfo(service("s", itpLocal, func(s *corev1.Service) { s.Spec.Ports[0].NodePort = 30080 }))
	sl := newSliceInfo(epSlice("s-1", "s", ipv4, httpPort,
		apiEP("10.0.0.4", "node-b"), apiEP("10.0.0.1", "node-b"), apiEP("10.0.0.2", "node-a"), apiEP("10.0.0.3", "node-a")), "node-a")
	ports := servicePorts(svc, []*sliceInfo{sl}, node)
	list := sl.ports[0].addrs
	cl, lo := ports[0].ClusterEndpoints, ports[0].LocalEndpoints
	if len(cl) != 4 || &cl[0] != &list[0] || cap(cl) != 4 {
		t.Errorf("cluster endpoints %v are not the slice's list %v", cl, list)
	}
	if len(lo) != 2 || &lo[0] != &list[1] || cap(lo) != 2 {
		t.Errorf("local endpoints %v (cap %d) are not the run 1-2 of the slice's list, capped", lo, cap(lo))
	}

	// Local endpoints that are not next to each other are a list of their own.
	sl = newSliceInfo(epSlice("s-1", "s", ipv4, httpPort,
		apiEP("10.0.0.1", "node-a"), apiEP("10.0.0.2", "node-b"), apiEP("10.0.0.3", "node-a")), "node-a")
	lo = servicePorts(svc, []*sliceInfo{sl}, node)[0].LocalEndpoints
	if !slices.Equal(lo, addrs("10.0.0.1:8080", "10.0.0.3:8080")) || &lo[0] == &sl.ports[0].addrs[0] {
		t.Errorf("local endpoints %v: want a copy of the two", lo)
	}
}
