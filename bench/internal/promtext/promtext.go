// Package promtext reads samples out of a Prometheus text exposition, as the benchmarks scrape
// the exporter and kube-proxy: a value by name, and whether a series exists.
package promtext

import (
	"iter"
	"strconv"
	"strings"
)

// Value returns the value of a sample of name: the largest over its label sets (kube-proxy
// labels its sync metrics by ip_family), and whether there is one.
func Value(body, name string) (float64, bool) {
	best, found := 0.0, false
	for v := range Samples(body, name) {
		if !found || v > best {
			best, found = v, true
		}
	}
	return best, found
}

// Sum is the sum of the samples of name over its label sets.
func Sum(body, name string) float64 {
	var sum float64
	for v := range Samples(body, name) {
		sum += v
	}
	return sum
}

// Samples yields the values of name's samples; other names, prefixes of them included, and
// unparsable values are left out.
func Samples(body, name string) iter.Seq[float64] {
	return func(yield func(float64) bool) {
		for line := range strings.SplitSeq(body, "\n") {
			rest, ok := strings.CutPrefix(line, name)
			if !ok || rest == "" || (rest[0] != ' ' && rest[0] != '{') {
				continue
			}
			if rest[0] == '{' {
				i := strings.Index(rest, "} ")
				if i < 0 {
					continue
				}
				rest = rest[i+1:]
			}
			if v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64); err == nil && !yield(v) {
				return
			}
		}
	}
}

// HasSeries says whether the exposition has a sample of name whose labels include every one
// of want (`label="value"`).
func HasSeries(body, name string, want []string) bool {
	for _, line := range strings.Split(body, "\n") {
		rest, ok := strings.CutPrefix(line, name+"{")
		if !ok {
			continue
		}
		all := true
		for _, w := range want {
			if !strings.Contains(rest, w) {
				all = false
				break
			}
		}
		if all {
			return true
		}
	}
	return false
}
