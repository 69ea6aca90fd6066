package nftnl

import (
	"context"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/proxyhealth/proxyhealth/internal/nftnl/nftnltest"
	"github.com/proxyhealth/proxyhealth/internal/ruleset"
)

// followTest is a Follower beside a watch on its tables.
type followTest struct {
	t *testing.T
	f *Follower
	w *Watcher
}

func newFollowTest(t *testing.T, opts ...WatchOption) *followTest {
	t.Helper()
	return newFollowTestVia(t, nil, opts...)
}

// newFollowTestVia is newFollowTest with the Follower's requests going through via(the
// socket's querier) when via is not nil.
func newFollowTestVia(t *testing.T, via func(querier) querier, opts ...WatchOption) *followTest {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w, err := Watch(ctx, Followed, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopped(t, cancel, w) })
	s, err := dial(Limits{})
	if err != nil {
		t.Fatal(err)
	}
	var q querier = s
	if via != nil {
		q = via(s)
	}
	f := newFollower(q, s)
	t.Cleanup(func() { f.Close() })
	if err := f.Resync(ctx); err != nil {
		t.Fatal(err)
	}
	return &followTest{t: t, f: f, w: w}
}

// changes returns the watch's changes up to the current generation.
func (ft *followTest) changes() []Change {
	t := ft.t
	t.Helper()
	gen, err := Generation(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var out []Change
	for {
		select {
		case c := <-ft.w.C:
			out = append(out, c)
			if c.Generation == gen {
				return out
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("no change of generation %d within 5s (got %+v)", gen, out)
		}
	}
}

// step applies what changed since the last step and checks the follower against fresh reads;
// it returns the reads the step made.
func (ft *followTest) step(what string) FollowStats {
	t := ft.t
	t.Helper()
	before := ft.f.Stats()
	chg := ft.changes()
	if err := ft.f.Apply(context.Background(), chg...); err != nil {
		t.Fatalf("%s: Apply: %v", what, err)
	}
	after := ft.f.Stats()
	d := FollowStats{FullReads: after.FullReads - before.FullReads, RuleDumps: after.RuleDumps - before.RuleDumps, ElementDumps: after.ElementDumps - before.ElementDumps}
	ft.same(what)
	t.Logf("%s: %d changes, reads %+v", what, len(chg), d)
	return d
}

// same checks that the follower's tables equal fresh whole reads.
func (ft *followTest) same(what string) {
	t := ft.t
	t.Helper()
	for _, ipv6 := range []bool{false, true} {
		check := func(kind string, got *ruleset.ProxyTable, gotErr error, read func(context.Context, bool, Limits) (*ruleset.ProxyTable, error)) {
			t.Helper()
			want, err := read(context.Background(), ipv6, Limits{})
			if err != nil || gotErr != nil {
				t.Fatalf("%s: %s ipv6=%v: read %v, follower %v", what, kind, ipv6, err, gotErr)
			}
			if !reflect.DeepEqual(got.Content(), want.Content()) {
				t.Errorf("%s: %s ipv6=%v:\nfollower %+v\nfresh    %+v", what, kind, ipv6, got, want)
			}
		}
		pt, err := ft.f.IPTablesNAT(ipv6)
		check("nat", pt, err, ReadIPTablesNAT)
		pt, err = ft.f.KubeProxyNFT(ipv6)
		check("kube-proxy", pt, err, ReadKubeProxyNFT)
	}
}

func wantReads(t *testing.T, what string, got FollowStats, full, rules, elements uint64) {
	t.Helper()
	if got.FullReads != full || got.RuleDumps != rules || got.ElementDumps != elements {
		t.Errorf("%s: reads %+v, want %d full, %d rule dumps, %d element dumps", what, got, full, rules, elements)
	}
}

// kubeServices is the capture's KUBE-SERVICES rules, which kube-proxy writes again each sync.
func kubeServices(t *testing.T, without string) string {
	var b strings.Builder
	for _, l := range strings.Split(string(readFile(t, natCapture)), "\n") {
		if strings.HasPrefix(l, "-A KUBE-SERVICES ") && (without == "" || !strings.Contains(l, without)) {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// TestKernelFollowIPTablesNAT replays a kube-proxy partial sync on the real capture: one
// endpoint of lab/web-nodeport replaced (its KUBE-SEP chain deleted, a new one added, the
// service chain, the other endpoint's chain and KUBE-SERVICES written again). The chains
// are followed from the watch's rule messages; a watch that does not keep them makes the
// Follower dump each chain a sync wrote instead.
func TestKernelFollowIPTablesNAT(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []WatchOption
		// servicesDumps is the KUBE-SERVICES dumps each rewrite of that chain costs, and
		// chainDumps the dumps of each service or endpoint chain written whole.
		servicesDumps, chainDumps uint64
	}{
		{"rule messages kept", []WatchOption{FollowNATRules()}, 0, 0},
		{"rule messages not kept", nil, 1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) { testFollowIPTablesNAT(t, tc.opts, tc.servicesDumps, tc.chainDumps) })
	}
}

func testFollowIPTablesNAT(t *testing.T, opts []WatchOption, servicesDumps, chainDumps uint64) {
	needNetns(t)
	nftnltest.Flush(t)
	nftnltest.LoadIPTablesSave(t, readFile(t, natCapture), false)
	ft := newFollowTest(t, opts...)
	ft.same("initial read")

	nftnltest.LoadIPTablesSave(t, []byte(`*nat
:KUBE-SERVICES - [0:0]
:KUBE-SVC-FEK7IJ3KIWHUKSBD - [0:0]
:KUBE-SEP-RX36DMIICQEWPEUB - [0:0]
:KUBE-SEP-HUGL6XOLN2FXI7EB - [0:0]
:KUBE-SEP-NEWNEWNEWNEW0001 - [0:0]
`+kubeServices(t, "")+`-A KUBE-SVC-FEK7IJ3KIWHUKSBD ! -s 10.244.0.0/16 -d 10.96.0.52/32 -p tcp -m comment --comment "lab/web-nodeport:http cluster IP" -m tcp --dport 80 -j KUBE-MARK-MASQ
-A KUBE-SVC-FEK7IJ3KIWHUKSBD -m comment --comment "lab/web-nodeport:http -> 10.244.1.3:8080" -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-HUGL6XOLN2FXI7EB
-A KUBE-SVC-FEK7IJ3KIWHUKSBD -m comment --comment "lab/web-nodeport:http -> 10.244.3.51:8080" -j KUBE-SEP-NEWNEWNEWNEW0001
-A KUBE-SEP-HUGL6XOLN2FXI7EB -s 10.244.1.3/32 -m comment --comment "lab/web-nodeport:http" -j KUBE-MARK-MASQ
-A KUBE-SEP-HUGL6XOLN2FXI7EB -p tcp -m comment --comment "lab/web-nodeport:http" -m tcp -j DNAT --to-destination 10.244.1.3:8080
-A KUBE-SEP-NEWNEWNEWNEW0001 -s 10.244.3.51/32 -m comment --comment "lab/web-nodeport:http" -j KUBE-MARK-MASQ
-A KUBE-SEP-NEWNEWNEWNEW0001 -p tcp -m comment --comment "lab/web-nodeport:http" -m tcp -j DNAT --to-destination 10.244.3.51:8080
-X KUBE-SEP-RX36DMIICQEWPEUB
COMMIT
`), false, "--noflush")
	// The service chain and the two endpoint chains written (the old one is gone, nothing to
	// read), and KUBE-SERVICES, unless their rule messages were kept.
	wantReads(t, "endpoint replaced", ft.step("endpoint replaced"), 0, 3*chainDumps+servicesDumps, 0)
	if pt, _ := ft.f.IPTablesNAT(false); !slices.Contains(pt.Chains["KUBE-SVC-FEK7IJ3KIWHUKSBD"], netip.MustParseAddrPort("10.244.3.51:8080")) {
		t.Errorf("KUBE-SVC-FEK7IJ3KIWHUKSBD does not DNAT to the new endpoint: %v", pt.Chains["KUBE-SVC-FEK7IJ3KIWHUKSBD"])
	}

	// KUBE-SERVICES alone rewritten, one service port's dispatch moved to another cluster IP:
	// what the Follower lists must follow from the rule messages alone.
	moved := strings.ReplaceAll(kubeServices(t, ""), "-d 10.96.0.52/32", "-d 10.96.7.52/32")
	nftnltest.LoadIPTablesSave(t, []byte("*nat\n:KUBE-SERVICES - [0:0]\n"+moved+"COMMIT\n"), false, "--noflush")
	wantReads(t, "dispatch moved", ft.step("dispatch moved"), 0, servicesDumps, 0)
	if pt, _ := ft.f.IPTablesNAT(false); !slices.ContainsFunc(pt.Services, func(s ruleset.Service) bool {
		return s.ClusterIP == netip.MustParseAddr("10.96.7.52") && s.Chain == "KUBE-SVC-FEK7IJ3KIWHUKSBD"
	}) {
		t.Errorf("the moved dispatch is not listed: %+v", pt.Services)
	}

	// Two commits in one Apply, the second undoing the first.
	nftnltest.LoadIPTablesSave(t, []byte("*nat\n:KUBE-SERVICES - [0:0]\n"+kubeServices(t, "")+"COMMIT\n"), false, "--noflush")
	nftnltest.LoadIPTablesSave(t, []byte("*nat\n:KUBE-SERVICES - [0:0]\n"+moved+"COMMIT\n"), false, "--noflush")
	ft.step("two rewrites")

	// Changes a whole read already holds: their rule messages are not applied again (the
	// first alone would bring back the dispatch rules the second deleted).
	nftnltest.LoadIPTablesSave(t, []byte("*nat\n:KUBE-SERVICES - [0:0]\n"+kubeServices(t, "")+"COMMIT\n"), false, "--noflush")
	nftnltest.LoadIPTablesSave(t, []byte("*nat\n:KUBE-SERVICES - [0:0]\n"+moved+"COMMIT\n"), false, "--noflush")
	held := ft.changes()
	if err := ft.f.Resync(context.Background()); err != nil {
		t.Fatal(err)
	}
	for i, c := range held {
		if err := ft.f.Apply(context.Background(), c); err != nil {
			t.Fatal(err)
		}
		ft.same(fmt.Sprintf("change %d of %d after a whole read", i+1, len(held)))
	}

	// A rule deleted alone, and one appended to a chain not declared: the messages do not
	// tell the chain's other rules, so it is read.
	nftnltest.LoadIPTablesSave(t, []byte(`*nat
-D KUBE-SVC-FEK7IJ3KIWHUKSBD ! -s 10.244.0.0/16 -d 10.96.0.52/32 -p tcp -m comment --comment "lab/web-nodeport:http cluster IP" -m tcp --dport 80 -j KUBE-MARK-MASQ
COMMIT
`), false, "--noflush")
	wantReads(t, "rule deleted alone", ft.step("rule deleted alone"), 0, 1, 0)
	nftnltest.LoadIPTablesSave(t, []byte(`*nat
-A KUBE-SVC-FEK7IJ3KIWHUKSBD -m comment --comment "lab/web-nodeport:http -> 10.244.3.51:8080" -j KUBE-SEP-NEWNEWNEWNEW0001
COMMIT
`), false, "--noflush")
	wantReads(t, "rule appended", ft.step("rule appended"), 0, 1, 0)

	// A chain read after later commits rewrote it (the first change does not tell its
	// rules): the rewrites' messages must not be applied again. The second rewrite deletes
	// as many rules as the third left, so applying it would bring its rules back.
	rewriteSVC := func(seps ...string) {
		var b strings.Builder
		b.WriteString("*nat\n:KUBE-SVC-FEK7IJ3KIWHUKSBD - [0:0]\n")
		for _, sep := range seps {
			b.WriteString("-A KUBE-SVC-FEK7IJ3KIWHUKSBD -j " + sep + "\n")
		}
		b.WriteString("COMMIT\n")
		nftnltest.LoadIPTablesSave(t, []byte(b.String()), false, "--noflush")
	}
	rewriteSVC("KUBE-SEP-HUGL6XOLN2FXI7EB", "KUBE-SEP-NEWNEWNEWNEW0001", "KUBE-MARK-MASQ")
	wantReads(t, "service chain rewritten", ft.step("service chain rewritten"), 0, chainDumps, 0)
	nftnltest.LoadIPTablesSave(t, []byte(`*nat
-D KUBE-SVC-FEK7IJ3KIWHUKSBD -j KUBE-MARK-MASQ
COMMIT
`), false, "--noflush")
	rewriteSVC("KUBE-SEP-HUGL6XOLN2FXI7EB", "KUBE-SEP-NEWNEWNEWNEW0001")
	rewriteSVC("KUBE-SEP-NEWNEWNEWNEW0001", "KUBE-MARK-MASQ")
	held = ft.changes()
	if len(held) != 3 {
		t.Fatalf("%d changes, want 3", len(held))
	}
	for i, c := range held {
		if err := ft.f.Apply(context.Background(), c); err != nil {
			t.Fatal(err)
		}
		ft.same(fmt.Sprintf("service chain: change %d of %d after a later read", i+1, len(held)))
	}

	// A service chain deleted as kube-proxy does: flushed, then removed.
	nftnltest.LoadIPTablesSave(t, []byte("*nat\n:KUBE-SERVICES - [0:0]\n"+kubeServices(t, "KUBE-SVL-T4KSMH6CJWHYYXER")+":KUBE-SVL-T4KSMH6CJWHYYXER - [0:0]\n-X KUBE-SVL-T4KSMH6CJWHYYXER\nCOMMIT\n"), false, "--noflush")
	ft.step("service chain deleted")

	// The table whole again (no --noflush): its chains all change at once.
	nftnltest.LoadIPTablesSave(t, readFile(t, natCapture), false)
	ft.step("table restored")

	// KUBE-SERVICES deleted with the rest of kube-proxy's chains, then written again.
	nftnltest.Flush(t)
	ft.step("table flushed")
	nftnltest.LoadIPTablesSave(t, readFile(t, natCapture), false)
	ft.step("table loaded again")
	nftnltest.LoadIPTablesSave(t, []byte("*nat\n:KUBE-SERVICES - [0:0]\n"+moved+"COMMIT\n"), false, "--noflush")
	wantReads(t, "dispatch moved after reload", ft.step("dispatch moved after reload"), 0, servicesDumps, 0)
}

// TestKernelFollowKubeProxyNFT follows nftables mode's partial syncs: a service chain flushed
// and written again with a new anonymous map, a service-ips element changed, the affinity form
// (endpoint chains behind a verdict map) added and one endpoint chain rewritten, a service
// removed.
func TestKernelFollowKubeProxyNFT(t *testing.T) {
	needNetns(t)
	t.Run("maps dumped", func(t *testing.T) { followKubeProxyNFT(t, false) })
	t.Run("maps from the watch", func(t *testing.T) { followKubeProxyNFT(t, true, FollowNFTMaps()) })
}

// followKubeProxyNFT replays kube-proxy's partial syncs in nftables mode; with maps, the watch
// keeps the anonymous maps' elements (FollowNFTMaps) and no map a commit created is dumped.
func followKubeProxyNFT(t *testing.T, maps bool, opts ...WatchOption) {
	nftnltest.Flush(t)
	nftnltest.LoadNFT(t, genNFT(5))
	ft := newFollowTest(t, opts...)
	// created is the element dumps of a commit that created one anonymous map.
	created := uint64(1)
	if maps {
		created = 0
	}
	ft.same("initial read")

	nftnltest.LoadNFT(t, []byte(`flush chain ip kube-proxy service-00000001-ns/svc1/tcp/http
add rule ip kube-proxy service-00000001-ns/svc1/tcp/http meta l4proto tcp dnat ip to numgen random mod 2 map { 0 : 10.1.1.1 . 8080, 1 : 10.1.1.2 . 8080 }
`))
	// The chain, and its new map.
	wantReads(t, "service chain rewritten", ft.step("service chain rewritten"), 0, 1, created)

	// kube-proxy v1.37 writes a service chain with one endpoint as a plain dnat, no map
	// (writeServiceToEndpointDNATs).
	nftnltest.LoadNFT(t, []byte(`flush chain ip kube-proxy service-00000001-ns/svc1/tcp/http
add rule ip kube-proxy service-00000001-ns/svc1/tcp/http meta l4proto tcp dnat to 10.1.1.7:8080
`))
	wantReads(t, "one endpoint, a plain dnat", ft.step("one endpoint, a plain dnat"), 0, 1, 0)
	if pt, _ := ft.f.KubeProxyNFT(false); !slices.Equal(pt.Chains["service-00000001-ns/svc1/tcp/http"], []netip.AddrPort{netip.MustParseAddrPort("10.1.1.7:8080")}) {
		t.Errorf("service 1 with one endpoint: %v, want 10.1.1.7:8080", pt.Chains["service-00000001-ns/svc1/tcp/http"])
	}

	nftnltest.LoadNFT(t, []byte(`delete element ip kube-proxy service-ips { 10.96.0.2 . tcp . 80 }
add element ip kube-proxy service-ips { 10.96.0.2 . tcp . 81 : goto service-00000002-ns/svc2/tcp/http }
`))
	wantReads(t, "service-ips element changed", ft.step("service-ips element changed"), 0, 0, 1)

	nftnltest.LoadNFT(t, []byte(`add chain ip kube-proxy endpoint-aaaa
add rule ip kube-proxy endpoint-aaaa meta l4proto tcp dnat ip to 10.9.9.9:80
add chain ip kube-proxy endpoint-bbbb
add rule ip kube-proxy endpoint-bbbb meta l4proto tcp dnat ip to 10.9.9.8:80
add set ip kube-proxy affinity-aaaa { type ipv4_addr; flags dynamic,timeout; timeout 3h; }
flush chain ip kube-proxy service-00000000-ns/svc0/tcp/http
add rule ip kube-proxy service-00000000-ns/svc0/tcp/http ip saddr @affinity-aaaa goto endpoint-aaaa
add rule ip kube-proxy service-00000000-ns/svc0/tcp/http numgen random mod 2 vmap { 0 : goto endpoint-aaaa, 1 : goto endpoint-bbbb }
`))
	if got := ft.step("affinity form"); got.ElementDumps != created {
		t.Errorf("affinity form: %d element dumps, want %d (its vmap)", got.ElementDumps, created)
	}

	// Two syncs followed at once: the first rewrites service 1's chain, the second service
	// 2's, whose new map may take the name the first one freed (the kernel gives an anonymous
	// set the lowest free number).
	nftnltest.LoadNFT(t, []byte(`flush chain ip kube-proxy service-00000001-ns/svc1/tcp/http
add rule ip kube-proxy service-00000001-ns/svc1/tcp/http meta l4proto tcp dnat ip to numgen random mod 2 map { 0 : 10.1.1.3 . 8080, 1 : 10.1.1.4 . 8080 }
`))
	nftnltest.LoadNFT(t, []byte(`flush chain ip kube-proxy service-00000001-ns/svc1/tcp/http
add rule ip kube-proxy service-00000001-ns/svc1/tcp/http meta l4proto tcp dnat to 10.1.1.5:8080
flush chain ip kube-proxy service-00000002-ns/svc2/tcp/http
add rule ip kube-proxy service-00000002-ns/svc2/tcp/http meta l4proto tcp dnat ip to numgen random mod 3 map { 0 : 10.2.2.1 . 8080, 1 : 10.2.2.2 . 8080, 2 : 10.2.2.3 . 8080 }
`))
	if got := ft.step("two syncs at once"); got.ElementDumps != created {
		t.Errorf("two syncs at once: %d element dumps, want %d", got.ElementDumps, created)
	}

	nftnltest.LoadNFT(t, []byte(`flush chain ip kube-proxy endpoint-aaaa
add rule ip kube-proxy endpoint-aaaa meta l4proto tcp dnat ip to 10.9.9.10:80
`))
	// Only the endpoint chain: the service chain's endpoints are recomputed from the state.
	wantReads(t, "endpoint chain rewritten", ft.step("endpoint chain rewritten"), 0, 1, 0)
	if pt, _ := ft.f.KubeProxyNFT(false); !slices.Contains(pt.Chains["service-00000000-ns/svc0/tcp/http"], netip.MustParseAddrPort("10.9.9.10:80")) {
		t.Errorf("service 0 does not DNAT to the rewritten endpoint: %v", pt.Chains["service-00000000-ns/svc0/tcp/http"])
	}

	nftnltest.LoadNFT(t, []byte(`delete element ip kube-proxy service-ips { 10.96.0.3 . tcp . 80 }
flush chain ip kube-proxy service-00000003-ns/svc3/tcp/http
delete chain ip kube-proxy service-00000003-ns/svc3/tcp/http
`))
	// The deleted chain is not read: gone, it has no rules.
	wantReads(t, "service removed", ft.step("service removed"), 0, 0, 1)

	nftnltest.LoadNFT(t, []byte("delete table ip kube-proxy\n"))
	wantReads(t, "table deleted", ft.step("table deleted"), 1, 0, 0)
	nftnltest.LoadNFTJSON(t, readFile(t, nftCapture))
	ft.step("capture loaded")
}

// A commit that creates more map elements than the watch keeps has its maps dumped.
func TestKernelFollowNFTMapsPastTheBound(t *testing.T) {
	needNetns(t)
	defer func(n int) { maxKeptElements = n }(maxKeptElements)
	maxKeptElements = 1
	nftnltest.Flush(t)
	nftnltest.LoadNFT(t, genNFT(2))
	ft := newFollowTest(t, FollowNFTMaps())
	nftnltest.LoadNFT(t, []byte(`flush chain ip kube-proxy service-00000001-ns/svc1/tcp/http
add rule ip kube-proxy service-00000001-ns/svc1/tcp/http meta l4proto tcp dnat ip to numgen random mod 2 map { 0 : 10.1.1.1 . 8080, 1 : 10.1.1.2 . 8080 }
`))
	wantReads(t, "two elements, one kept at most", ft.step("two elements, one kept at most"), 0, 1, 1)
}
