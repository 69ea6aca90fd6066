package synthcluster

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// With localEvery 0 no endpoint names a node or a pod; with N, every Nth is on NodeName and
// each names its pod.
func TestEndpointSlicePlacement(t *testing.T) {
	sl, local := EndpointSlice(3, 10, 0)
	if local != 0 || len(sl.Endpoints) != 10 {
		t.Fatalf("localEvery 0: %d endpoints, %d local; want 10, 0", len(sl.Endpoints), local)
	}
	for _, e := range sl.Endpoints {
		if e.NodeName != nil || e.TargetRef != nil {
			t.Errorf("localEvery 0: endpoint %v names a node or a pod", e.Addresses)
		}
	}
	sl, local = EndpointSlice(3, 10, 5)
	if local != 2 {
		t.Errorf("localEvery 5 of 10 endpoints: %d local, want 2", local)
	}
	for _, e := range sl.Endpoints {
		if e.NodeName == nil || e.TargetRef == nil || e.TargetRef.Namespace != Namespace(3) {
			t.Errorf("localEvery 5: endpoint %v lacks its node or pod", e.Addresses)
		}
	}
	if sl.Name != SliceName(3) || sl.Namespace != Namespace(3) || sl.Endpoints[0].Addresses[0] != EndpointIP(3, 0, 10).String() {
		t.Errorf("slice %s/%s, first address %s", sl.Namespace, sl.Name, sl.Endpoints[0].Addresses[0])
	}
}

// Service and endpoint addresses never repeat, and stay out of the kubernetes Service's.
func TestAddressesDistinct(t *testing.T) {
	seen := map[string]bool{"10.96.0.1": true}
	for s := range 60000 {
		if v := VIP(s).String(); seen[v] {
			t.Fatalf("service %d's VIP %s repeats", s, v)
		} else {
			seen[v] = true
		}
	}
	for s := range 1000 {
		for e := range 10 {
			if a := EndpointIP(s, e, 10).String(); seen[a] {
				t.Fatalf("endpoint %d of service %d: %s repeats", e, s, a)
			} else {
				seen[a] = true
			}
		}
	}
}

// Load creates every namespace, Service and EndpointSlice, and counts them.
func TestLoad(t *testing.T) {
	client := fake.NewClientset()
	st, err := Load(context.Background(), client, 150, 4, 2, 3)
	if err != nil {
		t.Fatal(err)
	}
	if st != (Stats{Services: 150, Slices: 150, Endpoints: 600, LocalEndpoints: 300}) {
		t.Errorf("stats %+v", st)
	}
	nss, _ := client.CoreV1().Namespaces().List(context.Background(), metav1.ListOptions{})
	if len(nss.Items) != Namespaces {
		t.Errorf("%d namespaces, want %d", len(nss.Items), Namespaces)
	}
	svc, err := client.CoreV1().Services(Namespace(149)).Get(context.Background(), Name(149), metav1.GetOptions{})
	if err != nil || svc.Spec.ClusterIP != VIP(149).String() {
		t.Errorf("service 149: %v, %v", svc, err)
	}
	if err := CreateNode(context.Background(), client, true); err != nil {
		t.Fatal(err)
	}
	node, err := client.CoreV1().Nodes().Get(context.Background(), NodeName, metav1.GetOptions{})
	if err != nil || len(node.Status.Addresses) == 0 || node.Status.Addresses[0].Address != NodeIP || len(node.Status.Conditions) != 1 {
		t.Errorf("node %v, %v", node, err)
	}
}
