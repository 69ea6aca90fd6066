//go:build e2e

package e2e

import (
	"syscall"
	"testing"
	"time"
)

const listErrors = "proxyhealth_kubeproxy_list_errors_total"

// kubeProxyExporterArgs points the exporter at the lab kube-proxy's log (plain klog text on its
// stderr) and polls kube-proxy quickly.
func kubeProxyExporterArgs(cp *ControlPlane) []string {
	return []string{
		"--kubeproxy.log-path=" + cp.KubeProxy.log,
		"--kubeproxy.log-poll-interval=200ms",
		"--kubeproxy.poll-interval=500ms",
	}
}

// testKubeProxyLogErrors: incident 3's first visible trace was kube-proxy's log. With its API
// connection dead, the real kube-proxy v1.36 logs "watch ended with error ... http2: client
// connection lost" once per informer while its health endpoint stays green; the exporter
// counts each by resource, and says kube-proxy is up and (by its own verdict) healthy.
func testKubeProxyLogErrors(t *testing.T, cp *ControlPlane, e *Exporter) {
	before := e.Scrape(t)
	watch := func(resource string) map[string]string {
		return map[string]string{"resource": resource, "verb": "watch"}
	}
	resources := []string{"services", "endpointslices", "nodes"}
	base := map[string]float64{}
	for _, r := range resources {
		base[r] = before.Sum(listErrors, watch(r))
	}
	baseList := before.Sum(listErrors, map[string]string{"verb": "list"})

	cp.Blackhole()
	defer cp.Heal()
	s := e.Poll(t, 30*time.Second, "a watch error counted for services, endpointslices and nodes", nil, func(s Scrape) (bool, string) {
		for _, r := range resources {
			if s.Sum(listErrors, watch(r)) < base[r]+1 {
				return false, s.Series(listErrors)
			}
		}
		return true, ""
	})
	// The green lie of incident 3: kube-proxy answers and calls itself healthy.
	checkValue(t, s, "proxyhealth_kubeproxy_up", nil, 1)
	checkValue(t, s, "proxyhealth_kubeproxy_healthy", nil, 1)
	if _, ok := s["proxyhealth_kubeproxy_last_list_error_timestamp_seconds"]; !ok {
		t.Errorf("no proxyhealth_kubeproxy_last_list_error_timestamp_seconds after watch errors")
	}
	// One line per informer and connection loss: exactly one each, and no list failure (the
	// re-lists hang in the black-hole rather than fail).
	time.Sleep(time.Second)
	s = e.Scrape(t)
	for _, r := range resources {
		if got := s.Sum(listErrors, watch(r)) - base[r]; got != 1 {
			t.Errorf("%s watch errors counted: +%g, want +1 (one log line per informer)\n%s", r, got, s.Series(listErrors))
		}
	}
	if got := s.Sum(listErrors, map[string]string{"verb": "list"}) - baseList; got != 0 {
		t.Errorf("list errors counted: +%g, want 0\n%s", got, s.Series(listErrors))
	}
}

// testKubeProxyStopped: kube-proxy gone is a clear, quiet degradation: up 0, while every
// collector, the kubeproxy one included, keeps reporting success.
func testKubeProxyStopped(t *testing.T, cp *ControlPlane, e *Exporter) {
	if err := cp.KubeProxy.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-cp.KubeProxy.done:
	case <-time.After(10 * time.Second):
		t.Fatal("kube-proxy did not stop")
	}
	if !e.WaitValue(t, 10*time.Second, "proxyhealth_kubeproxy_up", nil, 0) {
		return
	}
	s := e.Scrape(t)
	for _, c := range []string{"kubeproxy", "rules", "conntrack", "node"} {
		checkValue(t, s, success, map[string]string{"collector": c}, 1)
	}
}
