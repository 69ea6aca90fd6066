package diagnose

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/proxyhealth/proxyhealth/collectors/rules"
	"github.com/proxyhealth/proxyhealth/internal/verdict"
)

// Diagnosis is one look at the node. Its functions are the node's parts (the exporter's
// collectors, fakes in tests); a nil one is a part that is off. S is one reading of the
// node's counters.
type Diagnosis[S any] struct {
	Config Config
	// Sample reads the node's counters now; Input judges from the readings at the window's
	// start and end (kube-proxy's log read back from the last one's time).
	Sample func() S
	Input  func(first, last S) verdict.Input
	// Start starts the background readers; Ready waits (within Config.SyncTimeout) until they
	// have something to say.
	Start func(ctx context.Context)
	Ready func(ctx context.Context)
	// PollKubeProxy asks kube-proxy once.
	PollKubeProxy func(ctx context.Context)
	// DriftReady is when the drift check first compared with a fresh view (zero when it
	// has not); DriftSettled waits until a comparison has covered the window from then, and
	// says why not when it cannot.
	DriftReady   func() time.Time
	DriftSettled func(ctx context.Context, from time.Time) error
	// Service returns the Service's ports side by side.
	Service func(namespace, name string) ([]rules.PortEndpoints, error)
	Sleep   func(ctx context.Context, d time.Duration) error
}

// Run looks at the node over the window and judges it.
func (d *Diagnosis[S]) Run(ctx context.Context) (Result, error) {
	if d.Start != nil {
		d.Start(ctx)
	}
	if d.Ready != nil {
		d.Ready(ctx)
	}
	if d.PollKubeProxy != nil {
		d.PollKubeProxy(ctx)
	}
	first := d.Sample()
	var from time.Time
	if d.DriftReady != nil {
		from = d.DriftReady()
	}
	if err := d.Sleep(ctx, d.Config.Window); err != nil {
		return Result{}, err
	}
	var driftErr error
	if d.DriftSettled != nil && !from.IsZero() {
		driftErr = d.DriftSettled(ctx, from)
	}
	if d.PollKubeProxy != nil {
		d.PollKubeProxy(ctx)
	}
	last := d.Sample()
	in := d.Input(first, last)
	if driftErr != nil && in.Rules.Err == "" {
		in.Rules.Checked, in.Rules.Err = false, driftErr.Error()
	}
	res := Result{Report: verdict.Evaluate(in)}
	if d.Config.Service != "" {
		ports, err := d.servicePorts(in)
		if err != nil {
			return res, err
		}
		res.ServicePorts = ports
	}
	return res, ctx.Err()
}

func (d *Diagnosis[S]) servicePorts(in verdict.Input) ([]ServicePort, error) {
	namespace, name, err := SplitService(d.Config.Service)
	if err != nil {
		return nil, err
	}
	if d.Service == nil {
		return nil, errors.New("--service needs the rules collector and a Kubernetes API")
	}
	ports, err := d.Service(namespace, name)
	if err != nil {
		return nil, err
	}
	if len(ports) == 0 {
		return nil, fmt.Errorf("Service %s/%s not found in the API view (or it has no port kube-proxy programs)", namespace, name)
	}
	out := make([]ServicePort, 0, len(ports))
	for _, p := range ports {
		svc := verdict.Service{Namespace: p.Name.Namespace, Name: p.Name.Name, Port: p.Port,
			Protocol: strings.ToLower(p.Name.Protocol), PortName: p.Name.Port}
		sp := ServicePort{
			Service:        svc,
			ClusterIPs:     addrStrings(p.ClusterIPs),
			Expected:       addrStrings(p.Expected),
			Programmed:     addrStrings(p.Programmed),
			Missing:        addrStrings(p.Missing),
			Stale:          addrStrings(p.Stale),
			Chains:         p.Chains,
			VirtualServers: in.Rules.Mode == "ipvs",
			UnrepliedFlows: []verdict.UnrepliedCount{},
		}
		if p.Missing == nil && p.Stale == nil {
			// Not compared chain by chain (the rules were not read): the port's endpoints as
			// a whole.
			sp.Missing, sp.Stale = addrStrings(minus(p.Expected, p.Programmed)), addrStrings(minus(p.Programmed, p.Expected))
		}
		for _, c := range p.ByChain {
			sp.ByChain = append(sp.ByChain, ChainSide{Chain: c.Chain.String(), Name: c.Name,
				Expected: addrStrings(c.Expected), Programmed: addrStrings(c.Programmed),
				Missing: addrStrings(c.Missing), Stale: addrStrings(c.Stale)})
		}
		if sp.Chains == nil {
			sp.Chains = []string{}
		}
		for _, u := range in.Conntrack.Unreplied {
			if u.Service.Namespace == svc.Namespace && u.Service.Name == svc.Name && u.Service.Port == svc.Port && u.Service.Protocol == svc.Protocol {
				sp.UnrepliedFlows = append(sp.UnrepliedFlows, u)
			}
		}
		out = append(out, sp)
	}
	return out, nil
}

// minus is a without b (both sorted and distinct).
func minus(a, b []netip.AddrPort) []netip.AddrPort {
	out := []netip.AddrPort{}
	for _, x := range a {
		if _, found := slices.BinarySearchFunc(b, x, netip.AddrPort.Compare); !found {
			out = append(out, x)
		}
	}
	return out
}

// addrStrings is each address as text.
func addrStrings[T interface{ String() string }](addrs []T) []string {
	out := make([]string, 0, len(addrs))
	for _, a := range addrs {
		out = append(out, a.String())
	}
	return out
}

// Sleep waits d, or until ctx is done.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
