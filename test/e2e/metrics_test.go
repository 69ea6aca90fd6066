//go:build e2e

package e2e

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Scrape is one parsed /metrics answer.
type Scrape map[string]*dto.MetricFamily

func parseScrape(text string) (Scrape, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		return nil, err
	}
	return Scrape(fams), nil
}

// Value returns the value of the one series of name whose labels include every pair in want
// (an empty value matches an absent or empty label). ok is false when no series matches; more
// than one match is an error, so a too-loose selector cannot pass by accident.
func (s Scrape) Value(name string, want map[string]string) (v float64, ok bool, err error) {
	fam := s[name]
	if fam == nil {
		return 0, false, nil
	}
	var found []*dto.Metric
	for _, m := range fam.GetMetric() {
		if labelsMatch(m, want) {
			found = append(found, m)
		}
	}
	switch len(found) {
	case 0:
		return 0, false, nil
	case 1:
	default:
		return 0, false, fmt.Errorf("%s%s matches %d series", name, fmtLabels(want), len(found))
	}
	m := found[0]
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue(), true, nil
	case m.Gauge != nil:
		return m.Gauge.GetValue(), true, nil
	case m.Untyped != nil:
		return m.Untyped.GetValue(), true, nil
	}
	return 0, false, fmt.Errorf("%s is neither counter nor gauge", name)
}

// Sum adds every series of name whose labels include want.
func (s Scrape) Sum(name string, want map[string]string) float64 {
	total := 0.0
	if fam := s[name]; fam != nil {
		for _, m := range fam.GetMetric() {
			if !labelsMatch(m, want) {
				continue
			}
			switch {
			case m.Counter != nil:
				total += m.Counter.GetValue()
			case m.Gauge != nil:
				total += m.Gauge.GetValue()
			case m.Untyped != nil:
				total += m.Untyped.GetValue()
			}
		}
	}
	return total
}

// Series renders every series of name, for failure messages.
func (s Scrape) Series(name string) string {
	fam := s[name]
	if fam == nil {
		return name + ": absent"
	}
	var lines []string
	for _, m := range fam.GetMetric() {
		labels := map[string]string{}
		for _, lp := range m.GetLabel() {
			labels[lp.GetName()] = lp.GetValue()
		}
		v := 0.0
		switch {
		case m.Counter != nil:
			v = m.Counter.GetValue()
		case m.Gauge != nil:
			v = m.Gauge.GetValue()
		case m.Untyped != nil:
			v = m.Untyped.GetValue()
		}
		lines = append(lines, name+fmtLabels(labels)+" "+strconv.FormatFloat(v, 'g', -1, 64))
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

func labelsMatch(m *dto.Metric, want map[string]string) bool {
	have := map[string]string{}
	for _, lp := range m.GetLabel() {
		have[lp.GetName()] = lp.GetValue()
	}
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}

func fmtLabels(l map[string]string) string {
	keys := make([]string, 0, len(l))
	for k := range l {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%q", k, l[k]))
	}
	return "{" + strings.Join(parts, ",") + "}"
}

func itoa(n int) string { return strconv.Itoa(n) }
