package cluster

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	coreinformers "k8s.io/client-go/informers/core/v1"
	discoveryinformers "k8s.io/client-go/informers/discovery/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// The label selectors kube-proxy v1.36 lists with (cmd/kube-proxy/app/server.go): Services
// claimed by another proxy (service.kubernetes.io/service-proxy-name) and the EndpointSlices
// of headless Services (service.kubernetes.io/headless) never reach its proxiers.
const (
	labelServiceProxyName = "service.kubernetes.io/service-proxy-name"
	serviceIndex          = "service"
)

func selectorWithout(label string) string {
	req, err := labels.NewRequirement(label, selection.DoesNotExist, nil)
	if err != nil {
		panic(err) // a constant label: cannot fail
	}
	return labels.NewSelector().Add(*req).String()
}

// informers are the three watches the view is built from. None contacts the API server until
// it is run.
type informers struct {
	services       cache.SharedIndexInformer
	endpointSlices cache.SharedIndexInformer
	node           cache.SharedIndexInformer
}

func newInformers(client kubernetes.Interface, nodeName string) (*informers, error) {
	noProxyName := selectorWithout(labelServiceProxyName)
	noHeadless := selectorWithout(corev1.IsHeadlessService)
	inf := &informers{
		// kube-proxy also leaves out clusterIP None with a field selector; ShouldSkipService
		// drops those too, the selector only saves their memory.
		services: coreinformers.NewFilteredServiceInformer(client, metav1.NamespaceAll, 0, cache.Indexers{},
			func(o *metav1.ListOptions) {
				o.LabelSelector = noProxyName
				o.FieldSelector = fields.OneTermNotEqualSelector("spec.clusterIP", corev1.ClusterIPNone).String()
			}),
		endpointSlices: discoveryinformers.NewFilteredEndpointSliceInformer(client, metav1.NamespaceAll, 0,
			cache.Indexers{serviceIndex: sliceServiceIndex},
			func(o *metav1.ListOptions) { o.LabelSelector = noHeadless }),
		node: coreinformers.NewFilteredNodeInformer(client, 0, cache.Indexers{},
			func(o *metav1.ListOptions) {
				o.FieldSelector = fields.OneTermEqualSelector("metadata.name", nodeName).String()
			}),
	}
	for _, t := range []struct {
		informer  cache.SharedIndexInformer
		transform cache.TransformFunc
	}{
		{inf.services, trimService},
		{inf.endpointSlices, trimEndpointSlice},
		{inf.node, trimNode},
	} {
		if err := t.informer.SetTransform(t.transform); err != nil {
			return nil, fmt.Errorf("setting informer transform: %w", err)
		}
	}
	return inf, nil
}

func (inf *informers) hasSynced() bool {
	return inf.services.HasSynced() && inf.endpointSlices.HasSynced() && inf.node.HasSynced()
}

// sliceServiceIndex indexes EndpointSlices by the "namespace/name" key of their Service, the
// key the Service informer's store uses.
func sliceServiceIndex(obj any) ([]string, error) {
	s, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok {
		return nil, nil
	}
	name := s.Labels[discoveryv1.LabelServiceName]
	if _, headless := s.Labels[corev1.IsHeadlessService]; name == "" || headless {
		return nil, nil // kube-proxy ignores slices without the label (endpointSliceCacheKeys)
	}
	return []string{s.Namespace + "/" + name}, nil
}

// The transforms keep only what ServicePorts reads: at 10,000 Services and 100,000 endpoints
// managed fields, annotations (last-applied-configuration above all), target references and
// the like would be most of the informers' memory. They mutate in place (safe since client-go
// v1.27) and are idempotent.

func trimMeta(m *metav1.ObjectMeta, keepLabels ...string) {
	kept := map[string]string(nil)
	for _, l := range keepLabels {
		if v, ok := m.Labels[l]; ok {
			if kept == nil {
				kept = make(map[string]string, len(keepLabels))
			}
			kept[l] = v
		}
	}
	*m = metav1.ObjectMeta{
		Name:            m.Name,
		Namespace:       m.Namespace,
		UID:             m.UID,
		ResourceVersion: m.ResourceVersion,
		Labels:          kept,
	}
}

func trimService(obj any) (any, error) {
	svc, ok := obj.(*corev1.Service)
	if !ok {
		return obj, nil // cache.DeletedFinalStateUnknown and the like pass through
	}
	trimMeta(&svc.ObjectMeta, labelServiceProxyName)
	spec := svc.Spec
	ports := make([]corev1.ServicePort, len(spec.Ports))
	for i, p := range spec.Ports {
		ports[i] = corev1.ServicePort{Name: p.Name, Protocol: p.Protocol, Port: p.Port, NodePort: p.NodePort}
	}
	svc.Spec = corev1.ServiceSpec{
		Type:                  spec.Type,
		ClusterIP:             spec.ClusterIP,
		ClusterIPs:            spec.ClusterIPs,
		IPFamilies:            spec.IPFamilies,
		Ports:                 ports,
		ExternalIPs:           spec.ExternalIPs,
		ExternalTrafficPolicy: spec.ExternalTrafficPolicy,
		InternalTrafficPolicy: spec.InternalTrafficPolicy,
	}
	var ingress []corev1.LoadBalancerIngress
	for _, ing := range svc.Status.LoadBalancer.Ingress {
		if ing.IP != "" {
			ingress = append(ingress, corev1.LoadBalancerIngress{IP: ing.IP, IPMode: ing.IPMode})
		}
	}
	svc.Status = corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: ingress}}
	return svc, nil
}

func trimEndpointSlice(obj any) (any, error) {
	s, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok {
		return obj, nil
	}
	trimMeta(&s.ObjectMeta, discoveryv1.LabelServiceName, corev1.IsHeadlessService)
	for i := range s.Endpoints {
		e := &s.Endpoints[i]
		if len(e.Addresses) > 1 {
			e.Addresses = []string{e.Addresses[0]} // kube-proxy uses the first address only
		}
		*e = discoveryv1.Endpoint{
			Addresses:  e.Addresses,
			Conditions: e.Conditions,
			NodeName:   e.NodeName,
			Hints:      e.Hints,
		}
	}
	for i := range s.Ports {
		s.Ports[i].AppProtocol = nil
	}
	return s, nil
}

func trimNode(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	trimMeta(&n.ObjectMeta, corev1.LabelTopologyZone)
	n.Spec = corev1.NodeSpec{}
	n.Status = corev1.NodeStatus{}
	return n, nil
}
