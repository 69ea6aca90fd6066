package exporter

import (
	"bytes"
	"html/template"
	"net/http"
	"time"

	"github.com/prometheus/common/version"
	"github.com/prometheus/exporter-toolkit/web"
)

var statusTemplate = template.Must(template.New("status").Parse(`
<h2>Collectors</h2>
<table>
<tr><th>collector</th><th>state</th><th>since</th><th>last update</th><th>why</th></tr>
{{range .}}<tr><td>{{.Name}}</td><td>{{if .OK}}ok{{else}}<b>failing</b>{{end}}</td><td>{{if not .Since.IsZero}}{{.Since.Format "2006-01-02T15:04:05Z07:00"}}{{end}}</td><td>{{.Duration}}</td><td>{{.Err}}</td></tr>
{{end}}</table>
<p>A failing collector keeps the exporter and every other collector serving; see
<code>proxyhealth_collector_success</code> and the log for the reason.</p>
`))

// landingPage renders the exporter-toolkit landing page with the collectors' current state, so
// an operator opening the page sees at once what this node can and cannot be checked for.
func landingPage(telemetryPath string, pprof bool, set *collectorSet) http.Handler {
	links := []web.LandingLinks{
		{Address: telemetryPath, Text: "Metrics"},
		{Address: "https://github.com/proxyhealth/proxyhealth#metrics", Text: "Metrics reference"},
	}
	if pprof {
		links = append(links, web.LandingLinks{Address: "/debug/pprof/", Text: "Profiler"})
	}
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
		page, err := web.NewLandingPage(web.LandingConfig{
			Name:        "proxyhealth",
			Description: "Tells whether Service traffic on this node is silently breaking, and why",
			Version:     version.Info(),
			Links:       links,
			ExtraHTML:   status.String(),
			ExtraCSS:    "table { border-collapse: collapse } td, th { padding: 2px 8px; text-align: left }",
		})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		page.ServeHTTP(w, r)
	})
}
