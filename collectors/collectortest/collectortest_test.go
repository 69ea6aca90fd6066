package collectortest

import (
	"errors"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/proxyhealth/proxyhealth/internal/metricdesc"
)

var (
	upDesc     = metricdesc.New("test", "up", "Whether the test source answers.")
	eventsDesc = metricdesc.New("test", "events_total", "Events seen, by kind.", "kind")
)

// fake sends one gauge and two counter series, and fails as told.
type fake struct{ err error }

func (f fake) Describe(ch chan<- *prometheus.Desc) { ch <- upDesc; ch <- eventsDesc }
func (f fake) Update(ch chan<- prometheus.Metric) error {
	ch <- prometheus.MustNewConstMetric(upDesc, prometheus.GaugeValue, 1)
	ch <- prometheus.MustNewConstMetric(eventsDesc, prometheus.CounterValue, 3, "new")
	ch <- prometheus.MustNewConstMetric(eventsDesc, prometheus.CounterValue, 5, "destroy")
	return f.err
}

func TestCompare(t *testing.T) {
	failed := errors.New("half read")
	s, err := Collect(t, fake{failed})
	if !errors.Is(err, failed) {
		t.Errorf("Collect returned %v, want Update's error", err)
	}
	for _, tc := range []struct {
		name, want string
		names      []string
		same       bool
	}{
		{"values only", "proxyhealth_test_up 1\nproxyhealth_test_events_total{kind=\"new\"} 3\nproxyhealth_test_events_total{kind=\"destroy\"} 5\n", nil, true},
		{"one family named", "proxyhealth_test_up 1\n", []string{"proxyhealth_test_up"}, true},
		{"stated HELP and TYPE", "# HELP proxyhealth_test_up Whether the test source answers.\n# TYPE proxyhealth_test_up gauge\nproxyhealth_test_up 1\n", []string{"proxyhealth_test_up"}, true},
		{"another value", "proxyhealth_test_up 0\n", []string{"proxyhealth_test_up"}, false},
		{"another type stated", "# TYPE proxyhealth_test_up counter\nproxyhealth_test_up 1\n", []string{"proxyhealth_test_up"}, false},
		{"another help stated", "# HELP proxyhealth_test_up Something else.\nproxyhealth_test_up 1\n", []string{"proxyhealth_test_up"}, false},
		{"a series missing", "proxyhealth_test_events_total{kind=\"new\"} 3\n", []string{"proxyhealth_test_events_total"}, false},
		{"a family missing", "proxyhealth_test_up 1\n", nil, false},
	} {
		if err := s.Compare(tc.want, tc.names...); (err == nil) != tc.same {
			t.Errorf("%s: Compare = %v, want the same: %v", tc.name, err, tc.same)
		}
	}
}

func TestCountValueString(t *testing.T) {
	s := CollectOK(t, fake{})
	if n := s.Count("proxyhealth_test_up", "proxyhealth_test_events_total", "proxyhealth_test_absent"); n != 3 {
		t.Errorf("Count = %d, want 3", n)
	}
	if v, ok := s.Value("proxyhealth_test_events_total"); !ok || v != 5 {
		t.Errorf("Value of the first series (sorted by labels: destroy) = %v, %v; want 5, true", v, ok)
	}
	if v, ok := s.Value("proxyhealth_test_up"); !ok || v != 1 {
		t.Errorf("Value(up) = %v, %v; want 1, true", v, ok)
	}
	if _, ok := s.Value("proxyhealth_test_absent"); ok {
		t.Error("Value of a family not sent: found")
	}
	if out := s.String(); !strings.Contains(out, "proxyhealth_test_events_total{kind=\"new\"} 3\n") || !strings.Contains(out, "# TYPE proxyhealth_test_up gauge\n") {
		t.Errorf("String:\n%s", out)
	}
}
