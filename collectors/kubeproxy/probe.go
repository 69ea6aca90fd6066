package kubeproxy

import (
	"context"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// kube-proxy's own metric names read here (pkg/proxy/metrics in Kubernetes).
const (
	kpLastSync          = "kubeproxy_sync_proxy_rules_last_timestamp_seconds"
	kpLastQueued        = "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds"
	kpEndpointsPending  = "kubeproxy_sync_proxy_rules_endpoint_changes_pending"
	kpServicesPending   = "kubeproxy_sync_proxy_rules_service_changes_pending"
	kpIPTablesRestore   = "kubeproxy_sync_proxy_rules_iptables_restore_failures_total"
	kpNFTablesSync      = "kubeproxy_sync_proxy_rules_nftables_sync_failures_total"
	kpInvalidDropped    = "kubeproxy_iptables_ct_state_invalid_dropped_packets_total"
	kpEndpointChanges   = "kubeproxy_sync_proxy_rules_endpoint_changes_total"
	kpServiceChanges    = "kubeproxy_sync_proxy_rules_service_changes_total"
	kpFullSyncs         = "kubeproxy_sync_full_proxy_rules_duration_seconds_count"
	kpBuildInfo         = "kubernetes_build_info"      // component-base's, with the git_version label
	kpStartTime         = "process_start_time_seconds" // its process collector's
	maxMetricsBodyBytes = 32 << 20
)

// probeResult is one poll of kube-proxy's metrics and health endpoints.
type probeResult struct {
	at time.Time

	up       bool   // the metrics endpoint answered 200 with a readable exposition
	upReason string // why not, for the log
	healthy  bool
	// healthPath is the health path that gave the verdict (/livez, or /healthz on versions
	// without /livez); healthReason says why it is not healthy.
	healthPath     string
	healthReason   string
	healthAnswered bool

	// From the metrics, per IP family folded to the worst one; the has* fields say whether
	// kube-proxy exported the metric at all.
	lastSync    time.Time // the oldest family's last applied sync
	hasLastSync bool
	// newestSync is the newest family's last applied sync: it moves at every sync of any
	// family, where lastSync stays with a family that has not synced (a dual-stack
	// kube-proxy applies an IPv4 EndpointSlice change in its IPv4 proxier alone).
	newestSync          time.Time
	pendingSince        time.Time // the oldest queued change not yet applied; zero when none
	endpointsPending    float64
	servicesPending     float64
	hasEndpointsPending bool
	hasServicesPending  bool
	restoreFailures     float64 // 0 when kube-proxy has not failed yet (it exports no series then)
	// iptablesRestoreFailures (iptables and IPVS mode) and nftablesSyncFailures (nftables
	// mode) are restoreFailures' two parts.
	iptablesRestoreFailures, nftablesSyncFailures float64
	// families is each IP family's last applied sync and failed syncs. A dual-stack kube-proxy
	// runs a proxier per family, and one family's syncs can keep failing while the other's
	// apply: an IPv6 sync applied says nothing of the IPv4 rules.
	families    [maxIPFamilies]familySyncs
	numFamilies int
	// started is kube-proxy's process start (process_start_time_seconds); zero when unknown.
	started           time.Time
	invalidDropped    float64
	hasInvalidDropped bool
	changes           changeCounts
	scan              metricsScan // what the scan of the metrics skipped or left out
	// version is the git_version of kube-proxy's kubernetes_build_info, as it reports it;
	// empty when it exports none.
	version string
}

// familySyncs is one IP family's syncs as kube-proxy counts them (its ip_family label; "" on
// a kube-proxy that labels none).
type familySyncs struct {
	name     string
	last     time.Time // the last applied sync; zero when none since kube-proxy started
	failures float64   // failed syncs: iptables-restore runs and nftables transactions
}

// prober polls kube-proxy's HTTP endpoints.
type prober struct {
	client     *http.Client
	metricsURL string
	healthURL  string
}

func newProber(metricsURL, healthURL string, timeout time.Duration) *prober {
	return &prober{
		client: &http.Client{
			Timeout: timeout,
			Transport: &http.Transport{
				Proxy:               nil, // kube-proxy is on this node: never through an HTTP proxy
				MaxIdleConns:        2,
				IdleConnTimeout:     30 * time.Second,
				TLSHandshakeTimeout: timeout,
			},
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
		metricsURL: metricsURL,
		healthURL:  healthURL,
	}
}

func (p *prober) probe(ctx context.Context, now time.Time) probeResult {
	res := probeResult{at: now}
	p.probeMetrics(ctx, &res)
	p.probeHealth(ctx, &res)
	return res
}

func (p *prober) get(ctx context.Context, u string, accept string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	return p.client.Do(req)
}

// acceptText asks for the Prometheus text format 0.0.4, which kube-proxy serves when asked
// (OpenMetrics text is read too, should it answer that anyway).
const acceptText = "text/plain; version=0.0.4; charset=utf-8"

func (p *prober) probeMetrics(ctx context.Context, res *probeResult) {
	resp, err := p.get(ctx, p.metricsURL, acceptText)
	if err != nil {
		res.upReason = err.Error()
		return
	}
	defer drain(resp)
	if resp.StatusCode != http.StatusOK {
		res.upReason = fmt.Sprintf("GET %s: %s", p.metricsURL, resp.Status)
		return
	}
	var m kpMetrics
	scan, err := scanMetrics(resp.Body, maxMetricsBodyBytes, metricsLineBytes, isOpenMetrics(resp.Header.Get("Content-Type")), &m)
	if err != nil {
		res.upReason = fmt.Sprintf("read the metrics of %s: %v", p.metricsURL, err)
		return
	}
	res.up = true
	res.scan = scan
	m.apply(res)
}

// syncTool names the tool whose failures kube-proxy counted: iptables-restore (iptables and
// IPVS mode) or nft (nftables mode); "" when it counted none.
func (res *probeResult) syncTool() string {
	switch {
	case res.iptablesRestoreFailures > 0:
		return toolIPTablesRestore
	case res.nftablesSyncFailures > 0:
		return toolNFT
	}
	return ""
}

func isOpenMetrics(contentType string) bool {
	mediaType, _, err := mime.ParseMediaType(contentType)
	return err == nil && mediaType == "application/openmetrics-text"
}

func secondsTime(s float64) time.Time {
	if s <= 0 {
		return time.Time{}
	}
	return time.Unix(0, int64(s*1e9))
}

// probeHealth asks /livez, and /healthz when /livez answers 404 (older kube-proxy versions have
// no /livez). /healthz also answers 503 while the node is being deleted or carries
// the cluster autoscaler's ToBeDeleted taint, which is not a kube-proxy fault; /livez does not.
func (p *prober) probeHealth(ctx context.Context, res *probeResult) {
	if p.healthURL == "" {
		return
	}
	u := p.healthURL
	code, err := p.status(ctx, u)
	if parsed, perr := url.Parse(u); err == nil && perr == nil && code == http.StatusNotFound && strings.HasSuffix(parsed.Path, "/livez") {
		parsed.Path = strings.TrimSuffix(parsed.Path, "livez") + "healthz"
		u = parsed.String()
		code, err = p.status(ctx, u)
	}
	res.healthPath, res.healthAnswered = pathOf(u), err == nil
	switch {
	case err != nil:
		res.healthReason = err.Error()
	case code != http.StatusOK:
		res.healthReason = fmt.Sprintf("GET %s: %d %s", u, code, http.StatusText(code))
	default:
		res.healthy = true
	}
}

func (p *prober) status(ctx context.Context, u string) (int, error) {
	resp, err := p.get(ctx, u, "")
	if err != nil {
		return 0, err
	}
	drain(resp)
	return resp.StatusCode, nil
}

func pathOf(u string) string {
	parsed, err := url.Parse(u)
	if err != nil {
		return u
	}
	return parsed.Path
}

func drain(resp *http.Response) {
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
}
