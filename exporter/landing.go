package exporter

import (
	"bytes"
	"html/template"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/common/version"
	"github.com/prometheus/exporter-toolkit/web"

	"github.com/proxyhealth/proxyhealth/internal/verdict"
)

var statusTemplate = template.Must(template.New("status").Parse(`
<h2>Collectors</h2>
<table>
<tr><th>collector</th><th>state</th><th>since</th><th>last update</th><th>why</th></tr>
{{range .}}<tr><td>{{.Name}}</td><td>{{if .OK}}ok{{else}}<b>failing</b>{{end}}</td><td>{{if not .Since.IsZero}}{{.Since.Format "2006-01-02T15:04:05Z07:00"}}{{end}}</td><td>{{.Duration}}</td><td>{{.Err}}</td></tr>
{{end}}</table>
<p>A failing collector keeps the exporter and every other collector serving; see
<code>proxyhealth_collector_success</code> and the log for the reason.</p>
<p>Documentation: <a href="https://github.com/proxyhealth/proxyhealth#metrics">metrics reference</a>,
<a href="` + verdict.RunbookBase + `">runbooks</a>.</p>
`))

var verdictTemplate = template.Must(template.New("verdict").Funcs(template.FuncMap{
	"evidence": verdict.EvidenceFields,
	"seconds":  func(s float64) string { return verdict.FormatDuration(time.Duration(s * float64(time.Second))) },
}).Parse(`
<section id="verdict" class="verdict {{.Verdict}}">
<h2>Node {{if .Node}}{{.Node}}{{else}}(unnamed){{end}}: <span class="word">{{.Verdict}}</span></h2>
{{- if eq .Verdict "unknown"}}
<p class="why">Not known to be healthy: {{range $i, $c := .UncheckedCauses}}{{if $i}}, {{end}}{{$c}}{{end}} could not be checked (why below){{if not .Findings}}, and nothing else was found{{else}}, and nothing critical was found{{end}}.</p>
{{- else if not .Findings}}
<p>No finding: Service traffic on this node shows none of the causes proxyhealth knows.</p>
{{- end}}
{{- range .Findings}}
<div class="finding {{.Severity}}">
<h3>{{.Severity}}: {{.Cause}}{{with .Service}} &middot; {{.}}{{end}}</h3>
<p class="summary">{{.Summary}}</p>
<table class="evidence">
{{- range evidence .Evidence}}
<tr><th>{{.Key}}</th><td>{{.Value}}</td></tr>
{{- end}}
</table>
<p><a href="{{.Runbook}}">runbook</a></p>
</div>
{{- end}}
{{- if .NotChecked}}
<h3>Not checked</h3>
<ul class="not-checked">
{{- range .NotChecked}}
<li>{{range $i, $c := .Causes}}{{if $i}}, {{end}}{{$c}}{{end}}: {{.Reason}}</li>
{{- end}}
</ul>
{{- end}}
{{- if .Notes}}
<h3>Notes</h3>
<ul class="notes">
{{- range .Notes}}
<li>{{.}}</li>
{{- end}}
</ul>
{{- end}}
<p class="as-json">Judged at {{.Time.Format "2006-01-02T15:04:05Z07:00"}}{{if .WindowSeconds}} over the last {{seconds .WindowSeconds}}{{end}}; as JSON: <a href="status">/status</a>.</p>
</section>
`))

const landingCSS = `table { border-collapse: collapse } td, th { padding: 2px 8px; text-align: left; vertical-align: top }
.verdict { padding: 4px 12px; margin-bottom: 12px; border-left: 8px solid }
.verdict.healthy { border-color: #2e7d32; background: #e8f5e9 }
.verdict.warning { border-color: #f9a825; background: #fff8e1 }
.verdict.unknown { border-color: #757575; background: #f5f5f5 }
.verdict.critical { border-color: #c62828; background: #ffebee }
.verdict.healthy .word { color: #2e7d32 } .verdict.warning .word { color: #a36f00 } .verdict.unknown .word { color: #424242 }
.verdict.critical .word { color: #c62828 }
.finding { margin: 8px 0 16px } .finding.critical h3 { color: #c62828 } .finding.warning h3 { color: #a36f00 }
.evidence th { font-weight: normal; color: #555 } .evidence td { font-family: monospace; overflow-wrap: anywhere }`

// reporter judges the node on demand.
type reporter interface{ Report() verdict.Report }

// landingPage renders the exporter-toolkit landing page opening with the node's verdict, then
// the collectors' current state, so an operator opening the page sees at once whether Service
// traffic here breaks, why, and what this node can and cannot be checked for.
func landingPage(telemetryPath string, pprof bool, set *collectorSet, rep reporter) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" {
			http.NotFound(w, r) // the mux sends every unknown path here
			return
		}
		var status bytes.Buffer
		statuses := set.Statuses()
		for i := range statuses {
			statuses[i].Duration = statuses[i].Duration.Round(time.Microsecond)
		}
		if err := statusTemplate.Execute(&status, statuses); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		var judged bytes.Buffer
		if rep != nil {
			if err := verdictTemplate.Execute(&judged, rep.Report()); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
		}
		links := []web.LandingLinks{{Address: telemetryPath, Text: "Metrics"}}
		if rep != nil {
			links = append(links, web.LandingLinks{Address: "status", Text: "Status", Description: "the verdict as JSON"})
		}
		if pprof {
			links = append(links, web.LandingLinks{Address: "debug/pprof/", Text: "Profiler"})
		}
		page, err := web.NewLandingPage(web.LandingConfig{
			Name:        "proxyhealth",
			Description: "Tells whether Service traffic on this node is silently breaking, and why",
			Version:     version.Info(),
			// The toolkit prefixes every link with the route prefix, so the external
			// documentation links are in ExtraHTML.
			Links:     links,
			ExtraHTML: status.String(),
			ExtraCSS:  landingCSS,
			// The toolkit shows its heap and CPU profile links unless told otherwise; they
			// are served only with --web.enable-pprof.
			Profiling: strconv.FormatBool(pprof),
		})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if judged.Len() == 0 {
			page.ServeHTTP(w, r)
			return
		}
		// The verdict opens the page: it goes first in the toolkit page's main element.
		rec := httptest.NewRecorder()
		page.ServeHTTP(rec, r)
		body := rec.Body.String()
		if rec.Code == http.StatusOK {
			if i := strings.Index(body, "<main>"); i >= 0 {
				i += len("<main>")
				body = body[:i] + judged.String() + body[i:]
			}
		}
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		w.Write([]byte(body))
	})
}
