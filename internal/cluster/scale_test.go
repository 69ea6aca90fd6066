package cluster

import (
	"net/netip"
	"runtime"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// scaleObjects are services ClusterIP Services of one port, each with one EndpointSlice of
// endpoints ready endpoints, every tenth on node-a: bench/apiview's cluster, without the
// API server.
func scaleObjects(services, endpoints int) (svcs, sls []any) {
	for s := range services {
		n := 16 + s
		vip := netip.AddrFrom4([4]byte{10, 96, byte(n >> 8), byte(n)}).String()
		svc := service("svc"+strconv.Itoa(s), func(x *corev1.Service) {
			x.Namespace = "ns" + strconv.Itoa(s%100)
			x.Spec.ClusterIP, x.Spec.ClusterIPs = vip, []string{vip}
		})
		eps := make([]discoveryv1.Endpoint, endpoints)
		for e := range eps {
			m := 1 + s*endpoints + e
			node := "node-" + strconv.Itoa(m%500)
			if m%10 == 0 {
				node = "node-a"
			}
			eps[e] = apiEP(netip.AddrFrom4([4]byte{10, byte(128 + m>>16), byte(m >> 8), byte(m)}).String(), node)
		}
		sl := epSlice(svc.Name+"-1", svc.Name, ipv4, httpPort, eps...)
		sl.Namespace = svc.Namespace
		svcs, sls = append(svcs, svc), append(sls, sl)
	}
	return svcs, sls
}

// syncView lists the objects into a new view and computes its first snapshot.
func syncView(tb testing.TB, svcs, sls []any) *Cluster {
	c := newCluster(Config{NodeName: "node-a", FreshWithin: time.Minute, ProbeInterval: time.Second}, testLogger())
	for _, l := range []struct {
		k    kind
		objs []any
	}{{kindService, svcs}, {kindSlice, sls}, {kindNode, []any{node("node-a", "zone-a")}}} {
		if err := (kindStore{c.st, l.k}).Replace(l.objs, "1"); err != nil {
			tb.Fatal(err)
		}
	}
	c.recompute()
	return c
}

// BenchmarkSync is the view's work for an initial list of 10,000 Services x 10 endpoints
// (converting, storing, the first snapshot), and what it keeps (retained-MiB).
func BenchmarkSync(b *testing.B) {
	services := 10000
	if testing.Short() {
		services = 500
	}
	var retained uint64
	for b.Loop() {
		b.StopTimer()
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		svcs, sls := scaleObjects(services, 10)
		b.StartTimer()
		c := syncView(b, svcs, sls)
		b.StopTimer()
		if got := len(c.Snapshot().Ports); got != services {
			b.Fatalf("%d ports, want %d", got, services)
		}
		svcs, sls = nil, nil
		runtime.GC()
		runtime.ReadMemStats(&after)
		retained = after.HeapAlloc - before.HeapAlloc
		runtime.KeepAlive(c)
		b.StartTimer()
	}
	b.ReportMetric(float64(retained)/(1<<20), "retained-MiB")
}
