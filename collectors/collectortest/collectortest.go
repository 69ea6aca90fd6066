// Package collectortest runs a proxyhealth collector as a scrape does, for the collectors'
// tests, in the manner of kube-state-metrics' test utilities: one Update gathered through a
// pedantic registry, then compared with an expected exposition or read series by series.
package collectortest

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/proxyhealth/proxyhealth/collectors"
)

// Scrape is what one Update of a collector sent, as a registry serves it: metric families
// sorted by name, series sorted by labels.
type Scrape struct {
	families []*dto.MetricFamily
}

// Collect runs c's Update once through a pedantic registry and returns what it sent, and
// Update's error. It fails t when a registry would refuse what was sent: a metric c does not
// describe, a series sent twice, labels that do not fit their descriptor.
func Collect(t testing.TB, c collectors.Collector) (*Scrape, error) {
	t.Helper()
	u := &updater{c: c}
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(u); err != nil {
		t.Fatalf("register the collector: %v", err)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather the collector's metrics: %v", err)
	}
	return &Scrape{families: families}, u.err
}

// CollectOK is Collect for a collector that must read everything: Update's error fails t.
func CollectOK(t testing.TB, c collectors.Collector) *Scrape {
	t.Helper()
	s, err := Collect(t, c)
	if err != nil {
		t.Errorf("Update: %v", err)
	}
	return s
}

// updater makes a collector a prometheus.Collector, keeping Update's error.
type updater struct {
	c   collectors.Collector
	err error
}

func (u *updater) Describe(ch chan<- *prometheus.Desc) { u.c.Describe(ch) }
func (u *updater) Collect(ch chan<- prometheus.Metric) { u.err = u.c.Update(ch) }

// Compare compares the families named (all of the scrape when none is) with expected, in the
// text exposition format, and returns their difference. expected may leave out a family's HELP
// and TYPE lines: they are then taken from the scrape, so that tests state values, not help
// texts (the golden scrape in package exporter holds those).
func (s *Scrape) Compare(expected string, names ...string) error {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	want, err := parser.TextToMetricFamilies(strings.NewReader(expected))
	if err != nil {
		return fmt.Errorf("expected exposition: %w", err)
	}
	var text bytes.Buffer
	for _, name := range slices.Sorted(maps.Keys(want)) {
		mf := want[name]
		if got := s.family(name); got != nil {
			if mf.Help == nil {
				mf.Help = got.Help
			}
			if mf.GetType() == dto.MetricType_UNTYPED {
				typeLike(mf, got.GetType())
			}
		}
		if _, err := expfmt.MetricFamilyToText(&text, mf); err != nil {
			return fmt.Errorf("expected exposition: %w", err)
		}
	}
	return testutil.GatherAndCompare(prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		return s.families, nil
	}), &text, names...)
}

// typeLike gives family mf, parsed without a TYPE line, the type t of the family it is
// compared with, moving its values there.
func typeLike(mf *dto.MetricFamily, t dto.MetricType) {
	for _, m := range mf.Metric {
		v := m.GetUntyped().GetValue()
		switch t {
		case dto.MetricType_GAUGE:
			m.Untyped, m.Gauge = nil, &dto.Gauge{Value: &v}
		case dto.MetricType_COUNTER:
			m.Untyped, m.Counter = nil, &dto.Counter{Value: &v}
		default:
			return // other types state their own TYPE line
		}
	}
	mf.Type = t.Enum()
}

// Names returns the names of the metric families sent, sorted.
func (s *Scrape) Names() []string {
	names := make([]string, 0, len(s.families))
	for _, mf := range s.families {
		names = append(names, mf.GetName())
	}
	return names
}

// Count returns how many series the families named have together.
func (s *Scrape) Count(names ...string) int {
	n := 0
	for _, name := range names {
		n += len(s.family(name).GetMetric())
	}
	return n
}

// Value returns the value of family name's only or first series (a gauge's or a counter's),
// and whether the family was sent.
func (s *Scrape) Value(name string) (float64, bool) {
	mf := s.family(name)
	if len(mf.GetMetric()) == 0 {
		return 0, false
	}
	m := mf.Metric[0]
	if m.Counter != nil {
		return m.Counter.GetValue(), true
	}
	return m.GetGauge().GetValue(), true
}

// String renders the scrape in the text exposition format.
func (s *Scrape) String() string {
	var b strings.Builder
	for _, mf := range s.families {
		if _, err := expfmt.MetricFamilyToText(&b, mf); err != nil {
			fmt.Fprintf(&b, "# %s: %v\n", mf.GetName(), err)
		}
	}
	return b.String()
}

func (s *Scrape) family(name string) *dto.MetricFamily {
	for _, mf := range s.families {
		if mf.GetName() == name {
			return mf
		}
	}
	return nil
}
