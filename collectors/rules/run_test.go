package rules

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/promslog"

	"github.com/proxyhealth/proxyhealth/internal/cluster"
	"github.com/proxyhealth/proxyhealth/internal/hostrules"
	"github.com/proxyhealth/proxyhealth/internal/ruleset"
)

// changingRules is a netfilter reader whose state a test replaces, telling subscribers.
type changingRules struct {
	mu  sync.Mutex
	st  *hostrules.State
	sub chan struct{}
}

func (r *changingRules) State() *hostrules.State { r.mu.Lock(); defer r.mu.Unlock(); return r.st }
func (r *changingRules) Subscribe() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sub = make(chan struct{}, 1)
	return r.sub
}
func (r *changingRules) set(st *hostrules.State) {
	r.mu.Lock()
	r.st = st
	sub := r.sub
	r.mu.Unlock()
	if sub != nil {
		select {
		case sub <- struct{}{}:
		default:
		}
	}
}

// notifyingView is an API view that tells when it changes and counts confirmation requests.
type notifyingView struct {
	mu       sync.Mutex
	snap     *cluster.Snapshot
	changed  chan struct{}
	confirms int
}

func (v *notifyingView) Snapshot() *cluster.Snapshot { v.mu.Lock(); defer v.mu.Unlock(); return v.snap }
func (v *notifyingView) Subscribe() <-chan struct{}  { return v.changed }
func (v *notifyingView) Confirm() {
	v.mu.Lock()
	v.confirms++
	v.mu.Unlock()
}
func (v *notifyingView) set(s *cluster.Snapshot) {
	v.mu.Lock()
	v.snap = s
	v.mu.Unlock()
	select {
	case v.changed <- struct{}{}:
	default:
	}
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for range 1000 {
		if cond() {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
}

// The comparison follows changes of either side at once, not on the check interval.
func TestRunComparesOnChange(t *testing.T) {
	dns := dnsPort("10.244.1.5:53")
	view := &notifyingView{changed: make(chan struct{}, 1), snap: snapshot(dns)}
	view.snap.LastHeard = time.Now().Add(time.Hour) // confirmed current at every check
	clusterChain, _ := chainsFor(dns.Name, false)
	rules := &changingRules{st: stateOf(hostrules.ModeIPTables, map[string][]netip.AddrPort{clusterChain: {ap("10.244.1.5:53")}})}
	c, err := New(Config{View: view, Rules: rules, CheckInterval: time.Hour, GracePeriod: 0, MaxSeries: 10, MinCheckGap: time.Millisecond}, promslog.NewNopLogger())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	checked := func() int {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.last == nil {
			return -1
		}
		return c.last.checked
	}
	drifted := func() int {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.last == nil {
			return -1
		}
		return len(c.last.drifting)
	}
	waitUntil(t, "the first check", func() bool { return checked() == 1 })
	if d := drifted(); d != 0 {
		t.Fatalf("converged node: %d drifting", d)
	}
	// kube-dns's chain loses its endpoint for another: drift at once (grace 0).
	rules.set(stateOf(hostrules.ModeIPTables, map[string][]netip.AddrPort{clusterChain: {ap("10.244.9.9:53")}}))
	waitUntil(t, "drift after the rules changed", func() bool { return drifted() == 1 })
	// The API catches up with the rules: no drift.
	healed := snapshot(dnsPort("10.244.9.9:53"))
	healed.LastHeard = view.snap.LastHeard
	view.set(healed)
	waitUntil(t, "no drift after the API changed", func() bool { return drifted() == 0 })
}

// A difference that came of age before the view was last heard from asks the view to confirm.
func TestCheckAsksTheViewToConfirm(t *testing.T) {
	t0 := time.Unix(1000, 0)
	snap := snapshot(dnsPort("10.244.1.5:53"))
	snap.LastHeard = t0
	view := &notifyingView{changed: make(chan struct{}, 1), snap: snap}
	rules := &changingRules{st: stateOf(hostrules.ModeIPTables, map[string][]netip.AddrPort{})}
	c, err := New(Config{View: view, Rules: rules, CheckInterval: time.Hour, GracePeriod: 10 * time.Second, MaxSeries: 10}, promslog.NewNopLogger())
	if err != nil {
		t.Fatal(err)
	}
	now := t0
	c.now = func() time.Time { return now }
	if next, _ := c.check(); !next.Equal(t0.Add(10 * time.Second)) {
		t.Errorf("next deadline %v, want the grace period's end %v", next, t0.Add(10*time.Second))
	}
	now = t0.Add(11 * time.Second)
	c.check()
	if view.confirms != 1 || len(c.last.drifting) != 0 {
		t.Errorf("past grace, view heard at the difference's start: %d confirmations and %d drifting, want 1 and 0", view.confirms, len(c.last.drifting))
	}
	snap2 := *snap
	snap2.LastHeard = now
	view.set(&snap2)
	c.check()
	if len(c.last.drifting) != 1 {
		t.Errorf("after the view confirmed: %d drifting, want 1", len(c.last.drifting))
	}
}

// laggingRules is rules that may lag the node's since behind, and count requests to catch up.
type laggingRules struct {
	changingRules
	behind   time.Time
	catchUps int
}

func (l *laggingRules) Behind() time.Time { return l.behind }
func (l *laggingRules) CatchUp()          { l.catchUps++ }

// A difference that came of age while the rules may lag kube-proxy's (a legacy read held back)
// is not counted: the rules are asked to catch up, not the view, and once read again without
// the difference there is no drift; a difference that outlasts the grace in current rules is.
func TestCheckAsksLaggingRulesToCatchUp(t *testing.T) {
	t0 := time.Unix(1000, 0)
	snap := snapshot(dnsPort("10.244.1.5:53"))
	snap.LastHeard = t0.Add(time.Hour) // the view is confirmed current at every check
	view := &notifyingView{changed: make(chan struct{}, 1), snap: snap}
	rules := &laggingRules{changingRules: changingRules{st: stateOf(hostrules.ModeIPTables, map[string][]netip.AddrPort{})}}
	c, err := New(Config{View: view, Rules: rules, CheckInterval: time.Hour, GracePeriod: 10 * time.Second, MaxSeries: 10}, promslog.NewNopLogger())
	if err != nil {
		t.Fatal(err)
	}
	now := t0
	c.now = func() time.Time { return now }
	// The endpoint is missing from the rules from t0; kube-proxy synced a change at t0+2s,
	// not read yet.
	c.check()
	rules.behind = t0.Add(2 * time.Second)
	now = t0.Add(11 * time.Second)
	c.check()
	if rules.catchUps != 1 || view.confirms != 0 || len(c.last.drifting) != 0 {
		t.Errorf("past grace, rules behind since t0+2s: %d catch-ups, %d view confirmations, %d drifting; want 1, 0, 0",
			rules.catchUps, view.confirms, len(c.last.drifting))
	}
	// Read again: still missing (kube-proxy's change was another one), and current.
	rules.behind = time.Time{}
	c.check()
	if len(c.last.drifting) != 1 || c.last.drifting[0].missing != 1 {
		t.Errorf("rules caught up, the endpoint still missing: drifting %+v, want 1 missing", c.last.drifting)
	}
	if rules.catchUps != 1 {
		t.Errorf("%d catch-ups with current rules, want still 1", rules.catchUps)
	}
}

// An unreadable rule set fails the collector with the reason.
func TestCheckRulesUnreadable(t *testing.T) {
	view := fakeView{snapshot(kubernetesPort())}
	refused := errors.New("open nf_tables netlink socket: operation not permitted")
	rules := fakeRules{&hostrules.State{Mode: hostrules.ModeNone, ProxyErr: refused}}
	c, err := New(Config{View: view, Rules: rules, CheckInterval: time.Second, MaxSeries: 10}, promslog.NewNopLogger())
	if err != nil {
		t.Fatal(err)
	}
	c.check()
	if err := c.Update(make(chan prometheus.Metric, 100)); err == nil || !strings.Contains(err.Error(), "operation not permitted") {
		t.Errorf("Update error %v, want the refusal", err)
	}
	// Only one family unreadable: the other is still compared, and the error still told.
	rules.st = &hostrules.State{Mode: hostrules.ModeIPTables, ProxyErr: refused,
		Proxy: map[bool]*ruleset.ProxyTable{false: {Chains: map[string][]netip.AddrPort{}}}}
	c.cfg.Rules = rules
	c.check()
	if c.last.checked != 1 || c.last.err == nil {
		t.Errorf("partial read: checked %d, err %v; want 1 and the error", c.last.checked, c.last.err)
	}
}

// An endpoint counts once per service port: a NodePort with externalTrafficPolicy: Local whose
// removed local endpoint stays in both its frozen chains is one stale endpoint, not two.
func TestDriftCountsEachEndpointOnce(t *testing.T) {
	sp := dnsPort("10.244.1.5:53", "10.244.2.6:53")
	sp.ExternalLocal = true
	sp.LocalEndpoints = []netip.AddrPort{ap("10.244.1.5:53")}
	clusterChain, localChain := chainsFor(sp.Name, false)
	frozen := map[string][]netip.AddrPort{
		clusterChain: {ap("10.244.1.5:53"), ap("10.244.2.6:53"), ap("10.244.1.9:53")},
		localChain:   {ap("10.244.1.5:53"), ap("10.244.1.9:53")},
	}
	snap := snapshot(sp)
	snap.LastHeard = time.Unix(100, 0)
	res := newDriftEngine(0).check(snap, programmedByFamily(stateOf(hostrules.ModeIPTables, frozen)), time.Unix(100, 0))
	if len(res.drifting) != 1 || res.drifting[0].stale != 1 || res.drifting[0].missing != 0 {
		t.Errorf("drifting %+v, want one port with 1 stale endpoint", res.drifting)
	}
}

// stuckRules is a netfilter reader that says it is stuck.
type stuckRules struct{ fakeRules }

func (stuckRules) Stalled() error { return errors.New("the netfilter reader is stuck") }

// A check loop that stopped going round, or a stuck reader, fails the collector with the reason.
func TestWatchdog(t *testing.T) {
	view := fakeView{snapshot(kubernetesPort())}
	now := time.Unix(1000, 0)
	c, err := New(Config{View: view, Rules: fakeRules{stateOf(hostrules.ModeIPTables, nil)}, CheckInterval: 10 * time.Second, MaxSeries: 10,
		Now: func() time.Time { return now }}, promslog.NewNopLogger())
	if err != nil {
		t.Fatal(err)
	}
	c.check()
	update := func() error { return c.Update(make(chan prometheus.Metric, 100)) }
	now = now.Add(25 * time.Second)
	if err := update(); err != nil {
		t.Errorf("within three intervals: %v", err)
	}
	if lc := c.LastCheck(); lc.Err != nil {
		t.Errorf("within three intervals, the last check says %v", lc.Err)
	}
	now = now.Add(10 * time.Second)
	if err := update(); err == nil || !strings.Contains(err.Error(), "drift check is stuck") {
		t.Errorf("past three intervals: %v, want stuck", err)
	}
	// The verdict reads LastCheck: a stuck check is no check, never a healthy one.
	if lc := c.LastCheck(); lc.Err == nil || !strings.Contains(lc.Err.Error(), "drift check is stuck") || lc.Drifting != nil {
		t.Errorf("past three intervals, the last check says err %v, drifting %v; want stuck", lc.Err, lc.Drifting)
	}
	c.cfg.Rules = stuckRules{fakeRules{stateOf(hostrules.ModeIPTables, nil)}}
	c.check()
	if err := update(); err == nil || !strings.Contains(err.Error(), "reader is stuck") {
		t.Errorf("stuck reader: %v", err)
	}
	if lc := c.LastCheck(); lc.Err == nil || !strings.Contains(lc.Err.Error(), "reader is stuck") {
		t.Errorf("stuck reader, the last check says %v", lc.Err)
	}
}

// confirmingView answers Confirm as the API view does: it hears from the API server at once
// and tells its consumers.
type confirmingView struct {
	notifyingView
	at time.Time
}

func (v *confirmingView) Confirm() {
	v.mu.Lock()
	snap := *v.snap
	snap.LastHeard = v.at
	v.confirms++
	v.mu.Unlock()
	v.set(&snap)
}

// The answer to a check's request for proof is compared at once, not after MinCheckGap: a
// drift that came of age is reported as soon as the view has proved itself current.
func TestRunComparesTheConfirmationAtOnce(t *testing.T) {
	t0 := time.Unix(1000, 0)
	snap := snapshot(dnsPort("10.244.1.5:53"))
	snap.LastHeard = t0
	view := &confirmingView{notifyingView: notifyingView{changed: make(chan struct{}, 1), snap: snap}, at: t0.Add(11 * time.Second)}
	rules := &changingRules{st: stateOf(hostrules.ModeIPTables, map[string][]netip.AddrPort{})}
	c, err := New(Config{View: view, Rules: rules, CheckInterval: time.Hour, GracePeriod: 10 * time.Second, MaxSeries: 10, MinCheckGap: time.Hour}, promslog.NewNopLogger())
	if err != nil {
		t.Fatal(err)
	}
	now := t0
	c.now = func() time.Time { return now }
	c.check() // the endpoint is missing from t0
	now = t0.Add(11 * time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	// Run's first check finds the difference of age but unconfirmed and asks the view, which
	// answers at once; with the hour-long gap, only an immediate second check reports it.
	waitUntil(t, "the drift reported after the view confirmed", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.last != nil && len(c.last.drifting) == 1
	})
}
