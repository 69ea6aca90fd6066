package hostrules

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/proxyhealth/proxyhealth/internal/metricdesc"
)

// stats counts the Source's own work, for its metrics.
type stats struct {
	hinted  atomic.Bool
	resyncs atomic.Uint64

	mu       sync.Mutex
	reads    map[string]uint64
	errors   map[string]uint64
	duration map[string]time.Duration // of the last read
}

func (s *stats) observe(backend string, took time.Duration, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reads == nil {
		s.reads, s.errors, s.duration = map[string]uint64{}, map[string]uint64{}, map[string]time.Duration{}
	}
	s.reads[backend]++
	if err != nil {
		s.errors[backend]++
	}
	s.duration[backend] = took
}

var (
	readsDesc = metricdesc.New("netfilter", "reads_total",
		"Reads of the node's netfilter tables, by source: iptables-legacy (the legacy tables through their socket options), nftables (every nf_tables table over netlink, iptables-nft's included) or ipvs (kube-proxy's IPVS virtual servers over generic netlink, in its IPVS mode only). nf_tables when a change is committed (only the chains and sets it touched), the legacy tables and IPVS when the legacy tables' size moved or a kube-proxy sync applied Service or EndpointSlice changes, and at --netfilter.resync-interval.", "source")
	readErrorsDesc = metricdesc.New("netfilter", "read_errors_total",
		"Reads of the node's netfilter tables that failed in part or whole, by source.", "source")
	readDurationDesc = metricdesc.New("netfilter", "read_duration_seconds",
		"How long the last read of the node's netfilter tables took, by source.", "source")
	resyncsDesc = metricdesc.New("netfilter", "watch_resyncs_total",
		"nf_tables changes that may have been missed (the change notification socket overran, or a ruleset generation was skipped), each answered by a whole read.")
	lastReadDesc = metricdesc.New("netfilter", "last_read_timestamp_seconds",
		"When the node's netfilter state was last read (the newest of its sources).")
)

// Describe implements prometheus.Collector.
func (s *Source) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{readsDesc, readErrorsDesc, readDurationDesc, resyncsDesc, lastReadDesc} {
		ch <- d
	}
}

// Collect implements prometheus.Collector: the Source's own work, read without waiting on it.
func (s *Source) Collect(ch chan<- prometheus.Metric) {
	s.stats.mu.Lock()
	for _, src := range []string{BackendLegacy, BackendNFTables, BackendIPVS} {
		ch <- prometheus.MustNewConstMetric(readsDesc, prometheus.CounterValue, float64(s.stats.reads[src]), src)
		ch <- prometheus.MustNewConstMetric(readErrorsDesc, prometheus.CounterValue, float64(s.stats.errors[src]), src)
		if d, ok := s.stats.duration[src]; ok {
			ch <- prometheus.MustNewConstMetric(readDurationDesc, prometheus.GaugeValue, d.Seconds(), src)
		}
	}
	s.stats.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(resyncsDesc, prometheus.CounterValue, float64(s.stats.resyncs.Load()))
	if st := s.State(); st != nil {
		ch <- prometheus.MustNewConstMetric(lastReadDesc, prometheus.GaugeValue, float64(st.At.UnixNano())/1e9)
	}
}
