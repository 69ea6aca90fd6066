// Package cluster is proxyhealth's view of the Kubernetes API: reflectors on Services,
// EndpointSlices and this node's Node object, kept in compact form and reduced to what
// kube-proxy on this node should have programmed, per service port.
//
// The path of an object: client.go (REST clients for the two API groups, one connection)
// and listwatch.go (kube-proxy's selectors; streamed or paged lists) feed reflectors.go's
// reflectors, which write store.go's state through convert.go's conversions to compact.go's
// types; cluster.go recomputes the Services that changed (expected.go, topology.go: kube-proxy's
// own logic), rebuilds the snapshot (ports.go) and tells its consumers (notify.go).
package cluster

import (
	"net/netip"
	"time"
)

// ServicePortName identifies a service port the way kube-proxy does (its proxy.ServicePortName
// plus the protocol): kube-proxy's chain names are hashes of String() and Protocol.
type ServicePortName struct {
	Namespace string
	Name      string
	Port      string // the port's name; "" for a Service's single unnamed port
	Protocol  string // as in the API: "TCP", "UDP" or "SCTP"
}

// String is kube-proxy's ServicePortName.String(): "namespace/name:port", or
// "namespace/name" when the port has no name.
func (n ServicePortName) String() string {
	if n.Port == "" {
		return n.Namespace + "/" + n.Name
	}
	return n.Namespace + "/" + n.Name + ":" + n.Port
}

// ServicePort is one service port as kube-proxy on this node should program it.
type ServicePort struct {
	Name       ServicePortName
	ClusterIPs []netip.Addr // one per IP family the Service has
	// ExternalIPs are the Service's external IPs and VIP-mode load-balancer ingress IPs, of
	// the families it has a cluster IP of: the addresses kube-proxy also sends to this port
	// (at Port, as a cluster IP). Shared by the Service's ports, never modified; nil when
	// there are none.
	ExternalIPs []netip.Addr
	Port        uint16 // the Service's port number
	NodePort    uint16 // the port's node port; 0 when it has none
	// InternalLocal is internalTrafficPolicy: Local (kube-proxy's KUBE-SVL chain, or the
	// local- chain in nftables mode, takes ClusterIP traffic).
	InternalLocal bool
	// ExternalLocal is externalTrafficPolicy: Local on a NodePort or LoadBalancer Service (or
	// one with external IPs): kube-proxy then also fills the local chain, for external
	// traffic, so LocalEndpoints can be set while InternalLocal is false.
	ExternalLocal bool
	// ClusterEndpoints and LocalEndpoints are the endpoints kube-proxy on this node programs
	// into the service port's cluster chain (KUBE-SVC-*) and local chain (KUBE-SVL-*), computed
	// the way kube-proxy computes them (ready, else serving-terminating; topology hints for
	// this node; local ones for the local chain). Both IP families are listed together; compare
	// each family's chain with its own family's endpoints. Sorted, without duplicates. Empty
	// (nil) when kube-proxy writes no such chain: the port has no usable endpoints of that kind,
	// or does not use that kind at all (no cluster chain for an internalTrafficPolicy: Local
	// port that is not externally reachable; no local chain unless a traffic policy is Local).
	ClusterEndpoints []netip.AddrPort
	LocalEndpoints   []netip.AddrPort
}

// Snapshot is the view at one moment.
type Snapshot struct {
	// Ports is sorted by Name.String() then Protocol. Neither the slice nor the ServicePorts
	// it points to are modified once published: a new snapshot shares the ServicePorts of
	// the Services that did not change with the previous one (copying only the pointers), so
	// a consumer may keep a *ServicePort across snapshots, and the same pointer in a later
	// snapshot is the same, unchanged, port.
	Ports []*ServicePort
	// Synced is true once every resource (Services, EndpointSlices, this node) has been listed.
	Synced bool
	// LastHeard is when the exporter last had proof its connection to the API server works
	// (a watch event, a bookmark, or a successful probe on the same client).
	LastHeard time.Time
	// Fresh is true while LastHeard is recent enough, and no watch has failed for as long,
	// that the view can be trusted to reflect the API: drift is only reported while it is.
	Fresh bool
	// Generation changes whenever Ports or Synced do, so a reader can tell a new view from the
	// same one returned again.
	Generation uint64
}

// View is what the rules collector and the conntrack collector read.
type View interface {
	// Snapshot returns the current view; callers must not modify it, nor the ServicePorts
	// it points to.
	Snapshot() *Snapshot
}

// Notifier is implemented by views that announce their changes (Cluster does): a consumer
// that finds it on its View can recompute when told instead of on a timer. It is separate
// from View so that a View without notifications (a fixed one in a test) stays a View.
type Notifier interface {
	// Subscribe returns a new channel that receives a value after the view changed; see
	// Cluster.Subscribe for when, and how notifications merge.
	Subscribe() <-chan struct{}
}

// ErrorReporter is implemented by views that can say why they are not fresh (Cluster does).
type ErrorReporter interface {
	// LastError returns the view's last failure to reach or list the API; nil when none.
	LastError() error
}

// Confirmer is implemented by views that can prove on demand that they are current.
type Confirmer interface {
	// Confirm asks the view to prove its connection to the API server works now (a probe on
	// the same connection), without waiting for the result; a success moves LastHeard and is
	// told through Changed.
	Confirm()
}
