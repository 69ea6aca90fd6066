package cluster

import (
	"cmp"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
	"unique"

	discoveryv1 "k8s.io/api/discovery/v1"
)

func TestComparePortNamesIsStringOrder(t *testing.T) {
	names := []ServicePortName{
		{Namespace: "a", Name: "b-c"}, {Namespace: "a-b", Name: "c"}, // '/' sorts after '-'
		{Namespace: "a", Name: "b"}, {Namespace: "a", Name: "b", Port: "x"}, {Namespace: "a", Name: "b0"},
		{Namespace: "a", Name: "b", Port: "y"}, {Namespace: "a", Name: "b.c"}, {Namespace: "a0", Name: "b"},
		{Namespace: "", Name: ""}, {Namespace: "a", Name: ""}, {Namespace: "kube-system", Name: "kube-dns", Port: "dns"},
		{Namespace: "kube-system", Name: "kube-dns", Port: "dns-tcp"}, {Namespace: "kube-system", Name: "kube-dns", Port: "metrics"},
	}
	r := rand.New(rand.NewPCG(1, 2))
	alphabet := "ab-.:/0"
	word := func() string {
		b := make([]byte, r.IntN(4))
		for i := range b {
			b[i] = alphabet[r.IntN(len(alphabet))]
		}
		return string(b)
	}
	for range 2000 {
		names = append(names, ServicePortName{Namespace: word(), Name: word(), Port: word()})
	}
	for _, a := range names {
		for _, b := range names[:40] {
			if got, want := comparePortNames(a, b), cmp.Compare(a.String(), b.String()); got != want {
				t.Fatalf("comparePortNames(%q, %q) = %d, want %d", a.String(), b.String(), got, want)
			}
		}
	}
}

func TestMergePorts(t *testing.T) {
	port := func(ns, name, port, proto string) *ServicePort {
		return &ServicePort{Name: ServicePortName{Namespace: ns, Name: name, Port: port, Protocol: proto}}
	}
	prev := sortPorts([]*ServicePort{
		port("ns", "a", "dns", "UDP"), port("ns", "a", "dns", "TCP"), port("ns", "b", "", "TCP"),
		port("ns", "c", "http", "TCP"), port("other", "a", "", "TCP"),
	})
	changed := map[objKey]struct{}{keyOf("ns", "a"): {}, keyOf("ns", "c"): {}, keyOf("ns", "new"): {}}
	fresh := []*ServicePort{port("ns", "new", "", "SCTP"), port("ns", "a", "dns", "UDP")} // c deleted, a lost TCP
	got := mergePorts(prev, changed, fresh)
	var names []string
	for _, p := range got {
		names = append(names, fmt.Sprintf("%s/%s", p.Name, p.Name.Protocol))
	}
	want := []string{"ns/a:dns/UDP", "ns/b/TCP", "ns/new/SCTP", "other/a/TCP"}
	if !slices.Equal(names, want) {
		t.Errorf("mergePorts = %v, want %v", names, want)
	}
	if len(prev) != 5 || prev[0].Name.Protocol != "TCP" {
		t.Errorf("mergePorts changed the previous list: %v", render(prev))
	}
}

// naiveMerge is what mergePorts computes, the slow way: filter, append, sort.
func naiveMerge(prev []*ServicePort, changed map[objKey]struct{}, fresh []*ServicePort) []*ServicePort {
	var out []*ServicePort
	for _, p := range prev {
		if _, ok := changed[objKey{unique.Make(p.Name.Namespace), p.Name.Name}]; !ok {
			out = append(out, p)
		}
	}
	return sortPorts(append(out, fresh...))
}

// generatedPorts is services Services of two ports each, in namespaces ns0..ns9, sorted.
func generatedPorts(services int) []*ServicePort {
	var ports []*ServicePort
	for s := range services {
		for _, proto := range []string{"TCP", "UDP"} {
			ports = append(ports, &ServicePort{Name: ServicePortName{Namespace: fmt.Sprintf("ns%d", s%10), Name: fmt.Sprintf("svc%d", s), Port: "dns", Protocol: proto}})
		}
	}
	return sortPorts(ports)
}

// mergePorts places each changed Service's ports where a whole sort would: Services changed,
// removed and added at random over a generated list.
func TestMergePortsAsSorted(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	prev := generatedPorts(300)
	for round := range 200 {
		changed := map[objKey]struct{}{}
		var fresh []*ServicePort
		for range rng.IntN(12) {
			s := rng.IntN(400) // some past the list's end: added Services
			ns, name := fmt.Sprintf("ns%d", s%10), fmt.Sprintf("svc%d", s)
			if _, dup := changed[keyOf(ns, name)]; dup {
				continue
			}
			changed[keyOf(ns, name)] = struct{}{}
			for _, proto := range []string{"TCP", "UDP", "SCTP"}[:rng.IntN(4)] { // 0 ports: removed
				fresh = append(fresh, &ServicePort{Name: ServicePortName{Namespace: ns, Name: name, Port: "dns", Protocol: proto}})
			}
		}
		want := naiveMerge(prev, changed, slices.Clone(fresh))
		got := mergePorts(prev, changed, fresh)
		if !slices.EqualFunc(got, want, func(a, b *ServicePort) bool { return a.Name == b.Name }) {
			t.Fatalf("round %d: mergePorts and a whole sort differ:\n%v\n%v", round, render(got), render(want))
		}
		prev = got
	}
}

// mergePorts finds a changed Service's ports whatever names sort between them: Services whose
// names are prefixes of others' ("s" and "s-1", "s0", "s10"), namespaces too, unnamed and
// named ports ("ns/s" < "ns/s-1" < "ns/s:dns"), several ports and protocols per Service.
func TestMergePortsPrefixNames(t *testing.T) {
	namespaces := []string{"a", "a-b", "a0", "ab"}
	names := []string{"s", "s-1", "s-1-x", "s0", "s1", "s10"}
	ports := []struct{ name, protocol string }{
		{"", "TCP"}, {"", "UDP"}, {"dns", "TCP"}, {"dns", "UDP"}, {"dns-tcp", "TCP"}, {"http", "TCP"}, {"h", "SCTP"},
	}
	rng := rand.New(rand.NewPCG(3, 4))
	servicePorts := func(ns, name string) []*ServicePort {
		var out []*ServicePort
		for _, p := range ports {
			if rng.IntN(3) == 0 {
				ep := []netip.AddrPort{netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, 0, byte(rng.IntN(256))}), 80)}
				out = append(out, &ServicePort{Name: ServicePortName{Namespace: ns, Name: name, Port: p.name, Protocol: p.protocol}, ClusterEndpoints: ep})
			}
		}
		return out
	}
	var prev []*ServicePort
	for _, ns := range namespaces {
		for _, name := range names {
			prev = append(prev, servicePorts(ns, name)...)
		}
	}
	sortPorts(prev)
	for round := range 300 {
		changed := map[objKey]struct{}{}
		var fresh []*ServicePort
		for range 1 + rng.IntN(4) {
			ns, name := namespaces[rng.IntN(len(namespaces))], names[rng.IntN(len(names))]
			if _, dup := changed[keyOf(ns, name)]; dup {
				continue
			}
			changed[keyOf(ns, name)] = struct{}{}
			fresh = append(fresh, servicePorts(ns, name)...) // none: the Service was removed
		}
		want := naiveMerge(prev, changed, slices.Clone(fresh))
		got := mergePorts(prev, changed, fresh)
		if !slices.EqualFunc(got, want, func(a, b *ServicePort) bool { return a.Name == b.Name }) {
			t.Fatalf("round %d, changed %v: mergePorts and a whole sort differ:\n%v\n%v", round, slices.Collect(maps.Keys(changed)), render(got), render(want))
		}
		// The ports kept are prev's own, shared rather than copied.
		for _, p := range got {
			if _, ok := changed[keyOf(p.Name.Namespace, p.Name.Name)]; ok {
				continue
			}
			i, found := slices.BinarySearchFunc(prev, p, comparePorts)
			if !found || prev[i] != p {
				t.Fatalf("round %d: kept port %s/%s is not the previous list's", round, p.Name, p.Name.Protocol)
			}
		}
		prev = got
	}
}

// A recompute after one Service's endpoints changed publishes a new ServicePort for it and the
// previous snapshot's own ServicePorts for the others, leaving the previous snapshot as it was.
func TestRecomputeSharesUnchangedPorts(t *testing.T) {
	svcs, sls := scaleObjects(3, 2)
	c := syncView(t, svcs, sls)
	before := c.Snapshot()
	if len(before.Ports) != 3 {
		t.Fatalf("%d ports, want 3", len(before.Ports))
	}
	old := render(before.Ports)

	_, sls = scaleObjects(3, 2) // the store converted the listed ones in place
	moved := sls[1].(*discoveryv1.EndpointSlice)
	moved.Endpoints[0].Addresses = []string{"10.200.0.1"}
	if err := (kindStore{c.st, kindSlice}).Update(moved); err != nil {
		t.Fatal(err)
	}
	c.recompute()
	after := c.Snapshot()
	if after.Generation != before.Generation+1 || len(after.Ports) != 3 {
		t.Fatalf("generation %d, %d ports; want %d, 3", after.Generation, len(after.Ports), before.Generation+1)
	}
	for i, p := range after.Ports {
		changed := p.Name.Name == moved.Labels[discoveryv1.LabelServiceName]
		if shared := p == before.Ports[i]; shared == changed {
			t.Errorf("port %s/%s: shared with the previous snapshot %v, want %v", p.Name, p.Name.Protocol, shared, !changed)
		}
		if changed && !slices.Contains(p.ClusterEndpoints, netip.MustParseAddrPort("10.200.0.1:8080")) {
			t.Errorf("port %s: cluster endpoints %v, want the moved endpoint", p.Name, p.ClusterEndpoints)
		}
	}
	if got := render(before.Ports); !slices.Equal(got, old) {
		t.Errorf("the previous snapshot changed:\n%v\nwas\n%v", got, old)
	}
}

// BenchmarkMergePorts is one recompute under churn: 1, 10 or 100 of 10,000 Services of two
// ports each changed (one of their ports removed), against a whole sort. The Services' names
// are prefixes of others' (svc1, svc10, svc100...), which sort between their ports.
func BenchmarkMergePorts(b *testing.B) {
	prev := generatedPorts(10000)
	changes := func(n int) (map[objKey]struct{}, []*ServicePort) {
		changed := map[objKey]struct{}{}
		var fresh []*ServicePort
		for s := 0; s < 10000; s += 10000 / n {
			ns, name := fmt.Sprintf("ns%d", (s+1)%10), fmt.Sprintf("svc%d", s+1)
			changed[keyOf(ns, name)] = struct{}{}
			fresh = append(fresh, &ServicePort{Name: ServicePortName{Namespace: ns, Name: name, Port: "dns", Protocol: "UDP"}})
		}
		return changed, fresh
	}
	for _, bc := range []struct {
		name    string
		changed int
		merge   func([]*ServicePort, map[objKey]struct{}, []*ServicePort) []*ServicePort
	}{{"merge-1", 1, mergePorts}, {"merge-10", 10, mergePorts}, {"merge-100", 100, mergePorts}, {"whole-sort-10", 10, naiveMerge}} {
		changed, fresh := changes(bc.changed)
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if got := bc.merge(prev, changed, slices.Clone(fresh)); len(got) != len(prev)-bc.changed {
					b.Fatalf("%d ports, want %d", len(got), len(prev)-bc.changed)
				}
			}
		})
	}
}
