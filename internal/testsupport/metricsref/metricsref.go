// Package metricsref reads the metrics reference table of proxyhealth's README, so that tests
// can hold the exporter to what the README promises.
package metricsref

import (
	"bufio"
	"io"
	"regexp"
	"sort"
	"strings"
)

// Metric is one documented metric.
type Metric struct {
	Type   string   // gauge, counter, histogram or summary
	Labels []string // sorted
}

// Signature renders the type and labels for comparison, e.g. "gauge {collector}".
func (m Metric) Signature() string { return m.Type + " {" + strings.Join(m.Labels, ",") + "}" }

var row = regexp.MustCompile("^\\| `(proxyhealth_[a-z0-9_]+)` \\| (gauge|counter|histogram|summary) \\|\\s*([^|]*?)\\s*\\|")

// Parse reads the rows "| `proxyhealth_x` | type | `a`, `b` | meaning |" of a README.
func Parse(r io.Reader) (map[string]Metric, error) {
	docs := map[string]Metric{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		m := row.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		var labels []string
		for _, l := range strings.Split(m[3], ",") {
			if l = strings.Trim(strings.TrimSpace(l), "`"); l != "" {
				labels = append(labels, l)
			}
		}
		sort.Strings(labels)
		docs[m[1]] = Metric{Type: m[2], Labels: labels}
	}
	return docs, sc.Err()
}
