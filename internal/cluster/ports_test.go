package cluster

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
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
	port := func(ns, name, port, proto string) ServicePort {
		return ServicePort{Name: ServicePortName{Namespace: ns, Name: name, Port: port, Protocol: proto}}
	}
	prev := sortPorts([]ServicePort{
		port("ns", "a", "dns", "UDP"), port("ns", "a", "dns", "TCP"), port("ns", "b", "", "TCP"),
		port("ns", "c", "http", "TCP"), port("other", "a", "", "TCP"),
	})
	changed := map[objKey]struct{}{keyOf("ns", "a"): {}, keyOf("ns", "c"): {}, keyOf("ns", "new"): {}}
	fresh := []ServicePort{port("ns", "new", "", "SCTP"), port("ns", "a", "dns", "UDP")} // c deleted, a lost TCP
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
		t.Errorf("mergePorts changed the previous list: %+v", prev)
	}
}
