package nftnl

import (
	"context"
	"fmt"
	"reflect"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/proxyhealth/proxyhealth/internal/nftnl/nftnltest"
)

// committingQuerier answers from q, and runs commit before each element dump that commitAt
// picks: a kube-proxy sync landing in the middle of a read.
type committingQuerier struct {
	q        querier
	commitAt func(dump int) bool // nil: no more commits
	commit   func(n int)
	dumps    int // element dumps asked
	commits  int
}

func (c *committingQuerier) query(ctx context.Context, req request, fn func(message) error) error {
	if req.typ == unix.NFT_MSG_GETSETELEM && req.dump {
		if c.commitAt != nil && c.commitAt(c.dumps) {
			c.commit(c.commits)
			c.commits++
		}
		c.dumps++
	}
	return c.q.query(ctx, req, fn)
}

// kube-proxy syncs during the Follower's whole read of its nftables table, between the read's
// map dumps, in every read a retry would start: the read completes the first time, each map
// dumped once, and with the changes the watch saw applied after it the Follower's table equals
// a fresh read.
func TestKernelFollowNFTWholeReadUnderCommits(t *testing.T) {
	needNetns(t)
	const services = 20
	nftnltest.Flush(t)
	nftnltest.LoadNFT(t, genNFT(services))
	// Each sync rewrites one service's chain with a new map of two new endpoints: the old map
	// goes, and its name may be given to the new one.
	cq := &committingQuerier{commitAt: func(dump int) bool { return dump%10 == 5 }, commit: func(n int) {
		svc := n % services
		chain := fmt.Sprintf("service-%08d-ns/svc%d/tcp/http", svc, svc)
		nftnltest.LoadNFT(t, fmt.Appendf(nil, "flush chain ip kube-proxy %s\nadd rule ip kube-proxy %s meta l4proto tcp dnat ip to numgen random mod 2 map { 0 : 10.200.%d.1 . 8080, 1 : 10.200.%d.2 . 8080 }\n", chain, chain, n, n))
	}}
	ft := newFollowTestVia(t, func(q querier) querier { cq.q = q; return cq }, FollowNFTMaps())
	cq.commitAt = nil
	// One dump per service's map and one of service-ips: nothing read twice.
	if cq.commits < 2 || cq.dumps != services+1 {
		t.Fatalf("%d commits during the read, %d element dumps: want 2 or more, and %d", cq.commits, cq.dumps, services+1)
	}
	if _, err := ft.f.KubeProxyNFT(false); err != nil {
		t.Fatal(err)
	}
	ft.step("the syncs during the read applied")
}

// A commit that cuts one of the whole read's dumps (the rules, a map's elements) has that dump
// alone asked again, the read not started over, and the table read equals an uncut read.
func TestFollowNFTWholeReadRetriesCutDumps(t *testing.T) {
	const path = "testdata/kube-proxy-v1.36.3-nftables.replay.json"
	read := func(q querier) *followed {
		t.Helper()
		f := newFollower(q, nil)
		for _, ft := range f.tables {
			if ft.kind == kindNFT && ft.table.Family == nfproto(false) {
				if err := f.full(context.Background(), ft); err != nil {
					t.Fatal(err)
				}
				return ft
			}
		}
		t.Fatal("no IPv4 kube-proxy table followed")
		return nil
	}
	uncut := &interruptingQuerier{q: loadReplay(t, path)}
	want := read(uncut).snap.Content()
	// Cut the rule dump, then the first map's dump.
	iq := &interruptingQuerier{q: loadReplay(t, path), interrupt: func(iq *interruptingQuerier) bool { return iq.dump == 0 || iq.dump == 2 }}
	got := read(iq).snap.Content()
	// Each cut dump is asked once more; the read is not started over.
	if iq.interrupted != 2 || iq.dumps != uncut.dumps+2 {
		t.Fatalf("%d dumps cut, %d asked: want 2, and %d", iq.interrupted, iq.dumps, uncut.dumps+2)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("whole read with cut dumps:\n got %+v\nwant %+v", got, want)
	}
}
