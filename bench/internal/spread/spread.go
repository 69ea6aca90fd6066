// Package spread summarises a benchmark's repeated measurements of one figure: their median,
// and the median with the range for a report's table cell.
package spread

import (
	"fmt"
	"slices"
)

// Format formats the median and, for more than one value, the range of vals: "1.5 (1.2–2.0)".
// format is each number's fmt verb.
func Format(vals []float64, format string) string {
	if len(vals) == 0 {
		return "-"
	}
	s := slices.Clone(vals)
	slices.Sort(s)
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	if len(s) == 1 {
		return fmt.Sprintf(format, med)
	}
	return fmt.Sprintf(format+" ("+format+"–"+format+")", med, s[0], s[len(s)-1])
}

// Median is the median of vals, 0 for none.
func Median(vals []float64) float64 {
	if len(vals) == 0 {
		return 0
	}
	s := slices.Clone(vals)
	slices.Sort(s)
	if len(s)%2 == 0 {
		return (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return s[len(s)/2]
}
