package exporter

import (
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/prometheus/client_golang/prometheus"
	versioncollector "github.com/prometheus/client_golang/prometheus/collectors/version"
	"github.com/prometheus/common/promslog"

	phcollectors "github.com/proxyhealth/proxyhealth/collectors"
	"github.com/proxyhealth/proxyhealth/internal/cluster"
	"github.com/proxyhealth/proxyhealth/internal/kubeauth"
	"github.com/proxyhealth/proxyhealth/internal/nodecondition"
	"github.com/proxyhealth/proxyhealth/internal/reportwriter"
	"github.com/proxyhealth/proxyhealth/internal/testsupport/metricsref"
)

func readmeMetrics(t *testing.T) map[string]metricsref.Metric {
	t.Helper()
	f, err := os.Open("../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	docs, err := metricsref.Parse(f)
	if err != nil {
		t.Fatal(err)
	}
	return docs
}

var (
	descFields     = regexp.MustCompile(`fqName: "([^"]+)", help: ("(?:[^"\\]|\\.)*")(?:, unit: "[^"]*")?, constLabels: \{([^}]*)\}, variableLabels: \{([^}]*)\}`)
	constLabelName = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="`)
)

// describedDesc is one metric as its descriptor declares it.
type describedDesc struct {
	name   string
	labels []string // sorted, constant and variable
	help   string
}

// describedMetrics maps every described metric to its sorted label names, comma-separated.
func describedMetrics(t *testing.T) map[string]string {
	t.Helper()
	got := map[string]string{}
	for _, d := range describedDescs(t) {
		got[d.name] = strings.Join(d.labels, ",")
	}
	return got
}

// describedDescs builds every collector with default flags (building opens nothing) and
// collects the descriptors they declare, plus the exporter's own. On the way it checks that
// each collector with background work is registered with it (registerRunner), so that the
// exporter starts it.
func describedDescs(t *testing.T) []describedDesc {
	t.Helper()
	app := kingpin.New("test", "")
	flags := addCollectorFlags(app, addPathFlags(app))
	flags.api.logger, flags.host.logger = promslog.NewNopLogger(), promslog.NewNopLogger()
	if _, err := app.Parse(nil); err != nil {
		t.Fatal(err)
	}
	built, err := flags.build(promslog.NewNopLogger())
	if err != nil {
		t.Fatalf("build: %v", err)
	}
	ch := make(chan *prometheus.Desc, 1000)
	for _, r := range built.named() {
		c, run := r.collector, r.runner
		if _, background := c.(phcollectors.Runner); background != (run != nil) {
			t.Errorf("collector %s: has a Run method: %v, registered with it: %v", r.name, background, run != nil)
		}
		c.Describe(ch)
	}
	built.host.Describe(ch)
	pub, err := nodecondition.New(nil, nodecondition.Config{NodeName: "node", HeartbeatInterval: time.Minute}, promslog.NewNopLogger())
	if err != nil {
		t.Fatal(err)
	}
	pub.Describe(ch)
	rw, err := reportwriter.New(nil, reportwriter.Config{NodeName: "node", Namespace: "proxyhealth", MinInterval: time.Second, Heartbeat: time.Minute}, promslog.NewNopLogger())
	if err != nil {
		t.Fatal(err)
	}
	rw.Describe(ch)
	cluster.NewHealthCollector(built.api).Describe(ch)
	auth, err := kubeauth.New(kubeauth.Config{}, nil, promslog.NewNopLogger())
	if err != nil {
		t.Fatal(err)
	}
	auth.Describe(ch)
	ch <- collectorSuccessDesc
	ch <- collectorDurationDesc
	versioncollector.NewCollector("proxyhealth").Describe(ch)
	close(ch)
	var got []describedDesc
	for d := range ch {
		m := descFields.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("cannot read descriptor %s", d)
		}
		help, err := strconv.Unquote(m[2])
		if err != nil {
			t.Fatalf("cannot read the help of descriptor %s: %v", d, err)
		}
		labels := strings.Fields(strings.ReplaceAll(m[4], ",", " "))
		for _, c := range constLabelName.FindAllStringSubmatch(m[3], -1) {
			labels = append(labels, c[1])
		}
		sort.Strings(labels)
		got = append(got, describedDesc{name: m[1], labels: labels, help: help})
	}
	return got
}

// TestReadmeDocumentsEveryMetric keeps the metrics reference (docs/metrics.md) and the collectors in
// step: the same names and labels, and counters (and only counters) ending in _total.
func TestReadmeDocumentsEveryMetric(t *testing.T) {
	docs := readmeMetrics(t)
	described := describedMetrics(t)
	if len(docs) == 0 || len(described) == 0 {
		t.Fatalf("found %d documented and %d described metrics", len(docs), len(described))
	}
	for name, labels := range described {
		doc, ok := docs[name]
		switch {
		case !ok:
			t.Errorf("%s{%s} is exported but not in docs/metrics.md", name, labels)
		case strings.Join(doc.Labels, ",") != labels:
			t.Errorf("%s: docs/metrics.md lists labels %v, the collector uses {%s}", name, doc.Labels, labels)
		}
	}
	for name, doc := range docs {
		if _, ok := described[name]; !ok {
			t.Errorf("%s is in docs/metrics.md but no collector exports it", name)
		}
		if isCounter := doc.Type == "counter"; isCounter != strings.HasSuffix(name, "_total") {
			t.Errorf("%s: documented as %s; counters and only counters end in _total", name, doc.Type)
		}
	}
}
