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
	"github.com/proxyhealth/proxyhealth/internal/cluster"
	"github.com/proxyhealth/proxyhealth/internal/verdict"
)

// fakeDiagnosis looks at h: the window passes on h's clock, kube-proxy's log is scan.
func fakeDiagnosis(h *healthyNode, cfg diagnoseConfig, scan kubeproxy.LogScan) *diagnosis {
	return &diagnosis{
		cfg:   cfg,
		src:   h.sources(),
		sleep: func(_ context.Context, d time.Duration) error { h.now = h.now.Add(d); return nil },
		scanLog: func(since time.Time) kubeproxy.LogScan {
			return scan
		},
		pollKubeProxy: func(context.Context) {},
		service: func(namespace, name string) ([]rules.PortEndpoints, error) {
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

var diagCfg = diagnoseConfig{Window: 15 * time.Second, Output: "text", LogSince: time.Hour, SyncTimeout: time.Second}

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
	res, err := d.run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if exitCode(res.Report) != exitCritical || res.Verdict != verdict.CriticalFound || len(res.Findings) != 1 || res.Findings[0].Cause != verdict.StaleRules {
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
	if err := res.write(&text, "text"); err != nil {
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
	if err := res.write(&js, "json"); err != nil {
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
		change func(h *healthyNode, d *diagnosis)
		want   int
	}{
		{"healthy", func(*healthyNode, *diagnosis) {}, exitNoFinding},
		{"a warning", func(h *healthyNode, _ *diagnosis) { h.kp.st.PendingSince = t0.Add(-5 * time.Minute) }, exitWarnings},
		{"kube-proxy down at both ends of the window", func(h *healthyNode, _ *diagnosis) {
			h.kp.st.Up, h.kp.st.UpReason = false, "connection refused"
		}, exitWarnings},
		{"a critical finding", func(h *healthyNode, _ *diagnosis) { h.incident3() }, exitCritical},
		{"not checked", func(h *healthyNode, _ *diagnosis) {
			h.ct.err = errors.New("operation not permitted (needs CAP_NET_ADMIN)")
		}, exitCannotDiagnose},
		{"not checked, and a warning", func(h *healthyNode, _ *diagnosis) {
			h.ct.err = errors.New("operation not permitted (needs CAP_NET_ADMIN)")
			h.kp.st.PendingSince = t0.Add(-5 * time.Minute)
		}, exitCannotDiagnose},
		{"not checked, and a critical finding", func(h *healthyNode, _ *diagnosis) {
			h.ct.err = errors.New("operation not permitted (needs CAP_NET_ADMIN)")
			h.incident3()
		}, exitCritical},
		{"the drift could not be confirmed over the window", func(h *healthyNode, d *diagnosis) {
			d.driftReady = func() time.Time { return t0 }
			d.driftSettled = func(context.Context, time.Time) error {
				return errors.New("the API view could not be confirmed current at the end of the window")
			}
		}, exitCannotDiagnose},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHealthyNode()
			d := fakeDiagnosis(h, diagCfg, kubeproxy.LogScan{Files: []string{"/var/log/kube-proxy.log"}})
			tc.change(h, d)
			res, err := d.run(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if got := exitCode(res.Report); got != tc.want {
				t.Errorf("exit code %d, want %d: %+v", got, tc.want, res.Report)
			}
			if tc.want == exitCannotDiagnose && !strings.Contains(notCheckedMessage(res.Report), "could not check everything:\n  ") {
				t.Errorf("message %q", notCheckedMessage(res.Report))
			}
		})
	}
}

func TestDiagnoseUnknownService(t *testing.T) {
	h := newHealthyNode()
	cfg := diagCfg
	cfg.Service = "default/nothing"
	if _, err := fakeDiagnosis(h, cfg, kubeproxy.LogScan{}).run(context.Background()); err == nil || !strings.Contains(err.Error(), "default/nothing not found") {
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
		{[]string{"diagnose", "--output=xml"}, exitCannotDiagnose},
		{[]string{"diagnose", "--service=kube-dns"}, exitCannotDiagnose},
		{[]string{"diagnose", "--window=-1s"}, exitCannotDiagnose},
		{[]string{"diagnose", "--no-such-flag"}, exitCannotDiagnose},
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

func TestWantsDiagnose(t *testing.T) {
	for args, want := range map[string]bool{
		"diagnose --window=1s":          true,
		"--kubeconfig=x diagnose":       true,
		"--web.listen-address=:9869":    false,
		"-- diagnose":                   false,
		"--kubeproxy.log-path=/x/*.log": false,
	} {
		if got := wantsDiagnose(strings.Fields(args)); got != want {
			t.Errorf("wantsDiagnose(%q) = %v", args, got)
		}
	}
}

// An endpoint the local chain lacks while the cluster chain still holds it (a NodePort with
// externalTrafficPolicy: Local after a partial restore) is missing, and --service says from
// which chain: the side-by-side view agrees with the stale_rules finding.
func TestDiagnoseServicePerChain(t *testing.T) {
	ap := netip.MustParseAddrPort
	local, remote := ap("10.244.1.4:8080"), ap("10.244.2.7:8080")
	d := &diagnosis{cfg: diagnoseConfig{Service: "shop/web"}, service: func(namespace, name string) ([]rules.PortEndpoints, error) {
		return []rules.PortEndpoints{{
			Name:       cluster.ServicePortName{Namespace: "shop", Name: "web", Port: "http", Protocol: "TCP"},
			Port:       80,
			ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.20")},
			Expected:   []netip.AddrPort{local, remote},
			Programmed: []netip.AddrPort{local, remote},
			Missing:    []netip.AddrPort{local},
			Stale:      []netip.AddrPort{},
			Chains:     []string{"KUBE-SVC-AAAA", "KUBE-SVL-AAAA"},
			ByChain: []rules.ChainEndpoints{
				{Chain: rules.ClusterChain, Name: "KUBE-SVC-AAAA", Expected: []netip.AddrPort{local, remote}, Programmed: []netip.AddrPort{local, remote}},
				{Chain: rules.LocalChain, Name: "KUBE-SVL-AAAA", Expected: []netip.AddrPort{local}, Programmed: []netip.AddrPort{}, Missing: []netip.AddrPort{local}},
			},
		}}, nil
	}}
	ports, err := d.servicePorts(verdict.Input{})
	if err != nil {
		t.Fatal(err)
	}
	if len(ports) != 1 || strings.Join(ports[0].Missing, ",") != local.String() || len(ports[0].Stale) != 0 || len(ports[0].ByChain) != 2 {
		t.Fatalf("service ports %+v", ports)
	}
	var text bytes.Buffer
	if err := ports[0].writeText(&text, 15); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"2 endpoints in the API for this node, 2 programmed (now 1 missing, 0 stale)\n",
		"  10.244.1.4:8080  yes  yes    missing from the local chain\n",
		"  10.244.2.7:8080  yes  yes\n",
	} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text lacks %q:\n%s", want, text.String())
		}
	}
}
