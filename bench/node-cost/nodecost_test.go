//go:build linux

package main

import (
	"strings"
	"testing"
	"time"

	"github.com/proxyhealth/proxyhealth/bench/internal/synthcluster"
)

// Fresh endpoint addresses never repeat a loaded one and stay in 10.128.0.0/9.
func TestFreshEndpointIP(t *testing.T) {
	r := &ncRun{m: &ncMode{Services: 10000, Endpoints: 10}}
	if got, want := r.freshEndpointIP(0), synthcluster.EndpointIP(9999, 9, 10); got == want.String() {
		t.Errorf("the first fresh address %s is the last loaded one", got)
	}
	seen := map[string]bool{}
	for s := range 10000 {
		for e := range 10 {
			seen[synthcluster.EndpointIP(s, e, 10).String()] = true
		}
	}
	for k := range 5000 {
		ip := r.freshEndpointIP(k)
		if seen[ip] {
			t.Fatalf("fresh address %d, %s, repeats one", k, ip)
		}
		seen[ip] = true
	}
	if got := r.freshEndpointIP(ncMaxFreshAddr); !strings.HasPrefix(got, "10.") {
		t.Errorf("wrapped address %s", got)
	}
}

// A report renders whatever a run got to: a mode that failed before start-up, one with every
// phase.
func TestNodeCostReportRenders(t *testing.T) {
	r := &ncReport{cfg: ncConfig{endpoints: 10, idle: time.Minute, churn: 2 * time.Minute, churnScrape: 15 * time.Second, rates: []int{1, 10}, healTimeout: time.Minute}}
	r.Modes = append(r.Modes, &ncMode{Mode: "iptables-nft", Services: 3000, Endpoints: 10, Err: "kube-proxy exited"})
	full := &ncMode{Mode: "iptables-legacy", Services: 10000, Endpoints: 10,
		Latency: &ncLatency{Service: "ns1/svc1", Grace: time.Minute, Seen: true, Latency: 61 * time.Second, KubeProxyCaughtUp: true}}
	for _, ph := range []*ncPhase{
		{Name: "start-up", ExpCPU: 50, KPCPU: 100},
		{Name: "idle", ExpCPU: 0.5, KPCPU: 0.2, ExpPeak: 50 << 20},
		{Name: "churn 1/s", Rate: 1, ExpCPU: 2, KPCPU: 40, Changes: 120},
		{Name: "churn 10/s", Rate: 10, ExpCPU: 3, KPCPU: 60, Changes: 1190, ChangesMissed: 10},
		{Name: "start-up through churn", AllPhases: true, ExpPeak: 60 << 20},
		{Name: "drift scenario", MaxDrifted: 1, Scrapes: 3},
	} {
		full.Phases = append(full.Phases, ph)
	}
	r.Modes = append(r.Modes, full)
	text := r.render()
	for _, want := range []string{
		"| iptables-nft | failed before start-up |",
		"idle 0.50% of a core (≤ 1%: met) with 0 children (none: met)",
		"peak 60.0 MiB start-up through churn (≤ 100 MiB: met)",
		"churn 1/s 5% of kube-proxy's CPU (≤ 10%: met)",
		"| iptables-legacy | ns1/svc1 | 61.00 | +1.00 | 60 | met | yes |",
		"1190 of 1200 (0 failed, 10 ticks missed)",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("report lacks %q:\n%s", want, text)
		}
	}
}
