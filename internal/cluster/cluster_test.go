package cluster

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/proxyhealth/proxyhealth/internal/proxyversion"
)

func testLogger() *slog.Logger {
	if os.Getenv("CLUSTER_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// startFake runs a Cluster on a fake clientset holding objs and returns it once synced.
func startFake(t *testing.T, objs ...runtime.Object) (*Cluster, *fake.Clientset) {
	t.Helper()
	cfg := Config{NodeName: "node-a", FreshWithin: time.Minute, ProbeInterval: time.Second, RecomputeInterval: 10 * time.Millisecond}
	if err := cfg.setDefaults(); err != nil {
		t.Fatal(err)
	}
	client := fake.NewClientset(objs...)
	c := newCluster(cfg, testLogger())
	c.api = fakeSource(client) // no probe: the fake has no REST client
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { c.Run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	waitFor(t, "synced", func() (bool, string) {
		s := c.Snapshot()
		return s.Synced, fmt.Sprintf("%+v", s)
	})
	return c, client
}

// fakeSource reads the API through a fake clientset, which cannot stream lists.
func fakeSource(client kubernetes.Interface) *apiSource {
	return &apiSource{
		services: resourceClient{
			list: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				return client.CoreV1().Services("").List(ctx, o)
			},
			watch: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
				return client.CoreV1().Services("").Watch(ctx, o)
			},
		},
		endpointSlices: resourceClient{
			list: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				return client.DiscoveryV1().EndpointSlices("").List(ctx, o)
			},
			watch: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
				return client.DiscoveryV1().EndpointSlices("").Watch(ctx, o)
			},
		},
		nodes: resourceClient{
			list: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				return client.CoreV1().Nodes().List(ctx, o)
			},
			watch: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
				return client.CoreV1().Nodes().Watch(ctx, o)
			},
		},
		noWatchList: true,
	}
}

// waitFor polls cond until it holds, failing after 10s with cond's last description.
func waitFor(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ok, desc := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s: %s", what, desc)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// portsAre waits until the snapshot's ports, rendered by render, equal want.
func portsAre(t *testing.T, c *Cluster, want ...string) {
	t.Helper()
	waitFor(t, strings.Join(want, " "), func() (bool, string) {
		got := render(c.Snapshot().Ports)
		return slices.Equal(got, want), strings.Join(got, " ")
	})
}

// render gives each port as "ns/name:port/PROTO=cluster,...|local,...".
func render(ports []*ServicePort) []string {
	var out []string
	for _, p := range ports {
		var cl, lo []string
		for _, a := range p.ClusterEndpoints {
			cl = append(cl, a.String())
		}
		for _, a := range p.LocalEndpoints {
			lo = append(lo, a.String())
		}
		out = append(out, fmt.Sprintf("%s/%s=%s|%s", p.Name, p.Name.Protocol, strings.Join(cl, ","), strings.Join(lo, ",")))
	}
	return out
}

// dump gives every field of each port, for comparing and printing ports rather than pointers.
func dump(ports []*ServicePort) string {
	out := make([]string, len(ports))
	for i, p := range ports {
		out[i] = fmt.Sprintf("%+v", *p)
	}
	return "[" + strings.Join(out, " ") + "]"
}

func node(name, zone string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name}}}
	if zone != "" {
		n.Labels[corev1.LabelTopologyZone] = zone
	}
	return n
}

func TestClusterInformers(t *testing.T) {
	proxied := service("web")
	otherProxy := service("mesh", func(s *corev1.Service) {
		s.Labels = map[string]string{labelServiceProxyName: "other-proxy"}
		s.Spec.ClusterIP, s.Spec.ClusterIPs = "10.96.0.20", []string{"10.96.0.20"}
	})
	headless := service("db", func(s *corev1.Service) {
		s.Spec.ClusterIP, s.Spec.ClusterIPs = corev1.ClusterIPNone, []string{corev1.ClusterIPNone}
	})
	webSlice := epSlice("web-1", "web", ipv4, httpPort,
		apiEP("10.0.1.1", "node-a", zoneHint("zone-a")), apiEP("10.0.1.2", "node-b", zoneHint("zone-b")))
	headlessSlice := epSlice("web-headless", "web", ipv4, httpPort, apiEP("10.0.9.9", ""))
	headlessSlice.Labels[corev1.IsHeadlessService] = ""
	c, client := startFake(t, node("node-a", "zone-b"), node("node-b", "zone-a"),
		proxied, otherProxy, headless, webSlice, headlessSlice,
		epSlice("mesh-1", "mesh", ipv4, httpPort, apiEP("10.0.2.1", "")),
		epSlice("db-1", "db", ipv4, httpPort, apiEP("10.0.3.1", "")))
	ctx := context.Background()

	// Zone hints for zone-b, this node's zone; the headless-labelled slice is left out.
	portsAre(t, c, "ns/web:http/TCP=10.0.1.2:8080|")
	if s := c.Snapshot(); s.LastHeard.IsZero() || !s.Fresh {
		t.Errorf("after sync: LastHeard %v, Fresh %v; want heard and fresh", s.LastHeard, s.Fresh)
	}

	t.Run("node zone change re-applies hints", func(t *testing.T) {
		n, err := client.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n.Labels[corev1.LabelTopologyZone] = "zone-a"
		if _, err := client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		portsAre(t, c, "ns/web:http/TCP=10.0.1.1:8080|")
	})

	t.Run("service added with its slice", func(t *testing.T) {
		api := service("api", func(s *corev1.Service) {
			s.Spec.ClusterIP, s.Spec.ClusterIPs = "10.96.0.30", []string{"10.96.0.30"}
			itpLocal(s)
		})
		if _, err := client.CoreV1().Services("ns").Create(ctx, api, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		portsAre(t, c, "ns/api:http/TCP=|", "ns/web:http/TCP=10.0.1.1:8080|")
		s := epSlice("api-1", "api", ipv4, httpPort, apiEP("10.0.4.1", "node-a"), apiEP("10.0.4.2", "node-b"))
		if _, err := client.DiscoveryV1().EndpointSlices("ns").Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		portsAre(t, c, "ns/api:http/TCP=|10.0.4.1:8080", "ns/web:http/TCP=10.0.1.1:8080|")
	})

	t.Run("slice changed: endpoint terminating", func(t *testing.T) {
		s := epSlice("web-1", "web", ipv4, httpPort,
			apiEP("10.0.1.1", "node-a", terminating, zoneHint("zone-a")), apiEP("10.0.1.2", "node-b", zoneHint("zone-b")))
		if _, err := client.DiscoveryV1().EndpointSlices("ns").Update(ctx, s, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		// The only ready endpoint is hinted for zone-b: hints ignored for zone-a.
		portsAre(t, c, "ns/api:http/TCP=|10.0.4.1:8080", "ns/web:http/TCP=10.0.1.2:8080|")
	})

	t.Run("second slice added, then first deleted", func(t *testing.T) {
		s := epSlice("web-2", "web", ipv4, httpPort, apiEP("10.0.1.3", "node-b"))
		if _, err := client.DiscoveryV1().EndpointSlices("ns").Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		portsAre(t, c, "ns/api:http/TCP=|10.0.4.1:8080", "ns/web:http/TCP=10.0.1.2:8080,10.0.1.3:8080|")
		if err := client.DiscoveryV1().EndpointSlices("ns").Delete(ctx, "web-1", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		portsAre(t, c, "ns/api:http/TCP=|10.0.4.1:8080", "ns/web:http/TCP=10.0.1.3:8080|")
	})

	t.Run("service port renamed: endpoints follow the name", func(t *testing.T) {
		svc, err := client.CoreV1().Services("ns").Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		svc.Spec.Ports[0].Name = "web"
		if _, err := client.CoreV1().Services("ns").Update(ctx, svc, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		portsAre(t, c, "ns/api:http/TCP=|10.0.4.1:8080", "ns/web:web/TCP=|")
	})

	t.Run("service turned ExternalName, then deleted", func(t *testing.T) {
		svc, err := client.CoreV1().Services("ns").Get(ctx, "api", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		svc.Spec.Type = corev1.ServiceTypeExternalName
		if _, err := client.CoreV1().Services("ns").Update(ctx, svc, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		portsAre(t, c, "ns/web:web/TCP=|")
		if err := client.CoreV1().Services("ns").Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		portsAre(t, c)
	})

	t.Run("service of another proxy created later stays out", func(t *testing.T) {
		s := service("mesh2", func(s *corev1.Service) {
			s.Labels = map[string]string{labelServiceProxyName: "other-proxy"}
		})
		if _, err := client.CoreV1().Services("ns").Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		plain := service("plain", func(s *corev1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "10.96.0.40", []string{"10.96.0.40"} })
		if _, err := client.CoreV1().Services("ns").Create(ctx, plain, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		// Once the later Service shows, the earlier one has been processed too.
		portsAre(t, c, "ns/plain:http/TCP=|")
	})
}

// The compact forms must keep everything ServicePorts reads, however much else the API
// objects carry; converting a compact object again (the reflector hands the store objects its
// Transformer already converted) must change nothing.
func TestCompactFormsKeepWhatServicePortsReads(t *testing.T) {
	svc := service("s", dualStack, itpLocal, func(s *corev1.Service) {
		s.Annotations = map[string]string{"kubectl.kubernetes.io/last-applied-configuration": strings.Repeat("x", 1000)}
		s.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}
		s.Labels = map[string]string{"app": "s"}
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Spec.Selector = map[string]string{"app": "s"}
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		s.Spec.ExternalIPs = []string{"192.0.2.9"}
		s.Spec.Ports[0].NodePort = 30080
		s.Spec.Ports[0].TargetPort.StrVal = "http"
		s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "192.0.2.1", IPMode: ptr.To(corev1.LoadBalancerIPModeProxy)}, {Hostname: "lb.example"}}
	})
	sl := epSlice("s-1", "s", ipv4, httpPort,
		apiEP("10.0.1.1", "node-a", zoneHint("zone-a"), nodeHint("node-a"), func(e *discoveryv1.Endpoint) {
			e.TargetRef = &corev1.ObjectReference{Kind: "Pod", Name: "s-abc"}
			e.Hostname = ptr.To("s-abc")
			e.Addresses = append(e.Addresses, "10.0.1.99")
		}),
		apiEP("10.0.1.4", "node-b", zoneHint("zone-b"), nodeHint("node-b")),
		apiEP("10.0.1.2", "node-b", terminating, zoneHint("zone-b"), nodeHint("node-b")),
		apiEP("10.0.1.3", "node-b", zoneHint("zone-b"), nodeHint("node-b")),
		apiEP("not-an-address", "node-b"))
	sl.Annotations = map[string]string{"endpoints.kubernetes.io/last-change-trigger-time": "x"}
	sl.Labels["endpointslice.kubernetes.io/managed-by"] = "endpointslice-controller.k8s.io"

	want := ServicePorts(svc.DeepCopy(), []*discoveryv1.EndpointSlice{sl.DeepCopy()}, "node-a", "zone-a")
	if len(want) != 1 || len(want[0].ClusterEndpoints) == 0 || len(want[0].LocalEndpoints) == 0 {
		t.Fatalf("ServicePorts = %s, want one port with cluster and local endpoints", dump(want))
	}
	st := newState("node-a")
	transform := func(k kind, obj any) any {
		t.Helper()
		c, err := kindStore{st, k}.Transformer()(obj)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	csvc := transform(kindService, transform(kindService, svc.DeepCopy())).(*serviceInfo)
	csl := transform(kindSlice, transform(kindSlice, sl.DeepCopy())).(*sliceInfo)
	got := servicePorts(csvc, []*sliceInfo{csl}, thisNode{name: "node-a", zone: "zone-a"})
	if dump(want) != dump(got) {
		t.Errorf("the compact forms changed the result:\nfrom the API objects %s\nfrom compact forms   %s", dump(want), dump(got))
	}
	if len(csl.attrs) != 4 || len(csl.ports) != 1 || !slices.Equal(csl.ports[0].addrs, addrs("10.0.1.1:8080", "10.0.1.2:8080", "10.0.1.3:8080", "10.0.1.4:8080")) {
		t.Errorf("compact slice %+v, want the four endpoints that parse, the first address of each, sorted", csl)
	}
	if a := csl.attrs; a[2] != a[3] || a[1] == a[2] || a[2].terminating || !a[1].terminating || !a[0].local || a[1].local {
		t.Errorf("endpoint attributes %+v %+v %+v %+v: want the first local, the last two alike shared, the terminating one apart", *a[0], *a[1], *a[2], *a[3])
	}
	// A slice of ready endpoints without hints keeps only which are on this node.
	plain := transform(kindSlice, epSlice("p-1", "p", ipv4, httpPort, apiEP("10.0.2.2", "node-b"), apiEP("10.0.2.1", "node-a"))).(*sliceInfo)
	if plain.attrs != nil || plain.endpoint(0) != readyLocalAttrs || plain.endpoint(1) != readyAttrs {
		t.Errorf("plain slice: attrs %v, endpoints %+v %+v; want no attrs, the first (10.0.2.1) local", plain.attrs, *plain.endpoint(0), *plain.endpoint(1))
	}
	n := transform(kindNode, transform(kindNode, node("node-a", "zone-a"))).(*nodeInfo)
	if *n != (nodeInfo{name: "node-a", zone: "zone-a"}) {
		t.Errorf("compact node %+v", *n)
	}
}

// kube-proxy's version, told after the view synced, computes every Service again the way that
// version programs it: before v1.36 a copy of an endpoint on this node wins over a ready copy
// on another, from v1.36 the ready copy stays.
func TestClusterKubeProxyVersion(t *testing.T) {
	c, _ := startFake(t, node("node-a", ""), service("web", itpLocal),
		epSlice("web-1", "web", ipv4, httpPort, apiEP("10.0.1.1", "node-b"), apiEP("10.0.1.2", "node-b")),
		epSlice("web-2", "web", ipv4, httpPort, apiEP("10.0.1.1", "node-a", terminating)))
	portsAre(t, c, "ns/web:http/TCP=|")
	gen := c.Snapshot().Generation
	c.SetKubeProxyVersion(proxyversion.Version{Major: 1, Minor: 34})
	if v := c.KubeProxyVersion(); v != (proxyversion.Version{Major: 1, Minor: 34}) {
		t.Errorf("KubeProxyVersion() = %v after v1.34 was told", v)
	}
	portsAre(t, c, "ns/web:http/TCP=|10.0.1.1:8080")
	if g := c.Snapshot().Generation; g == gen {
		t.Errorf("generation %d unchanged by the version's change", g)
	}
	// v1.35 programs as v1.34 does: nothing to compute again.
	gen = c.Snapshot().Generation
	c.SetKubeProxyVersion(proxyversion.Version{Major: 1, Minor: 35})
	time.Sleep(50 * time.Millisecond) // 5 recompute intervals
	if g := c.Snapshot().Generation; g != gen {
		t.Errorf("generation %d -> %d: v1.34 to v1.35 computed again", gen, g)
	}
	c.SetKubeProxyVersion(proxyversion.Version{Major: 1, Minor: 37})
	portsAre(t, c, "ns/web:http/TCP=|")
	c.SetKubeProxyVersion(proxyversion.Version{})
	portsAre(t, c, "ns/web:http/TCP=|")
}
