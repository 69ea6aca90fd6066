package cluster

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/proxyhealth/proxyhealth/internal/metricdesc"
)

var (
	lastHeardDesc = metricdesc.New("api", "last_heard_timestamp_seconds",
		"When the exporter's own API view last heard from the API server (a watch event or a probe on the same connection).")
	viewFreshDesc = metricdesc.New("api", "view_fresh",
		"1 while the exporter's own API view is synced and recently heard from; drift is only reported while it is.")
)

// healthCollector serves the API view's own health. It belongs to the view, not to a
// collector that reads it: the rules and conntrack collectors both use the view, and switching
// either off must not hide whether it is fresh.
type healthCollector struct{ view View }

// NewHealthCollector returns the Prometheus collector of v's freshness and last contact with
// the API server.
func NewHealthCollector(v View) prometheus.Collector { return healthCollector{v} }

func (h healthCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- lastHeardDesc
	ch <- viewFreshDesc
}

func (h healthCollector) Collect(ch chan<- prometheus.Metric) {
	snap := h.view.Snapshot()
	if !snap.LastHeard.IsZero() {
		ch <- prometheus.MustNewConstMetric(lastHeardDesc, prometheus.GaugeValue, float64(snap.LastHeard.UnixNano())/1e9)
	}
	fresh := 0.0
	if snap.Fresh {
		fresh = 1
	}
	ch <- prometheus.MustNewConstMetric(viewFreshDesc, prometheus.GaugeValue, fresh)
}
