// Package metricdesc names and describes proxyhealth's metrics: the one namespace every metric
// name starts with, and the constructor of every descriptor. A leaf, so that the collectors and
// the shared readers below them (internal/cluster, internal/hostrules, ...) build their
// descriptors the same way without importing each other.
package metricdesc

import "github.com/prometheus/client_golang/prometheus"

// Namespace is the first part of every proxyhealth metric name.
const Namespace = "proxyhealth"

// New describes the metric proxyhealth_<subsystem>_<name> (proxyhealth_<name> when subsystem
// is empty) with the given variable labels and no constant ones. A metric kept in a
// client_golang vector, whose descriptor the vector builds, gives Namespace and its subsystem in
// its opts instead.
func New(subsystem, name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(prometheus.BuildFQName(Namespace, subsystem, name), help, labels, nil)
}
