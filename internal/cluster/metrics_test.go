package cluster

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

type fixedView struct{ s *Snapshot }

func (f fixedView) Snapshot() *Snapshot { return f.s }

func TestHealthCollector(t *testing.T) {
	fresh := NewHealthCollector(fixedView{&Snapshot{Synced: true, Fresh: true, LastHeard: time.Unix(1700000000, 0)}})
	want := `# HELP proxyhealth_api_last_heard_timestamp_seconds When the exporter's own API view last heard from the API server (a watch event or a probe on the same connection).
# TYPE proxyhealth_api_last_heard_timestamp_seconds gauge
proxyhealth_api_last_heard_timestamp_seconds 1.7e+09
# HELP proxyhealth_api_view_fresh 1 while the exporter's own API view is synced and recently heard from; drift is only reported while it is.
# TYPE proxyhealth_api_view_fresh gauge
proxyhealth_api_view_fresh 1
`
	if err := testutil.CollectAndCompare(fresh, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
	// Never heard from: no timestamp, and not fresh.
	never := NewHealthCollector(fixedView{&Snapshot{}})
	if n := testutil.CollectAndCount(never, "proxyhealth_api_last_heard_timestamp_seconds"); n != 0 {
		t.Errorf("%d last-heard series before the view heard anything", n)
	}
	if v := testutil.ToFloat64(onlyFresh{never}); v != 0 {
		t.Errorf("fresh = %v, want 0", v)
	}
}

// onlyFresh keeps proxyhealth_api_view_fresh of a health collector.
type onlyFresh struct {
	c interface {
		Collect(chan<- prometheus.Metric)
	}
}

func (o onlyFresh) Describe(ch chan<- *prometheus.Desc) { ch <- viewFreshDesc }
func (o onlyFresh) Collect(ch chan<- prometheus.Metric) {
	all := make(chan prometheus.Metric, 4)
	o.c.Collect(all)
	close(all)
	for m := range all {
		if m.Desc() == viewFreshDesc {
			ch <- m
		}
	}
}
