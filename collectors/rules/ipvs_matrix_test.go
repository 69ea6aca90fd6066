package rules

import (
	"net/netip"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/proxyhealth/proxyhealth/internal/ipvs"
	"github.com/proxyhealth/proxyhealth/internal/kpcapture"
	"github.com/proxyhealth/proxyhealth/internal/proxyversion"
)

// The version matrix in IPVS mode: the virtual servers the real kube-proxy of each version
// programmed in IPVS mode (kpcapture.IPVSCaptures, captured in a kernel matrix guest by the
// lab's TestCaptureKubeProxyIPVS) against the version's API objects, computed as that version
// computes them. A converged node: every service port checked, no drift, no orphan; and with
// one real server taken away, exactly that one missing.
func TestIPVSMatrix(t *testing.T) {
	captures, err := kpcapture.IPVSCaptures("../..")
	if err != nil {
		t.Fatal(err)
	}
	if len(captures) == 0 {
		t.Fatalf("no IPVS captures under %s (CAPTURE=1 test/vm/ipvs-lab.sh makes them)", kpcapture.Dir)
	}
	for _, c := range captures {
		t.Run(c.Version, func(t *testing.T) {
			version, ok := proxyversion.Parse(c.Version)
			if !ok {
				t.Fatalf("version %q does not parse", c.Version)
			}
			state, err := c.LoadIPVS()
			if err != nil {
				t.Fatal(err)
			}
			snap := apiSnapshotFor(t, filepath.Join(filepath.Dir(c.Dir), kpcapture.APIObjectsFile), version)
			at := time.Unix(1, 0)
			table := ipvs.NewTable(nil, state.VirtualServers, state.Bound, at)
			res := newDriftEngine(0).check(snap, virtualServersByFamily(table), at)
			if res.checked != len(snap.Ports) || len(res.drifting) != 0 || res.orphans != 0 {
				t.Fatalf("checked %d of %d service ports, drifting %+v, orphans %d: want every port checked, no drift",
					res.checked, len(snap.Ports), res.drifting, res.orphans)
			}

			// A cluster IP's real server taken away: the check finds it missing there.
			servers := slices.Clone(state.VirtualServers)
			i := slices.IndexFunc(servers, func(vs ipvs.VirtualServer) bool {
				_, bound := table.Bound[vs.Addr]
				return bound && len(vs.RealServers) > 0
			})
			if i < 0 {
				t.Fatal("no virtual server with real servers in the capture")
			}
			removed := servers[i].RealServers[0]
			servers[i].RealServers = servers[i].RealServers[1:]
			res = newDriftEngine(0).check(snap, virtualServersByFamily(ipvs.NewTable(nil, servers, state.Bound, at)), at)
			if d := res.drifting; len(d) != 1 || d[0].missing != 1 || d[0].stale != 0 || !slices.Equal(d[0].missingAddrs, []netip.AddrPort{removed.Addr}) ||
				len(d[0].missingServers) != 1 || !slices.Contains(d[0].missingServers[0], servers[i].Key) {
				t.Errorf("%s taken from %s: drifting %+v, want it missing there", removed.Addr, servers[i].Key, res.drifting)
			}
		})
	}
}
