package kubeproxy

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"maps"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// referenceRead reads body the way the collector did before the line scan: the whole
// exposition parsed by expfmt, then the families read taken from it. The scan must read
// every exposition it accepts the same way.
func referenceRead(body string) (probeResult, error) {
	var res probeResult
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		return res, err
	}
	value := func(m *dto.Metric) float64 {
		switch {
		case m.Gauge != nil:
			return m.Gauge.GetValue()
		case m.Counter != nil:
			return m.Counter.GetValue()
		case m.Untyped != nil:
			return m.Untyped.GetValue()
		}
		return 0
	}
	labelValue := func(m *dto.Metric, name string) string {
		for _, l := range m.GetLabel() {
			if l.GetName() == name {
				return l.GetValue()
			}
		}
		return ""
	}
	sum := func(name string) (float64, bool) {
		f := families[name]
		if f == nil {
			return 0, false
		}
		var total float64
		for _, m := range f.GetMetric() {
			total += value(m)
		}
		return total, true
	}
	type family struct {
		last, queued time.Time
		failures     float64
	}
	byFamily := map[string]*family{}
	at := func(m *dto.Metric) *family {
		key := labelValue(m, "ip_family")
		f := byFamily[key]
		if f == nil {
			f = &family{}
			byFamily[key] = f
		}
		return f
	}
	for _, m := range families[kpLastSync].GetMetric() {
		at(m).last = secondsTime(value(m))
	}
	for _, m := range families[kpLastQueued].GetMetric() {
		at(m).queued = secondsTime(value(m))
	}
	for _, name := range []string{kpIPTablesRestore, kpNFTablesSync} {
		for _, m := range families[name].GetMetric() {
			at(m).failures += value(m)
		}
	}
	for name, f := range byFamily {
		res.families[res.numFamilies] = familySyncs{name: name, last: f.last, failures: f.failures}
		res.numFamilies++
		if !f.last.IsZero() && (!res.hasLastSync || f.last.Before(res.lastSync)) {
			res.lastSync, res.hasLastSync = f.last, true
		}
		if f.queued.After(f.last) && (res.pendingSince.IsZero() || f.queued.Before(res.pendingSince)) {
			res.pendingSince = f.queued
		}
	}
	res.endpointsPending, res.hasEndpointsPending = sum(kpEndpointsPending)
	res.servicesPending, res.hasServicesPending = sum(kpServicesPending)
	ipt, _ := sum(kpIPTablesRestore)
	nft, _ := sum(kpNFTablesSync)
	res.restoreFailures = ipt + nft
	res.invalidDropped, res.hasInvalidDropped = sum(kpInvalidDropped)
	for _, m := range families[kpBuildInfo].GetMetric() {
		if v := labelValue(m, "git_version"); len(v) <= maxVersionBytes {
			res.version = v
		}
	}
	res.up = true
	return res, nil
}

// scanRead reads body with the line scan.
func scanRead(body string, openMetrics bool) (probeResult, metricsScan, error) {
	var res probeResult
	var m kpMetrics
	scan, err := scanMetrics(strings.NewReader(body), maxMetricsBodyBytes, metricsLineBytes, openMetrics, &m)
	if err != nil {
		return res, scan, err
	}
	res.up = true
	m.apply(&res)
	return res, scan, nil
}

// sameReading compares what the collector publishes from two reads of kube-proxy's metrics.
func sameReading(a, b probeResult) bool {
	return a.up == b.up && a.lastSync.Equal(b.lastSync) && a.hasLastSync == b.hasLastSync &&
		a.pendingSince.Equal(b.pendingSince) &&
		a.endpointsPending == b.endpointsPending && a.hasEndpointsPending == b.hasEndpointsPending &&
		a.servicesPending == b.servicesPending && a.hasServicesPending == b.hasServicesPending &&
		a.restoreFailures == b.restoreFailures && maps.Equal(familiesOf(a), familiesOf(b)) &&
		a.invalidDropped == b.invalidDropped && a.hasInvalidDropped == b.hasInvalidDropped &&
		a.version == b.version
}

// familiesOf is res's IP families by name, for a comparison that ignores their order.
func familiesOf(res probeResult) map[string]familySyncs {
	m := make(map[string]familySyncs, res.numFamilies)
	for _, f := range res.families[:res.numFamilies] {
		m[f.name] = f
	}
	return m
}

const stuckBody = `# TYPE kubeproxy_sync_proxy_rules_last_timestamp_seconds gauge
kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"} 1000
kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv6"} 1100
# TYPE kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds gauge
kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family="IPv4"} 1050
kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family="IPv6"} 1090
# TYPE kubeproxy_sync_proxy_rules_endpoint_changes_pending gauge
kubeproxy_sync_proxy_rules_endpoint_changes_pending 12
# TYPE kubeproxy_sync_proxy_rules_service_changes_pending gauge
kubeproxy_sync_proxy_rules_service_changes_pending 3
# TYPE kubeproxy_sync_proxy_rules_iptables_restore_failures_total counter
kubeproxy_sync_proxy_rules_iptables_restore_failures_total{ip_family="IPv4"} 4
kubeproxy_sync_proxy_rules_iptables_restore_failures_total{ip_family="IPv6"} 1
# TYPE kubeproxy_sync_proxy_rules_nftables_sync_failures_total counter
kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family="IPv4"} 2
`

// Every exposition the old parse read is read the same by the scan: kube-proxy's real metrics,
// and the syntax the text format allows (escapes, quoted names, names inside the braces,
// timestamps, blanks and tabs, untyped samples, repeated series).
func TestScanReadsAsTheFullParse(t *testing.T) {
	bodies := map[string]string{"stuck": stuckBody}
	for _, file := range []string{"kube-proxy-v1.36.3-metrics.txt", "kube-proxy-v1.36.3-metrics-stale.txt"} {
		data, err := os.ReadFile(filepath.Join("testdata", file))
		if err != nil {
			t.Fatal(err)
		}
		bodies[file] = string(data)
	}
	bodies["syntax"] = `# HELP kubeproxy_sync_proxy_rules_last_timestamp_seconds [ALPHA] The last time \\ proxy "rules" were\nsynced.
# TYPE kubeproxy_sync_proxy_rules_last_timestamp_seconds gauge

kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv\"4\\",other="a}b,c=\"d\" \n"} 1000
kubeproxy_sync_proxy_rules_last_timestamp_seconds { "ip_family" = "IPv6" , zone="a", } 900 1700000000000
	{"kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",ip_family="IPv6"} 950
kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family="IPv\"4\\"}	1.2e3
kubeproxy_sync_proxy_rules_last_timestamp_seconds_extra{ip_family="IPv4"} 1
kubeproxy_sync_proxy_rules_endpoint_changes_pending 5
kubeproxy_sync_proxy_rules_endpoint_changes_pending 7
kubeproxy_sync_proxy_rules_service_changes_pending{} 0
{"kubeproxy_sync_proxy_rules_iptables_restore_failures_total"} +Inf
"kubeproxy_iptables_ct_state_invalid_dropped_packets_total"{ip_family="IPv4"} 3
{"kubeproxy.some.utf8.name",ip_family="IPv4"} 7
kubeproxy_other_total{"label.with.dots"="x",ip_family=""} 9
# a comment
#
`
	bodies["build info"] = `# TYPE kubernetes_build_info gauge
kubernetes_build_info{build_date="2026-10-01T00:00:00Z",compiler="gc",git_commit="abc",git_tree_state="clean",git_version="v1.37.2",go_version="go1.26.8",major="1",minor="37",platform="linux/amd64"} 1
kubernetes_feature_enabled{name="NFTablesNetlink",stage="BETA"} 1
`
	bodies["build info escaped"] = `kubernetes_build_info{git_version="v1.38.0-\"dev\"\\x",ip_family="IPv4"} 1
`
	bodies["queued without a sync, and no ip_family"] = `kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds 1500
kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"} 1400
`
	bodies["none of the families"] = "# TYPE up gauge\nup 1\n"
	bodies["empty"] = ""
	for name, body := range bodies {
		t.Run(name, func(t *testing.T) {
			want, err := referenceRead(body)
			if err != nil {
				t.Fatalf("the full parse fails: %v", err)
			}
			got, scan, err := scanRead(body, false)
			if err != nil {
				t.Fatalf("the scan fails: %v", err)
			}
			if !sameReading(got, want) {
				t.Errorf("scan read %+v, the full parse %+v", got, want)
			}
			if scan.longLines != 0 || scan.truncated || scan.droppedFamilies != 0 {
				t.Errorf("scan %+v", scan)
			}
		})
	}
}

// What is not an exposition fails the scan as it failed the full parse: kube-proxy then
// counts as not answering.
func TestScanRejectsWhatIsNoExposition(t *testing.T) {
	for _, body := range []string{
		"<!DOCTYPE html>\n<html><body>hello</body></html>\n",
		"kubeproxy_sync_proxy_rules_endpoint_changes_pending\n",
		"kubeproxy_sync_proxy_rules_endpoint_changes_pending twelve\n",
		"kubeproxy_sync_proxy_rules_endpoint_changes_pending 0x1p3\n",
		"kubeproxy_sync_proxy_rules_endpoint_changes_pending 1_000\n",
		"kubeproxy_sync_proxy_rules_endpoint_changes_pending 1 2 3\n",
		"kubeproxy_sync_proxy_rules_endpoint_changes_pending 1 1.5\n",
		`foo{a="b" 1` + "\n",
		`foo{a="b"` + "\n",
		`foo{a=b} 1` + "\n",
		`foo{a="\q"} 1` + "\n",
		`foo{a="b",,} 1` + "\n",
		`foo{__name__="x"} 1` + "\n",
		`foo{ip_family="a",ip_family="b"} 1` + "\n",
		`{"foo","bar"} 1` + "\n",
		`foo{"bar"} 1` + "\n",
		"{} 1\n",
		`{a="b"} 1` + "\n",
		`"" 1` + "\n",
		"foo{\"a\xff\"=\"b\"} 1\n",
		"foo{a=\"\xff\"} 1\n",
		"# TYPE foo nonsense\n",
		"# HELP foo bad \\escape\n",
		"# HELP 9foo help\n",
		"9foo 1\n",
	} {
		if _, err := referenceRead(body); err == nil {
			t.Errorf("%q: the full parse accepts it", body)
		}
		if res, _, err := scanRead(body, false); err == nil {
			t.Errorf("%q: the scan accepts it: %+v", body, res)
		}
	}
}

// OpenMetrics text: counters named without _total in TYPE, exemplars, float timestamps, and
// "# EOF", after which nothing is read.
func TestScanOpenMetrics(t *testing.T) {
	body := `# TYPE kubeproxy_sync_proxy_rules_last_timestamp_seconds gauge
# UNIT kubeproxy_sync_proxy_rules_last_timestamp_seconds seconds
kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"} 1000 1700000000.5
# TYPE kubeproxy_sync_proxy_rules_iptables_restore_failures counter
kubeproxy_sync_proxy_rules_iptables_restore_failures_total{ip_family="IPv4"} 4 # {trace_id="abc"} 1 1700000000.1
kubeproxy_sync_proxy_rules_iptables_restore_failures_created{ip_family="IPv4"} 1.7e9
# TYPE kubeproxy_info info
kubeproxy_info{version="v1.36.3"} 1
# EOF
kubeproxy_sync_proxy_rules_endpoint_changes_pending 12
`
	got, _, err := scanRead(body, true)
	if err != nil {
		t.Fatal(err)
	}
	if !got.hasLastSync || !got.lastSync.Equal(time.Unix(1000, 0)) || got.restoreFailures != 4 || got.hasEndpointsPending {
		t.Errorf("read %+v", got)
	}
	// The same body as text 0.0.4 is no valid exposition (an exemplar, a float timestamp).
	if _, _, err := scanRead(body, false); err == nil {
		t.Error("OpenMetrics read as the text format")
	}
}

// A line longer than the line buffer is skipped and counted, whether or not it is of a family
// read, and the lines after it are read; a body past the byte cap is read up to it, without
// the line the cap cuts; a last line without a newline is read.
func TestScanBounds(t *testing.T) {
	const lineBytes = 256
	long := `rest_client_requests_total{path="` + strings.Repeat("x", 3*lineBytes) + `"} 1` + "\n"
	longRead := `kubeproxy_sync_proxy_rules_endpoint_changes_pending{note="` + strings.Repeat("y", lineBytes) + `"} 99` + "\n"
	body := long + "kubeproxy_sync_proxy_rules_service_changes_pending 3\n" + longRead + long +
		"kubeproxy_sync_proxy_rules_endpoint_changes_pending 4\n" +
		"kubeproxy_sync_proxy_rules_nftables_sync_failures_total 2"
	var m kpMetrics
	scan, err := scanMetrics(strings.NewReader(body), int64(len(body)), lineBytes, false, &m)
	if err != nil {
		t.Fatal(err)
	}
	var res probeResult
	m.apply(&res)
	if scan.lines != 6 || scan.longLines != 3 || scan.longLinesRead != 1 || scan.truncated {
		t.Errorf("scan %+v", scan)
	}
	if res.servicesPending != 3 || res.endpointsPending != 4 || res.restoreFailures != 2 {
		t.Errorf("read %+v", res)
	}

	// The cap cuts the last line: "...failures_total 2" must not be read as "... 2" cut short,
	// nor the one before it as a sample with a cut value.
	for _, limit := range []int{len(body) - 1, len(body) - len(" 2"), len(body) - len("otal 2")} {
		var m kpMetrics
		scan, err := scanMetrics(strings.NewReader(body+"\n"), int64(limit), lineBytes, false, &m)
		if err != nil {
			t.Fatal(err)
		}
		if !scan.truncated || m.has[famNFTablesSync] || m.sums[famEndpointsPending] != 4 {
			t.Errorf("cut at %d: scan %+v, read %+v", limit, scan, m)
		}
	}
	cut := strings.Index(body, "kubeproxy_sync_proxy_rules_endpoint_changes_pending 4") + len("kubeproxy_sync_proxy_rules_endpoint_changes_pending 4")
	var cutAt kpMetrics
	if _, err := scanMetrics(strings.NewReader(body), int64(cut), lineBytes, false, &cutAt); err != nil || cutAt.has[famEndpointsPending] {
		t.Errorf("a value cut by the cap was read: %v, %+v", err, cutAt)
	}
	// Exactly at the cap: nothing more to read is no truncation.
	var exact kpMetrics
	if scan, err := scanMetrics(strings.NewReader(body), int64(len(body)), lineBytes, false, &exact); err != nil || scan.truncated {
		t.Errorf("scan %+v, %v", scan, err)
	}
}

// A read error fails the scan (kube-proxy then counts as not answering), as it failed the
// full parse.
func TestScanReadError(t *testing.T) {
	r := io.MultiReader(strings.NewReader(stuckBody), iotest.ErrReader(errors.New("connection reset")))
	var m kpMetrics
	if _, err := scanMetrics(r, maxMetricsBodyBytes, metricsLineBytes, false, &m); err == nil || !strings.Contains(err.Error(), "connection reset") {
		t.Errorf("err = %v", err)
	}
}

// ip_family values past maxIPFamilies are left out and counted; memory stays bounded.
func TestScanBoundsIPFamilies(t *testing.T) {
	var sb strings.Builder
	sb.WriteString("kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv4\"} 500\n")
	for i := range 1000 {
		sb.WriteString("kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"f")
		sb.WriteString(strings.Repeat("x", i))
		sb.WriteString("\"} 1000\n")
	}
	got, scan, err := scanRead(sb.String(), false)
	if err != nil {
		t.Fatal(err)
	}
	if scan.droppedFamilies != 1000-(maxIPFamilies-1) || !got.lastSync.Equal(time.Unix(500, 0)) {
		t.Errorf("scan %+v, last sync %v", scan, got.lastSync)
	}
}

// The scan allocates nothing per line: what it allocates does not depend on the body.
func TestScanAllocations(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "kube-proxy-v1.36.3-metrics.txt"))
	if err != nil {
		t.Fatal(err)
	}
	allocs := func(copies int) float64 {
		body := bytes.Repeat(data, copies)
		return testing.AllocsPerRun(5, func() {
			var m kpMetrics
			if _, err := scanMetrics(bytes.NewReader(body), maxMetricsBodyBytes, metricsLineBytes, false, &m); err != nil {
				t.Fatal(err)
			}
		})
	}
	one, many := allocs(1), allocs(50)
	if many > one {
		t.Errorf("%v allocations for one copy of kube-proxy's metrics, %v for 50", one, many)
	}
}

// FuzzExpositionLine checks the line parser on any input: it never panics, keeps its scratch
// within the line, and wherever expfmt's parser (what the collector used before) also reads the
// line as one sample, both read the same name, value and ip_family.
func FuzzExpositionLine(f *testing.F) {
	for _, file := range []string{"kube-proxy-v1.36.3-metrics.txt"} {
		data, err := os.ReadFile(filepath.Join("testdata", file))
		if err != nil {
			f.Fatal(err)
		}
		sc := bufio.NewScanner(bytes.NewReader(data))
		for i := 0; sc.Scan(); i++ {
			if i%20 == 0 || strings.Contains(sc.Text(), "kubeproxy_sync") || strings.Contains(sc.Text(), "build_info") {
				f.Add(sc.Text(), false)
			}
		}
	}
	for _, l := range strings.Split(stuckBody, "\n") {
		f.Add(l, false)
	}
	for _, l := range []string{
		`kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv\"4\\",other="a}b,c=\"d\" \n"} 1000`,
		`kubeproxy_sync_proxy_rules_last_timestamp_seconds { "ip_family" = "IPv6" , zone="a", } 900 1700000000000`,
		`	{"kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",ip_family="IPv6"} 950`,
		`{"kubeproxy.some.utf8.name",ip_family="IPv4"} 7`,
		`kubernetes_build_info{git_version="v1.\"37\"",ip_family="IPv\\6"} 1`,
		`"kubeproxy\"x"{ip_family="IPv4"} NaN`,
		`# HELP x a \\ help \n with "escapes"`,
		`# TYPE x gaugehistogram`,
		`x 1 # {trace_id="abc"} 1 1700000000.1`,
		`# EOF`,
	} {
		f.Add(l, false)
		f.Add(l, true)
	}
	f.Fuzz(func(t *testing.T, line string, openMetrics bool) {
		line, _, _ = strings.Cut(line, "\n")
		p := expoParser{openMetrics: openMetrics}
		kind, s, err := p.parseLine([]byte(line + "\n"))
		if cap(p.scratch) > 2*len(line)+8 || cap(p.versionScratch) > 2*len(line)+8 {
			t.Errorf("scratch of %d and %d bytes for a line of %d", cap(p.scratch), cap(p.versionScratch), len(line))
		}
		if err != nil {
			return
		}
		if kind == expoSample && len(s.name) == 0 {
			t.Fatal("a sample without a name")
		}
		if openMetrics {
			return
		}
		parser := expfmt.NewTextParser(model.UTF8Validation)
		families, ferr := parser.TextToMetricFamilies(strings.NewReader(line + "\n"))
		if ferr != nil {
			return // stricter than the scan here (trailing blanks, '\r')
		}
		var mf *dto.MetricFamily
		for _, f := range families {
			mf = f
		}
		if kind != expoSample {
			if len(families) != 0 {
				t.Fatalf("expfmt read %v from a line the scan skips", families)
			}
			return
		}
		if len(families) != 1 || len(mf.GetMetric()) != 1 {
			t.Fatalf("expfmt read %v from one sample", families)
		}
		name := s.name
		if s.nameEscaped {
			name = unescape(nil, name)
		}
		m := mf.GetMetric()[0]
		if string(name) != mf.GetName() {
			t.Errorf("name %q, expfmt %q", name, mf.GetName())
		}
		want := m.GetUntyped().GetValue()
		if s.value != want && !(math.IsNaN(s.value) && math.IsNaN(want)) {
			t.Errorf("value %v, expfmt %v", s.value, want)
		}
		var ipFamily, gitVersion string
		var hasIPFamily, hasGitVersion bool
		for _, l := range m.GetLabel() {
			switch l.GetName() {
			case "ip_family":
				ipFamily, hasIPFamily = l.GetValue(), true
			case "git_version":
				gitVersion, hasGitVersion = l.GetValue(), true
			}
		}
		if string(s.ipFamily) != ipFamily || s.hasIPFamily != hasIPFamily {
			t.Errorf("ip_family %q (%v), expfmt %q (%v)", s.ipFamily, s.hasIPFamily, ipFamily, hasIPFamily)
		}
		if string(s.gitVersion) != gitVersion || s.hasGitVersion != hasGitVersion {
			t.Errorf("git_version %q (%v), expfmt %q (%v)", s.gitVersion, s.hasGitVersion, gitVersion, hasGitVersion)
		}
	})
}
