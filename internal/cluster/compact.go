package cluster

import (
	"net/netip"
	"unique"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// The compact forms the view keeps of Services, EndpointSlices and this node: only what
// servicePorts and categorizeEndpoints read, with addresses parsed once, the strings that
// repeat across objects (namespaces, port names) interned as unique handles (8 bytes each,
// one copy per distinct value), an endpoint's node reduced to whether it is this one, and
// the attributes of the usual endpoint (ready, no hints) to a bit. At 10,000 Services and
// 100,000 endpoints the API objects, even trimmed, are several times larger than this.
//
// A compact object is immutable once built: an update from the API replaces it whole. That is
// what lets the recompute read objects outside the store's lock, and DeepCopyObject return the
// object itself.

// objKey identifies a namespaced object, as "namespace/name" does in client-go's stores.
type objKey struct {
	namespace unique.Handle[string]
	name      string
}

func keyOf(namespace, name string) objKey {
	return objKey{unique.Make(namespace), name}
}

func (k objKey) String() string { return k.namespace.Value() + "/" + k.name }

// serviceInfo is a Service reduced to what servicePorts reads.
type serviceInfo struct {
	key objKey
	// skip is kube-proxy's ShouldSkipService: headless (clusterIP None or empty) or
	// ExternalName. otherProxy is the service-proxy-name label, which kube-proxy's list
	// selector filters out. The store keeps neither kind.
	skip, otherProxy bool
	internalLocal    bool // internalTrafficPolicy: Local
	externalLocal    bool // externalTrafficPolicy: Local on an externally accessible type
	// addrs are the Service's cluster IPs, one per IP family it has, primary first, then its
	// external IPs and VIP-mode load-balancer ingress IPs of those families (the ones
	// kube-proxy programs), without duplicates: one array, whose first clusterIPCount are
	// cluster IPs (the count sits with the bools, in their padding). Each of its
	// ServicePorts publishes the two parts as ClusterIPs and ExternalIPs.
	clusterIPCount uint8
	addrs          []netip.Addr
	ports          []servicePortInfo
}

// clusterIPs returns the Service's cluster IPs, clipped so that no append writes into the
// external IPs after them.
func (s *serviceInfo) clusterIPs() []netip.Addr {
	return s.addrs[:s.clusterIPCount:s.clusterIPCount]
}

// externalIPs returns the Service's external and load-balancer IPs; nil when it has none.
func (s *serviceInfo) externalIPs() []netip.Addr {
	if len(s.addrs) == int(s.clusterIPCount) {
		return nil
	}
	return s.addrs[s.clusterIPCount:]
}

type servicePortInfo struct {
	name     unique.Handle[string]
	protocol corev1.Protocol // defaulted to TCP
	port     uint16
	nodePort uint16 // 0 when the port has none
}

// sliceInfo is an EndpointSlice reduced to what endpointsByPort reads.
type sliceInfo struct {
	key      objKey
	service  string // the kubernetes.io/service-name label; "" when missing
	headless bool   // the service.kubernetes.io/headless label, which kube-proxy's list selector filters out
	// family is the IP family of the slice's address type (familyBit); none for FQDN,
	// which kube-proxy ignores.
	family familySet
	// ports holds only usable ports: kube-proxy ignores a port without a name (nil, not "")
	// or without a valid number.
	ports []slicePortInfo
	// The slice's endpoints are those whose first address parses (kube-proxy uses only that
	// one, and cannot program the others), sorted by that address; endpoints listed twice
	// keep their order. Each port's addrs are their addresses with its number, and endpoint
	// i's attributes are attrs[i]; attrs is nil when every endpoint is ready, serving, not
	// terminating and without hints (the usual slice), and local then says which are on
	// this node (nil when none is).
	attrs []*endpointAttrs
	local bitset
}

// serviceKey is the key of the Service the slice belongs to (endpointSliceCacheKeys).
func (s *sliceInfo) serviceKey() objKey { return objKey{s.key.namespace, s.service} }

// endpoint returns endpoint i's attributes.
func (s *sliceInfo) endpoint(i int) *endpointAttrs {
	switch {
	case s.attrs != nil:
		return s.attrs[i]
	case s.local.has(i):
		return readyLocalAttrs
	}
	return readyAttrs
}

// bitset is a set of small integers.
type bitset []uint64

func (b *bitset) add(i int) {
	for len(*b) <= i/64 {
		*b = append(*b, 0)
	}
	(*b)[i/64] |= 1 << (i % 64)
}

func (b bitset) has(i int) bool { return i/64 < len(b) && b[i/64]&(1<<(i%64)) != 0 }

type slicePortInfo struct {
	name     unique.Handle[string]
	protocol corev1.Protocol // defaulted to TCP
	// addrs is sorted (by address; the port is the same), so that a service port whose
	// expected endpoints are exactly this slice's can publish this very array.
	addrs []netip.AddrPort
}

// endpointAttrs are what kube-proxy reads of an endpoint besides its address: whether it is
// on this node (EndpointSliceCache.isLocal: its nodeName is this node's; the view's node
// never changes, so this is decided once, when the slice is converted), its conditions,
// defaulted as the API documents them (nil ready or serving means true, nil terminating
// false), and its topology hints. Endpoints with the same attributes share a copy: the
// package's own for the usual ready endpoints without hints, else one per slice (the
// EndpointSlice controller hints each endpoint with its own zone, so a slice holds a few
// distinct sets however many endpoints it has).
type endpointAttrs struct {
	local, ready, serving, terminating bool
	zones, nodes                       []string // nil when there is no hint of that kind
}

var (
	readyAttrs      = &endpointAttrs{ready: true, serving: true}
	readyLocalAttrs = &endpointAttrs{local: true, ready: true, serving: true}
)

// nodeInfo is this node: only its zone label matters (topology hints).
type nodeInfo struct {
	name, zone string
}

// The compact types are runtime.Objects so that a paginated list can hand them to the
// reflector directly (listwatch.go), never holding a whole list of API objects.

func (s *serviceInfo) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }
func (s *serviceInfo) DeepCopyObject() runtime.Object   { return s }
func (s *sliceInfo) GetObjectKind() schema.ObjectKind   { return schema.EmptyObjectKind }
func (s *sliceInfo) DeepCopyObject() runtime.Object     { return s }
func (n *nodeInfo) GetObjectKind() schema.ObjectKind    { return schema.EmptyObjectKind }
func (n *nodeInfo) DeepCopyObject() runtime.Object      { return n }
