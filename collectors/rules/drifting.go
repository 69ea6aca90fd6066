package rules

import (
	"net/netip"
	"slices"
	"time"

	"github.com/proxyhealth/proxyhealth/internal/cluster"
	"github.com/proxyhealth/proxyhealth/internal/ipvs"
)

// DriftingPort is one service port whose programmed endpoints have differed from the API past
// the grace period, as the last check found it.
type DriftingPort struct {
	Name cluster.ServicePortName
	Port uint16 // the Service's port number
	// Each of the port's chains is compared with what the API says it should hold. Stale are
	// endpoints a chain holds without cause, Missing endpoints a chain that should hold them
	// lacks; sorted, each once whichever chains show it, at most maxDriftAddresses each.
	// StaleCount and MissingCount are the whole counts. StaleIn and MissingFrom, alongside
	// Stale and Missing, name the chains that hold each stale endpoint and that lack each
	// missing one.
	Stale, Missing       []netip.AddrPort
	StaleIn, MissingFrom []Chains
	// StaleInServers and MissingFromServers, alongside Stale and Missing in IPVS mode (nil in
	// the others), name the virtual servers that hold each stale endpoint and that lack each
	// missing one ("10.96.0.10:53/UDP").
	StaleInServers, MissingFromServers [][]string
	StaleCount, MissingCount           int
	// StaleByFamily and MissingByFamily split StaleCount and MissingCount by IP family:
	// [0] IPv4, [1] IPv6.
	StaleByFamily, MissingByFamily [2]int
	// Programmed and Expected are the distinct endpoints compared at the check: in the rules,
	// and in the API for this node (over the port's IP families).
	Programmed, Expected int
	// Since is when the oldest of its current differences was first seen.
	Since time.Time
}

// CheckSummary is the last drift check, as read without waiting on it.
type CheckSummary struct {
	// At is when the last check ran; zero before the first (nothing to say yet).
	At time.Time
	// Mode is kube-proxy's mode found from its rules (hostrules.Mode*); empty when the rules
	// could not be read.
	Mode string
	// Err is why the check could not compare all it should (no API, rules unreadable).
	Err error
	// Fresh is whether the API view is fresh now: drift is reported only while it is, so a
	// stale view never reads as stale rules.
	Fresh bool
	// Compared is whether the last check compared the rules with a fresh view (a check while
	// the view was stale, or before it synced, compared nothing).
	Compared bool
	// Checked is the number of service ports compared (0 while the view is not fresh).
	Checked int
	// Drifting are the drifting service ports, most differing endpoints first.
	Drifting []DriftingPort
	// GracePeriod is how long a difference must last to count (--rules.grace-period).
	GracePeriod time.Duration
	// Unconfirmed is set when a difference has lasted the grace period but the API view has
	// not proved current since: it counts once the view does.
	Unconfirmed bool
}

// LastCheck returns the last drift check without waiting for one. Its drifting ports are left
// out (and Checked is 0) when the API view is not fresh now, as in the metrics.
func (c *Collector) LastCheck() CheckSummary {
	fresh := c.cfg.View.Snapshot().Fresh
	c.mu.Lock()
	res := c.last
	c.mu.Unlock()
	out := CheckSummary{Fresh: fresh, GracePeriod: c.cfg.GracePeriod}
	if res == nil {
		return out
	}
	out.At, out.Mode, out.Err, out.Unconfirmed, out.Compared = res.at, res.mode, res.err, res.unconfirmed, res.fresh
	if out.Err == nil {
		// A stuck check loop or netfilter reader leaves an old comparison behind: it is no
		// check of now, so the verdict must not judge the node by it (the metrics fail the
		// collector for the same reason).
		out.Err = c.stalled(res)
	}
	if !fresh || out.Err != nil && res.err == nil {
		return out
	}
	out.Checked = res.checked
	out.Drifting = make([]DriftingPort, 0, len(res.drifting))
	for _, d := range res.drifting {
		out.Drifting = append(out.Drifting, DriftingPort{
			Name:               d.name,
			Port:               d.port,
			Stale:              slices.Clone(d.staleAddrs),
			Missing:            slices.Clone(d.missingAddrs),
			StaleIn:            slices.Clone(d.staleIn),
			MissingFrom:        slices.Clone(d.missingFrom),
			StaleInServers:     serverNames(d.staleServers),
			MissingFromServers: serverNames(d.missingServers),
			StaleCount:         d.stale,
			MissingCount:       d.missing,
			StaleByFamily:      d.staleByFamily,
			MissingByFamily:    d.missingByFamily,
			Programmed:         d.programmed,
			Expected:           d.expected,
			Since:              d.since,
		})
	}
	return out
}

// serverNames names each list of virtual servers; nil for none.
func serverNames(servers [][]ipvs.Key) [][]string {
	if servers == nil {
		return nil
	}
	out := make([][]string, len(servers))
	for i, keys := range servers {
		out[i] = make([]string, len(keys))
		for j, k := range keys {
			out[i][j] = k.String()
		}
	}
	return out
}

// Drifting returns the service ports drifting at the last check (none while the API view is
// not fresh), most differing endpoints first. It never waits on a check.
func (c *Collector) Drifting() []DriftingPort { return c.LastCheck().Drifting }
