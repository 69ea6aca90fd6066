package exporter

import (
	"log/slog"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promcollectors "github.com/prometheus/client_golang/prometheus/collectors"
	versioncollector "github.com/prometheus/client_golang/prometheus/collectors/version"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/proxyhealth/proxyhealth/collectors"
	"github.com/proxyhealth/proxyhealth/internal/metricdesc"
)

var (
	collectorSuccessDesc = metricdesc.New("collector", "success",
		"1 if the collector's last Update read everything it should, 0 if it failed (the log says why once).", "collector")
	collectorDurationDesc = metricdesc.New("collector", "duration_seconds",
		"How long the collector's last Update took during this scrape.", "collector")
)

// newRegistry registers what a scrape serves: the build info, the collectors' set and, when
// exporterMetrics (no --web.disable-exporter-metrics), the process and Go runtime metrics.
func newRegistry(set prometheus.Collector, exporterMetrics bool) *prometheus.Registry {
	registry := prometheus.NewRegistry()
	registry.MustRegister(versioncollector.NewCollector(metricdesc.Namespace), set)
	if exporterMetrics {
		registry.MustRegister(
			promcollectors.NewProcessCollector(promcollectors.ProcessCollectorOpts{}),
			promcollectors.NewGoCollector(),
		)
	}
	return registry
}

// metricsHandler serves registry on the telemetry path: a collector's error is logged and the
// rest of the scrape still served.
func metricsHandler(registry *prometheus.Registry, logger *slog.Logger, maxRequests int) http.Handler {
	return promhttp.HandlerFor(registry, promhttp.HandlerOpts{
		ErrorLog:            slog.NewLogLogger(logger.Handler(), slog.LevelError),
		ErrorHandling:       promhttp.ContinueOnError,
		MaxRequestsInFlight: maxRequests,
		Registry:            registry,
	})
}

// CollectorStatus is what the landing page and the log tell about one collector.
type CollectorStatus struct {
	Name     string
	OK       bool
	Err      string // empty while OK
	Since    time.Time
	Duration time.Duration
}

// collectorSet runs every enabled collector concurrently on each scrape and adds the self-health
// series. It logs a collector's failure once when it starts or its reason changes, and once when
// it recovers, so a node without a capability does not flood the log on every scrape.
type collectorSet struct {
	collectors map[string]collectors.Collector
	logger     *slog.Logger

	mu     sync.Mutex
	status map[string]*CollectorStatus
}

func newCollectorSet(cs map[string]collectors.Collector, logger *slog.Logger) *collectorSet {
	status := make(map[string]*CollectorStatus, len(cs))
	for name := range cs {
		status[name] = &CollectorStatus{Name: name, OK: true}
	}
	return &collectorSet{collectors: cs, logger: logger, status: status}
}

// Describe sends no descriptors: the set is an unchecked collector because each collector's
// series depend on what the node offers (node_exporter does the same).
func (s *collectorSet) Describe(chan<- *prometheus.Desc) {}

func (s *collectorSet) Collect(ch chan<- prometheus.Metric) {
	var wg sync.WaitGroup
	for name, c := range s.collectors {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.update(name, c, ch)
		}()
	}
	wg.Wait()
}

func (s *collectorSet) update(name string, c collectors.Collector, ch chan<- prometheus.Metric) {
	start := time.Now()
	err := c.Update(ch)
	elapsed := time.Since(start)

	success := 1.0
	if err != nil {
		success = 0
	}
	s.record(name, err, start, elapsed)
	ch <- prometheus.MustNewConstMetric(collectorDurationDesc, prometheus.GaugeValue, elapsed.Seconds(), name)
	ch <- prometheus.MustNewConstMetric(collectorSuccessDesc, prometheus.GaugeValue, success, name)
}

func (s *collectorSet) record(name string, err error, at time.Time, elapsed time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.status[name]
	st.Duration = elapsed
	switch {
	case err == nil && !st.OK:
		s.logger.Info("collector recovered", "collector", name, "failed_for", at.Sub(st.Since).Round(time.Second))
		st.OK, st.Err, st.Since = true, "", at
	case err != nil && (st.OK || st.Err != err.Error()):
		s.logger.Error("collector failed; its other series and all other collectors keep serving", "collector", name, "err", err)
		st.OK, st.Err, st.Since = false, err.Error(), at
	case err != nil:
		s.logger.Debug("collector still failing", "collector", name, "err", err)
	}
}

// Statuses returns a copy of every collector's state, sorted by name.
func (s *collectorSet) Statuses() []CollectorStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]CollectorStatus, 0, len(s.status))
	for _, st := range s.status {
		out = append(out, *st)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
