package exporter

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"time"

	"github.com/alecthomas/kingpin/v2"

	"github.com/proxyhealth/proxyhealth/internal/periodic"
	"github.com/proxyhealth/proxyhealth/internal/verdict"
)

// statusConfig is the verdict's settings on the running exporter.
type statusConfig struct {
	Window time.Duration
}

func addStatusFlags(app *kingpin.Application) *statusConfig {
	c := &statusConfig{}
	app.Flag("status.window", "The span the verdict (/status, the landing page) judges counters over: INVALID packets, failed inserts, drops, unreplied flows and kube-proxy's list/watch failures are counted over the last this long.").
		Default("10m").DurationVar(&c.Window)
	return c
}

// kubeProxyDownAfter is how long kube-proxy must not have answered before the running exporter
// says it is down: a restart, or the node's start-up, takes seconds.
const kubeProxyDownAfter = time.Minute

// status keeps the samples the verdict needs (one every interval over the window) and judges on
// demand, with a fresh sample: what /status and the landing page show is current.
type status struct {
	src      *factSources
	window   time.Duration
	interval time.Duration

	mu      sync.Mutex
	samples []factSample // oldest first, within window
}

func newStatus(src *factSources, window time.Duration) *status {
	// About 40 samples per window, at most one every 15 seconds, at least one a second.
	interval := min(max(window/40, time.Second), 15*time.Second)
	return &status{src: src, window: window, interval: interval}
}

// run samples every interval until ctx is done.
func (s *status) run(ctx context.Context) {
	periodic.Every(ctx, s.interval, func() { s.record(s.src.sample()) })
}

func (s *status) record(fs factSample) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.samples = append(s.samples, fs)
	// Keep the samples within the window, and the one just before it as the base.
	cut := 0
	for cut+1 < len(s.samples) && fs.at.Sub(s.samples[cut+1].at) >= s.window {
		cut++
	}
	s.samples = append(s.samples[:0], s.samples[cut:]...)
}

// Report judges the node now: the samples kept, and one taken now.
func (s *status) Report() verdict.Report {
	now := s.src.sample()
	s.mu.Lock()
	samples := make([]factSample, 0, len(s.samples)+1)
	samples = append(samples, s.samples...)
	s.mu.Unlock()
	samples = append(samples, now)
	return verdict.Evaluate(s.src.input(samples, inputOptions{minDown: kubeProxyDownAfter}))
}

// ServeHTTP answers GET /status with the report as JSON (200 whatever the verdict).
func (s *status) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	serveReport(w, r, s.Report())
}

func serveReport(w http.ResponseWriter, r *http.Request, rep verdict.Report) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.Write(append(b, '\n'))
}
