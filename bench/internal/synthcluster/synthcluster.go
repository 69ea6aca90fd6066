// Package synthcluster is the synthetic cluster the benchmarks load into a real kube-apiserver,
// and write as kube-proxy's rules: one Node, and ClusterIP Services of one TCP port each, all
// named "http", port 80, each with one EndpointSlice of ready endpoints on port 8080. Service s
// is always the same object, whichever benchmark makes it, so that their figures compare.
package synthcluster

import (
	"context"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/proxyhealth/proxyhealth/bench/internal/benchrun"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
)

// The cluster's shape.
const (
	Namespaces  = 100 // Services are spread over ns0 ... ns99
	PortName    = "http"
	Port        = 80
	PodPort     = 8080
	ClusterCIDR = "10.244.0.0/16"
	ServiceCIDR = "10.96.0.0/16"
	ManagedBy   = "ph-bench" // the EndpointSlices' endpointslice.kubernetes.io/managed-by

	NodeName = "bench-node" // the node the benchmarks measure on
	NodeIP   = "172.18.0.2" // its InternalIP
	NodeZone = "zone-a"
)

// Namespace is service s's namespace.
func Namespace(s int) string { return "ns" + strconv.Itoa(s%Namespaces) }

// Name is service s's name.
func Name(s int) string { return "svc" + strconv.Itoa(s) }

// SliceName is the name of service s's EndpointSlice.
func SliceName(s int) string { return Name(s) + "-bench" }

// VIP is service s's ClusterIP: 10.96.0.16 on, clear of the kubernetes Service's 10.96.0.1.
func VIP(s int) netip.Addr {
	n := 16 + s
	return netip.AddrFrom4([4]byte{10, 96, byte(n >> 8), byte(n)})
}

// EndpointIP is endpoint e of service s, of endpoints each: 10.128.0.0/9, one address per
// endpoint.
func EndpointIP(s, e, endpoints int) netip.Addr {
	n := 1 + s*endpoints + e
	return netip.AddrFrom4([4]byte{10, byte(128 + n>>16), byte(n >> 8), byte(n)})
}

// Service is service s, with its ClusterIP set.
func Service(s int) *corev1.Service {
	vip := VIP(s).String()
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: Namespace(s), Name: Name(s)},
		Spec: corev1.ServiceSpec{
			Type:       corev1.ServiceTypeClusterIP,
			ClusterIP:  vip,
			ClusterIPs: []string{vip},
			Ports: []corev1.ServicePort{{
				Name: PortName, Protocol: corev1.ProtocolTCP, Port: Port, TargetPort: intstr.FromInt32(PodPort),
			}},
		},
	}
}

// EndpointSlice is service s's slice of endpoints ready endpoints, in zone NodeZone, and how
// many of them are on NodeName. With localEvery 0 the endpoints name neither a node nor a pod
// (what kube-proxy's rules and the drift check need); with localEvery N they are as the
// EndpointSlice controller writes them, each with a node and a target reference, every Nth on
// NodeName and the others over 500 other nodes.
func EndpointSlice(s, endpoints, localEvery int) (*discoveryv1.EndpointSlice, int) {
	ready, terminating := true, false
	sl := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: Namespace(s), Name: SliceName(s), Labels: map[string]string{
			discoveryv1.LabelServiceName: Name(s),
			discoveryv1.LabelManagedBy:   ManagedBy,
		}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{{
			Name: ptrTo(PortName), Protocol: ptrTo(corev1.ProtocolTCP), Port: ptrTo(int32(PodPort)),
		}},
	}
	local := 0
	for e := range endpoints {
		ep := discoveryv1.Endpoint{
			Addresses:  []string{EndpointIP(s, e, endpoints).String()},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready, Serving: &ready, Terminating: &terminating},
			Zone:       ptrTo(NodeZone),
		}
		if localEvery > 0 {
			node := "node-" + strconv.Itoa((s*endpoints+e)%500)
			if (s*endpoints+e)%localEvery == 0 {
				node, local = NodeName, local+1
			}
			ep.NodeName = ptrTo(node)
			ep.TargetRef = &corev1.ObjectReference{Kind: "Pod", Namespace: Namespace(s), Name: Name(s) + "-" + strconv.Itoa(e)}
		}
		sl.Endpoints = append(sl.Endpoints, ep)
	}
	return sl, local
}

func ptrTo[T any](v T) *T { return &v }

// CreateNode creates NodeName, in zone NodeZone, with NodeIP as its InternalIP in its status
// (kube-proxy waits for one); ready adds a Ready condition.
func CreateNode(ctx context.Context, client kubernetes.Interface, ready bool) error {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: NodeName, Labels: map[string]string{
		"kubernetes.io/hostname":      NodeName,
		"kubernetes.io/os":            "linux",
		"topology.kubernetes.io/zone": NodeZone,
	}}}
	created, err := client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("creating node: %w", err)
	}
	created.Status.Addresses = []corev1.NodeAddress{
		{Type: corev1.NodeInternalIP, Address: NodeIP},
		{Type: corev1.NodeHostName, Address: NodeName},
	}
	if ready {
		created.Status.Conditions = []corev1.NodeCondition{{
			Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "Bench",
			LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now(),
		}}
	}
	if _, err := client.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("setting node status: %w", err)
	}
	return nil
}

// Stats counts what Load created.
type Stats struct {
	Services, Slices, Endpoints int
	LocalEndpoints              int   // endpoints on NodeName
	Retries                     int64 // failed calls tried again
}

// Load creates the namespaces, then services Services, each with its EndpointSlice
// (EndpointSlice(s, endpoints, localEvery)), with workers parallel clients; a failed call is
// tried again a few times, and an object that already exists counts as created.
func Load(ctx context.Context, client kubernetes.Interface, services, endpoints, localEvery, workers int) (st Stats, err error) {
	for i := range min(Namespaces, services) {
		_, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace(i)}}, metav1.CreateOptions{})
		if err != nil {
			return st, fmt.Errorf("creating namespace: %w", err)
		}
	}
	var retries int64
	retry := func(what string, f func() error) error {
		var err error
		for attempt := range 5 {
			if err = f(); err == nil || strings.Contains(err.Error(), "already exists") {
				return nil
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			atomic.AddInt64(&retries, 1)
			time.Sleep(time.Duration(attempt+1) * 200 * time.Millisecond)
		}
		return fmt.Errorf("%s: %w", what, err)
	}
	next := int64(-1)
	var (
		firstErr                error
		mu                      sync.Mutex
		wg                      sync.WaitGroup
		svcs, slices, eps, locs int64
	)
	for range workers {
		wg.Go(func() {
			for {
				s := int(atomic.AddInt64(&next, 1))
				if s >= services || ctx.Err() != nil {
					return
				}
				ns, name := Namespace(s), Name(s)
				svc := Service(s)
				slice, local := EndpointSlice(s, endpoints, localEvery)
				err := retry("creating service "+ns+"/"+name, func() error {
					_, err := client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{})
					return err
				})
				if err == nil {
					atomic.AddInt64(&svcs, 1)
					err = retry("creating EndpointSlice "+ns+"/"+slice.Name, func() error {
						_, err := client.DiscoveryV1().EndpointSlices(ns).Create(ctx, slice, metav1.CreateOptions{})
						return err
					})
				}
				if err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					return
				}
				atomic.AddInt64(&slices, 1)
				atomic.AddInt64(&eps, int64(len(slice.Endpoints)))
				atomic.AddInt64(&locs, int64(local))
				if n := s + 1; n%2000 == 0 {
					benchrun.Logf("  ~%d services created", n)
				}
			}
		})
	}
	wg.Wait()
	st = Stats{Services: int(svcs), Slices: int(slices), Endpoints: int(eps), LocalEndpoints: int(locs), Retries: atomic.LoadInt64(&retries)}
	if firstErr != nil {
		return st, firstErr
	}
	return st, ctx.Err()
}
