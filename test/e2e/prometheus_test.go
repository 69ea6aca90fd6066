//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/proxyhealth/proxyhealth/internal/testsupport/netnsdial"
	"github.com/proxyhealth/proxyhealth/internal/testsupport/prereq"
)

// A real Prometheus (and optionally Alertmanager) in a lab's node namespace, from Debian's
// `prometheus` and `prometheus-alertmanager` packages, started by hand on the namespace's
// loopback. The namespace is the test's own, so the ports are fixed.
const (
	prometheusAddr   = "127.0.0.1:19090"
	alertmanagerAddr = "127.0.0.1:19093"
	webhookAddr      = "127.0.0.1:19094" // the test's own receiver, listening in the namespace

	prometheusBinary   = "prometheus"
	alertmanagerBinary = "prometheus-alertmanager"
)

// requirePrometheus skips the test when Prometheus or Alertmanager is not installed, or fails
// it when the labs must run ($PROXYHEALTH_REQUIRE_KUBE, set by .ci/run).
func requirePrometheus(t *testing.T) {
	t.Helper()
	requireLab(t)
	for _, bin := range []string{prometheusBinary, alertmanagerBinary, "promtool"} {
		if _, err := exec.LookPath(bin); err != nil {
			msg := fmt.Sprintf("%s not found; install: apt-get install -y prometheus prometheus-alertmanager", bin)
			if os.Getenv(requireKubeEnv) != "" {
				t.Fatalf("%s (%s is set)", msg, requireKubeEnv)
			}
			prereq.Skip(t, msg)
		}
	}
}

// PrometheusOptions shape StartPrometheus.
type PrometheusOptions struct {
	// Targets are host:port addresses in the lab's node namespace, scraped at /metrics as
	// one job.
	Targets []string
	// Job is the scrape job's name; default "proxyhealth" (what the shipped rules expect).
	Job string
	// Node is the `node` label given to every target (what the PodMonitor's relabelling gives
	// in a cluster); default the lab's node name.
	Node string
	// Interval is the scrape and rule evaluation interval; default 1s.
	Interval time.Duration
	// RuleFiles are rule files to load.
	RuleFiles []string
	// Alertmanager starts an Alertmanager whose only receiver is a webhook of the test's
	// own, and sends Prometheus's alerts to it.
	Alertmanager bool
	// CredentialsFile is a file whose content Prometheus sends as a bearer token with every
	// scrape (authorization: credentials_file), as a Prometheus in a cluster sends its
	// ServiceAccount's token.
	CredentialsFile string
}

// Prometheus is a running Prometheus in a lab's node namespace.
type Prometheus struct {
	t      *testing.T
	Lab    *Lab
	URL    string // http://127.0.0.1:19090, reachable from the namespace only (see client)
	Dir    string
	Proc   *proc
	client *http.Client
	// Alertmanager is set when PrometheusOptions.Alertmanager was.
	Alertmanager *Alertmanager
}

// StartPrometheus starts Prometheus (and Alertmanager when asked) in l's node namespace and
// waits until it is ready and has scraped every target once.
func StartPrometheus(t *testing.T, l *Lab, opts PrometheusOptions) *Prometheus {
	t.Helper()
	requirePrometheus(t)
	if opts.Job == "" {
		opts.Job = "proxyhealth"
	}
	if opts.Node == "" {
		opts.Node = labNodeName
	}
	if opts.Interval == 0 {
		opts.Interval = time.Second
	}
	start := time.Now()
	p := &Prometheus{t: t, Lab: l, URL: "http://" + prometheusAddr, Dir: t.TempDir(), client: netnsdial.HTTPClient(l.Node, 10*time.Second)}
	if opts.Alertmanager {
		p.Alertmanager = startAlertmanager(t, l)
	}

	var cfg strings.Builder
	fmt.Fprintf(&cfg, "global:\n  scrape_interval: %s\n  scrape_timeout: %s\n  evaluation_interval: %s\n",
		model.Duration(opts.Interval), model.Duration(opts.Interval), model.Duration(opts.Interval))
	if len(opts.RuleFiles) > 0 {
		cfg.WriteString("rule_files:\n")
		for _, f := range opts.RuleFiles {
			fmt.Fprintf(&cfg, "  - %q\n", f)
		}
	}
	if p.Alertmanager != nil {
		fmt.Fprintf(&cfg, "alerting:\n  alertmanagers:\n    - static_configs:\n        - targets: [%q]\n", alertmanagerAddr)
	}
	fmt.Fprintf(&cfg, "scrape_configs:\n  - job_name: %q\n", opts.Job)
	if opts.CredentialsFile != "" {
		fmt.Fprintf(&cfg, "    authorization:\n      credentials_file: %q\n", opts.CredentialsFile)
	}
	cfg.WriteString("    static_configs:\n      - targets:\n")
	for _, target := range opts.Targets {
		fmt.Fprintf(&cfg, "          - %q\n", target)
	}
	fmt.Fprintf(&cfg, "        labels:\n          node: %q\n", opts.Node)
	config := filepath.Join(p.Dir, "prometheus.yml")
	if err := os.WriteFile(config, []byte(cfg.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("promtool", "check", "config", config).CombinedOutput(); err != nil {
		t.Fatalf("promtool check config: %v\n%s\n%s", err, out, cfg.String())
	}

	p.Proc = l.Start(l.Node, "prometheus", prometheusBinary,
		"--config.file="+config,
		"--storage.tsdb.path="+filepath.Join(p.Dir, "data"),
		"--web.listen-address="+prometheusAddr,
		// Firing alerts are re-sent every second, so that Alertmanager sees them resolve as
		// soon as Prometheus does.
		"--rules.alert.resend-delay=1s",
		"--log.level=info",
	)
	waitFor(t, 30*time.Second, "Prometheus ready", func() (bool, string) {
		if p.Proc.Exited() {
			b, _ := os.ReadFile(p.Proc.log)
			t.Fatalf("prometheus exited at start:\n%s", b)
		}
		code, body, err := p.get("/-/ready")
		return err == nil && code == http.StatusOK, fmt.Sprint(code, body, err)
	})
	if len(opts.Targets) > 0 {
		p.WaitQuery(30*time.Second, fmt.Sprintf("count(up{job=%q} == 1)", opts.Job), func(v model.Vector) bool {
			return len(v) == 1 && int(v[0].Value) == len(opts.Targets)
		})
	}
	t.Logf("Prometheus ready and scraping in %s", time.Since(start).Round(time.Millisecond))
	return p
}

func (p *Prometheus) get(path string) (int, string, error) {
	resp, err := p.client.Get(p.URL + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// apiResponse is the envelope of Prometheus's HTTP API.
type apiResponse struct {
	Status    string          `json:"status"`
	Data      json.RawMessage `json:"data"`
	ErrorType string          `json:"errorType"`
	Error     string          `json:"error"`
}

func (p *Prometheus) api(path string, params url.Values) (json.RawMessage, error) {
	code, body, err := p.get(path + "?" + params.Encode())
	if err != nil {
		return nil, err
	}
	var r apiResponse
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		return nil, fmt.Errorf("%s: HTTP %d: %v: %s", path, code, err, body)
	}
	if r.Status != "success" {
		return nil, fmt.Errorf("%s: %s: %s", path, r.ErrorType, r.Error)
	}
	return r.Data, nil
}

// Query evaluates an instant vector expression now.
func (p *Prometheus) Query(expr string) (model.Vector, error) {
	data, err := p.api("/api/v1/query", url.Values{"query": {expr}})
	if err != nil {
		return nil, err
	}
	var res struct {
		ResultType string          `json:"resultType"`
		Result     json.RawMessage `json:"result"`
	}
	if err := json.Unmarshal(data, &res); err != nil {
		return nil, err
	}
	if res.ResultType != "vector" {
		return nil, fmt.Errorf("query %q: result type %s, want vector", expr, res.ResultType)
	}
	var v model.Vector
	if err := json.Unmarshal(res.Result, &v); err != nil {
		return nil, err
	}
	return v, nil
}

// MustQuery is Query that fails the test on error.
func (p *Prometheus) MustQuery(expr string) model.Vector {
	p.t.Helper()
	v, err := p.Query(expr)
	if err != nil {
		p.t.Fatal(err)
	}
	return v
}

// WaitQuery evaluates expr every 200ms until cond holds, for at most timeout, and returns
// the last result; on timeout the test fails and stops.
func (p *Prometheus) WaitQuery(timeout time.Duration, expr string, cond func(model.Vector) bool) model.Vector {
	p.t.Helper()
	var v model.Vector
	waitFor(p.t, timeout, "query "+expr, func() (bool, string) {
		var err error
		v, err = p.Query(expr)
		if err != nil {
			return false, err.Error()
		}
		return cond(v), v.String()
	})
	return v
}

// PromAlert is one alert as Prometheus's /api/v1/alerts lists it.
type PromAlert struct {
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
	State       string            `json:"state"` // pending or firing
	ActiveAt    time.Time         `json:"activeAt"`
	Value       string            `json:"value"`
}

// Alerts lists Prometheus's pending and firing alerts.
func (p *Prometheus) Alerts() ([]PromAlert, error) {
	data, err := p.api("/api/v1/alerts", nil)
	if err != nil {
		return nil, err
	}
	var res struct {
		Alerts []PromAlert `json:"alerts"`
	}
	err = json.Unmarshal(data, &res)
	return res.Alerts, err
}

// Alertmanager is a running Alertmanager (clustering off) whose one route sends every alert
// group, firing and resolved, to Webhook within about a second.
type Alertmanager struct {
	URL     string
	Proc    *proc
	Webhook *Webhook
}

func startAlertmanager(t *testing.T, l *Lab) *Alertmanager {
	t.Helper()
	dir := t.TempDir()
	am := &Alertmanager{URL: "http://" + alertmanagerAddr, Webhook: startWebhook(t, l.Node, webhookAddr)}
	config := filepath.Join(dir, "alertmanager.yml")
	cfg := fmt.Sprintf(`route:
  receiver: webhook
  group_by: [alertname, node]
  group_wait: 1s
  group_interval: 1s
  repeat_interval: 1m
receivers:
  - name: webhook
    webhook_configs:
      - url: http://%s/alerts
        send_resolved: true
`, webhookAddr)
	if err := os.WriteFile(config, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	am.Proc = l.Start(l.Node, "alertmanager", alertmanagerBinary,
		"--config.file="+config,
		"--storage.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+alertmanagerAddr,
		"--cluster.listen-address=",
		"--log.level=info",
	)
	client := netnsdial.HTTPClient(l.Node, 5*time.Second)
	waitFor(t, 30*time.Second, "Alertmanager ready", func() (bool, string) {
		if am.Proc.Exited() {
			b, _ := os.ReadFile(am.Proc.log)
			t.Fatalf("alertmanager exited at start:\n%s", b)
		}
		resp, err := client.Get(am.URL + "/-/ready")
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status
	})
	return am
}

// WebhookMessage is Alertmanager's webhook payload (version 4).
type WebhookMessage struct {
	Receiver          string            `json:"receiver"`
	Status            string            `json:"status"` // firing or resolved
	Alerts            []WebhookAlert    `json:"alerts"`
	GroupLabels       map[string]string `json:"groupLabels"`
	CommonLabels      map[string]string `json:"commonLabels"`
	CommonAnnotations map[string]string `json:"commonAnnotations"`
	GroupKey          string            `json:"groupKey"`
	Received          time.Time         `json:"-"` // when the webhook got it
}

// WebhookAlert is one alert of a webhook message.
type WebhookAlert struct {
	Status      string            `json:"status"` // firing or resolved
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
	StartsAt    time.Time         `json:"startsAt"`
	EndsAt      time.Time         `json:"endsAt"`
}

// Webhook is an HTTP receiver of the test's own that records Alertmanager's notifications.
// It runs in the test process; its listening socket is opened in the lab's node namespace, so
// Alertmanager reaches it on that namespace's loopback.
type Webhook struct {
	mu       sync.Mutex
	messages []WebhookMessage
	errs     []string
}

func startWebhook(t *testing.T, ns, addr string) *Webhook {
	t.Helper()
	ln, err := netnsdial.Listen(ns, "tcp", addr)
	if err != nil {
		t.Fatalf("webhook listener in %s: %v", ns, err)
	}
	w := &Webhook{}
	srv := &http.Server{Handler: http.HandlerFunc(w.serve), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		if t.Failed() {
			t.Logf("--- webhook notifications ---\n%s", w.String())
		}
	})
	return w
}

func (w *Webhook) serve(rw http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	var m WebhookMessage
	if err == nil {
		err = json.Unmarshal(body, &m)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil {
		w.errs = append(w.errs, fmt.Sprintf("%v: %s", err, body))
		http.Error(rw, err.Error(), http.StatusBadRequest)
		return
	}
	m.Received = time.Now()
	w.messages = append(w.messages, m)
}

// Messages returns the notifications received so far, oldest first.
func (w *Webhook) Messages() []WebhookMessage {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]WebhookMessage(nil), w.messages...)
}

// String renders every notification for failure messages.
func (w *Webhook) String() string {
	var b strings.Builder
	for _, m := range w.Messages() {
		fmt.Fprintf(&b, "%s %s group %v:\n", m.Received.Format("15:04:05.000"), m.Status, m.GroupLabels)
		for _, a := range m.Alerts {
			fmt.Fprintf(&b, "  %s %v\n    %v\n", a.Status, a.Labels, a.Annotations)
		}
	}
	w.mu.Lock()
	for _, e := range w.errs {
		fmt.Fprintf(&b, "undecodable: %s\n", e)
	}
	w.mu.Unlock()
	return b.String()
}

// WaitAlert waits until a notification carries an alert with the given status whose labels
// include every pair of labels, and returns it with the time it was received.
func (w *Webhook) WaitAlert(t *testing.T, timeout time.Duration, status string, labels map[string]string) (WebhookAlert, time.Time) {
	t.Helper()
	var found WebhookAlert
	var at time.Time
	waitFor(t, timeout, fmt.Sprintf("a %s notification of %v", status, labels), func() (bool, string) {
		for _, m := range w.Messages() {
			for _, a := range m.Alerts {
				if a.Status == status && containsLabels(a.Labels, labels) {
					found, at = a, m.Received
					return true, ""
				}
			}
		}
		return false, "\n" + w.String()
	})
	return found, at
}

// Alerts returns every alert of every notification whose labels include labels.
func (w *Webhook) Alerts(labels map[string]string) []WebhookAlert {
	var out []WebhookAlert
	for _, m := range w.Messages() {
		for _, a := range m.Alerts {
			if containsLabels(a.Labels, labels) {
				out = append(out, a)
			}
		}
	}
	return out
}

func containsLabels(have, want map[string]string) bool {
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}
