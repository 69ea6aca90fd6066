package exporter

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/proxyhealth/proxyhealth/collectors/conntrack"
	"github.com/proxyhealth/proxyhealth/collectors/kubeproxy"
	"github.com/proxyhealth/proxyhealth/collectors/rules"
	"github.com/proxyhealth/proxyhealth/exporter/diagnose"
	"github.com/proxyhealth/proxyhealth/internal/cluster"
	"github.com/proxyhealth/proxyhealth/internal/verdict"
)

// fakeDiagnosis looks at h: the window passes on h's clock, kube-proxy's log is scan.
func fakeDiagnosis(h *healthyNode, cfg diagnose.Config, scan kubeproxy.LogScan) *diagnose.Diagnosis[factSample] {
	src := h.sources()
	scanLog := func(since time.Time) kubeproxy.LogScan {
		return scan
	}
	return &diagnose.Diagnosis[factSample]{
		Config:        cfg,
		Sample:        src.sample,
		Input:         func(first, last factSample) verdict.Input { return diagnosisInput(src, cfg, first, last, scanLog) },
		Sleep:         func(_ context.Context, d time.Duration) error { h.now = h.now.Add(d); return nil },
		PollKubeProxy: func(context.Context) {},
		Service: func(namespace, name string) ([]rules.PortEndpoints, error) {
			if namespace != "kube-system" || name != "kube-dns" {
				return nil, nil
			}
			ap := netip.MustParseAddrPort
			return []rules.PortEndpoints{{
				Name:       cluster.ServicePortName{Namespace: "kube-system", Name: "kube-dns", Port: "dns-tcp", Protocol: "TCP"},
				Port:       53,
				ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10")},
				Expected:   []netip.AddrPort{ap("10.244.1.4:53"), ap("10.244.2.7:53"), ap("10.244.2.8:53")},
				Programmed: []netip.AddrPort{ap("10.244.1.4:53"), ap("10.244.1.5:53")},
				Chains:     []string{"KUBE-SVC-ERIFXISQEP7F7OF4"},
			}}, nil
		},
	}
}

var diagCfg = diagnose.Config{Window: 15 * time.Second, Output: "text", LogSince: time.Hour, SyncTimeout: time.Second}

func logScanOf(resource, verb string, n uint64, last time.Time) kubeproxy.LogScan {
	return kubeproxy.LogScan{Files: []string{"/var/log/pods/kube-system_kube-proxy-x_1/kube-proxy/0.log"},
		ListErrors: []kubeproxy.ListErrors{{Resource: resource, Verb: verb, Count: n}}, LastListError: last}
}

// Incident 3 in one look: stale_rules for kube-dns, explained by the watch failure read back
// from kube-proxy's log, exit code 2; the Service side by side with --service.
func TestDiagnoseStaleRules(t *testing.T) {
	h := newHealthyNode()
	h.incident3()
	h.kp.st.ListErrors = nil // the follower is not used: the log is read back
	h.ct.flows.Unreplied = []conntrack.UnrepliedSeries{{Namespace: "kube-system", Name: "kube-dns", Port: 53, Protocol: "tcp", Reason: "remote_endpoint", Open: 2}}
	cfg := diagCfg
	cfg.Service = "kube-system/kube-dns"
	d := fakeDiagnosis(h, cfg, logScanOf("endpointslices", "watch", 1, t0.Add(-30*time.Minute)))
	res, err := d.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if diagnose.ExitCode(res.Report) != diagnose.ExitCritical || res.Verdict != verdict.CriticalFound || len(res.Findings) != 1 || res.Findings[0].Cause != verdict.StaleRules {
		t.Fatalf("result %+v", res.Report)
	}
	if res.WindowSeconds != 15 {
		t.Errorf("window %v, want 15s", res.WindowSeconds)
	}
	ev := res.Findings[0].Evidence.(*verdict.StaleRulesEvidence)
	if ev.KubeProxy.ListErrorsSpanSeconds != 3600 || len(ev.KubeProxy.ListErrors) != 1 || ev.KubeProxy.ListErrors[0].Recent != 1 ||
		ev.UnrepliedFlows == nil || ev.UnrepliedFlows.Open != 2 {
		t.Errorf("evidence %+v kube-proxy %+v flows %+v", ev, ev.KubeProxy, ev.UnrepliedFlows)
	}

	var text bytes.Buffer
	if err := res.Write(&text, "text"); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"node worker-3: critical (1 critical), judged over 15s\n",
		"CRITICAL stale_rules kube-system/kube-dns:dns-tcp (53/tcp)\n",
		"because kube-proxy's list/watch of the API failed (endpointslices watch 1; last at 2025-03-04T02:30:00Z)",
		"\nservice kube-system/kube-dns:dns-tcp (53/tcp), cluster IP 10.96.0.10: 3 endpoints in the API for this node, 2 programmed (now 2 missing, 1 stale)\n",
		"  endpoint       API  rules\n",
		"  10.244.1.4:53  yes  yes\n",
		"  10.244.1.5:53  -    yes    stale\n",
		"  10.244.2.7:53  yes  -      missing\n",
		"  chains: KUBE-SVC-ERIFXISQEP7F7OF4\n",
		"  unreplied flows, remote_endpoint: 0 ended unreplied in the last 15s, 2 waiting for a reply now\n",
	} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text lacks %q:\n%s", want, text.String())
		}
	}

	var js bytes.Buffer
	if err := res.Write(&js, "json"); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Node         string            `json:"node"`
		Verdict      string            `json:"verdict"`
		Findings     []json.RawMessage `json:"findings"`
		NotChecked   []json.RawMessage `json:"not_checked"`
		ServicePorts []struct {
			Service    verdict.Service `json:"service"`
			Expected   []string        `json:"expected"`
			Programmed []string        `json:"programmed"`
			Missing    []string        `json:"missing"`
			Stale      []string        `json:"stale"`
		} `json:"service_ports"`
	}
	if err := json.Unmarshal(js.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Node != "worker-3" || doc.Verdict != "critical" || len(doc.Findings) != 1 || doc.NotChecked == nil || len(doc.ServicePorts) != 1 {
		t.Fatalf("json %s", js.String())
	}
	sp := doc.ServicePorts[0]
	if sp.Service.PortName != "dns-tcp" || strings.Join(sp.Missing, ",") != "10.244.2.7:53,10.244.2.8:53" || strings.Join(sp.Stale, ",") != "10.244.1.5:53" {
		t.Errorf("service port %+v", sp)
	}
	// The same schema as /status: a /status client reads diagnose's JSON.
	var rep verdict.Report
	if err := json.Unmarshal(js.Bytes(), &rep); err != nil || rep.Findings[0].Cause != verdict.StaleRules {
		t.Errorf("as a /status report: %v %+v", err, rep)
	}
}

func TestDiagnoseExitCodes(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(h *healthyNode, d *diagnose.Diagnosis[factSample])
		want   int
	}{
		{"healthy", func(*healthyNode, *diagnose.Diagnosis[factSample]) {}, diagnose.ExitNoFinding},
		{"a warning", func(h *healthyNode, _ *diagnose.Diagnosis[factSample]) {
			h.kp.st.PendingSince = t0.Add(-5 * time.Minute)
		}, diagnose.ExitWarnings},
		{"kube-proxy down at both ends of the window", func(h *healthyNode, _ *diagnose.Diagnosis[factSample]) {
			h.kp.st.Up, h.kp.st.UpReason = false, "connection refused"
		}, diagnose.ExitWarnings},
		{"a critical finding", func(h *healthyNode, _ *diagnose.Diagnosis[factSample]) { h.incident3() }, diagnose.ExitCritical},
		{"not checked", func(h *healthyNode, _ *diagnose.Diagnosis[factSample]) {
			h.ct.err = errors.New("operation not permitted (needs CAP_NET_ADMIN)")
		}, diagnose.ExitCannotDiagnose},
		{"not checked, and a warning", func(h *healthyNode, _ *diagnose.Diagnosis[factSample]) {
			h.ct.err = errors.New("operation not permitted (needs CAP_NET_ADMIN)")
			h.kp.st.PendingSince = t0.Add(-5 * time.Minute)
		}, diagnose.ExitCannotDiagnose},
		{"not checked, and a critical finding", func(h *healthyNode, _ *diagnose.Diagnosis[factSample]) {
			h.ct.err = errors.New("operation not permitted (needs CAP_NET_ADMIN)")
			h.incident3()
		}, diagnose.ExitCritical},
		{"the drift could not be confirmed over the window", func(h *healthyNode, d *diagnose.Diagnosis[factSample]) {
			d.DriftReady = func() time.Time { return t0 }
			d.DriftSettled = func(context.Context, time.Time) error {
				return errors.New("the API view could not be confirmed current at the end of the window")
			}
		}, diagnose.ExitCannotDiagnose},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHealthyNode()
			d := fakeDiagnosis(h, diagCfg, kubeproxy.LogScan{Files: []string{"/var/log/kube-proxy.log"}})
			tc.change(h, d)
			res, err := d.Run(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if got := diagnose.ExitCode(res.Report); got != tc.want {
				t.Errorf("exit code %d, want %d: %+v", got, tc.want, res.Report)
			}
			if tc.want == diagnose.ExitCannotDiagnose && !strings.Contains(diagnose.NotCheckedMessage(res.Report), "could not check everything:\n  ") {
				t.Errorf("message %q", diagnose.NotCheckedMessage(res.Report))
			}
		})
	}
}

func TestDiagnoseUnknownService(t *testing.T) {
	h := newHealthyNode()
	cfg := diagCfg
	cfg.Service = "default/nothing"
	if _, err := fakeDiagnosis(h, cfg, kubeproxy.LogScan{}).Run(context.Background()); err == nil || !strings.Contains(err.Error(), "default/nothing not found") {
		t.Errorf("error %v", err)
	}
}

// Usage errors exit 3 with the reason, before anything is built; the exporter's own usage
// errors keep exit code 2.
func TestDiagnoseUsage(t *testing.T) {
	stderr := os.Stderr
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	os.Stderr = w
	defer func() { os.Stderr = stderr }()
	for _, tc := range []struct {
		args []string
		want int
	}{
		{[]string{"diagnose", "--output=xml"}, diagnose.ExitCannotDiagnose},
		{[]string{"diagnose", "--service=kube-dns"}, diagnose.ExitCannotDiagnose},
		{[]string{"diagnose", "--window=-1s"}, diagnose.ExitCannotDiagnose},
		{[]string{"diagnose", "--no-such-flag"}, diagnose.ExitCannotDiagnose},
		{[]string{"--no-such-flag"}, 2},
	} {
		if got := Main(tc.args); got != tc.want {
			t.Errorf("%v: exit code %d, want %d", tc.args, got, tc.want)
		}
	}
	w.Close()
	var out bytes.Buffer
	out.ReadFrom(r)
	for _, want := range []string{"enum value must be one of text,json", `--service "kube-dns": want NAMESPACE/NAME`, "--window must not be negative"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, out.String())
		}
	}
}
