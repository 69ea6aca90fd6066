package metricsref

import (
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	docs, err := Parse(strings.NewReader(strings.Join([]string{
		"| metric | type | labels | meaning |",
		"|---|---|---|---|",
		"| `proxyhealth_a_total` | counter | `z`, `b` | x |",
		"| `proxyhealth_b` | gauge | | y |",
		"| `not_ours` | gauge | | z |",
	}, "\n")))
	if err != nil {
		t.Fatal(err)
	}
	if len(docs) != 2 || docs["proxyhealth_a_total"].Signature() != "counter {b,z}" || docs["proxyhealth_b"].Signature() != "gauge {}" {
		t.Errorf("Parse = %+v", docs)
	}
}
