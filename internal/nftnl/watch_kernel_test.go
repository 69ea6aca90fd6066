package nftnl

import (
	"context"
	"os/exec"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/proxyhealth/proxyhealth/internal/nftnl/nftnltest"
)

func iptablesNFT(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("iptables-nft", args...).CombinedOutput(); err != nil {
		t.Fatalf("iptables-nft %v: %v: %s", args, err, out)
	}
}

// next waits (bounded) for the next change.
func next(t *testing.T, w *Watcher) (Change, bool) {
	t.Helper()
	select {
	case c, ok := <-w.C:
		return c, ok
	case <-time.After(5 * time.Second):
		t.Fatal("no change within 5s")
	}
	return Change{}, false
}

func stopped(t *testing.T, cancel context.CancelFunc, w *Watcher) {
	t.Helper()
	cancel()
	select {
	case <-w.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the watch goroutine did not stop within 5s of cancel")
	}
	for range w.C { // closed: drains what was buffered and ends
	}
	if err := w.Err(); err != nil {
		t.Errorf("Err() after cancel = %v, want nil", err)
	}
}

func TestKernelWatch(t *testing.T) {
	needNetns(t)
	nftnltest.Flush(t)
	ctx, cancel := context.WithCancel(context.Background())
	natV4 := Table{Family: unix.NFPROTO_IPV4, Name: "nat"}
	w, err := Watch(ctx, func(tb Table) bool { return tb == natV4 })
	if err != nil {
		t.Fatal(err)
	}
	defer stopped(t, cancel, w)

	gen0, err := Generation(ctx)
	if err != nil {
		t.Fatal(err)
	}
	iptablesNFT(t, "-t", "filter", "-N", "OTHER") // not of interest: no change reported
	iptablesNFT(t, "-t", "nat", "-N", "KUBE-SERVICES")
	c, _ := next(t, w)
	if c.Resync || !slices.Equal(c.Tables, []Table{natV4}) || c.Generation != gen0+2 {
		t.Errorf("change %+v, want ip nat at generation %d", c, gen0+2)
	}
	iptablesNFT(t, "-t", "nat", "-A", "KUBE-SERVICES", "-d", "10.96.0.10/32", "-p", "udp", "-m", "udp", "--dport", "53", "-j", "ACCEPT")
	if c, _ := next(t, w); c.Generation != gen0+3 || c.Resync {
		t.Errorf("change %+v, want generation %d", c, gen0+3)
	}
	if w.Gaps() != 0 || w.Overruns() != 0 {
		t.Errorf("gaps %d overruns %d, want none", w.Gaps(), w.Overruns())
	}
}

// A receive buffer too small for a commit's events overruns: the watch reports a Resync,
// counts it, and goes on.
func TestKernelWatchOverrun(t *testing.T) {
	needNetns(t)
	nftnltest.Flush(t)
	saved := watchRecvBuffer
	watchRecvBuffer = 4096
	// The reader waits until the burst is in: a reader that keeps up would see no overrun.
	loaded := make(chan struct{})
	watchBeforeReceive = func() { <-loaded }
	defer func() { watchRecvBuffer, watchBeforeReceive = saved, nil }()
	ctx, cancel := context.WithCancel(context.Background())
	w, err := Watch(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer stopped(t, cancel, w)
	nftnltest.LoadIPTablesSave(t, readFile(t, natCapture), false) // ~150 rules' events at once
	close(loaded)
	resync := false
	for i := 0; i < 50 && !resync; i++ {
		c, ok := next(t, w)
		if !ok {
			t.Fatalf("watch ended: %v", w.Err())
		}
		resync = c.Resync
	}
	if !resync || w.Overruns() == 0 {
		t.Fatalf("no overrun reported (overruns %d)", w.Overruns())
	}
	// It goes on: the next commit is reported (perhaps with a gap, its predecessor lost).
	iptablesNFT(t, "-t", "nat", "-N", "AFTER-OVERRUN")
	for i := 0; i < 50; i++ {
		if c, _ := next(t, w); !c.Resync && len(c.Tables) > 0 {
			return
		}
	}
	t.Error("no change after the overrun")
}

// A datagram longer than the watch's buffer loses its end: the watch asks for a resync.
func TestKernelWatchTruncated(t *testing.T) {
	needNetns(t)
	nftnltest.Flush(t)
	saved := watchDatagramBytes
	watchDatagramBytes = 64 // shorter than any rule message
	defer func() { watchDatagramBytes = saved }()
	ctx, cancel := context.WithCancel(context.Background())
	w, err := Watch(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer stopped(t, cancel, w)
	iptablesNFT(t, "-t", "nat", "-A", "POSTROUTING", "-j", "ACCEPT")
	c, ok := next(t, w)
	if !ok {
		t.Fatalf("watch ended: %v", w.Err())
	}
	if !c.Resync || c.Reason != "truncated datagram" || w.Overruns() == 0 {
		t.Errorf("change %+v (overruns %d), want a resync for a truncated datagram", c, w.Overruns())
	}
}

// Each Change says which chains and sets of its tables the commit touched.
func TestKernelWatchDetail(t *testing.T) {
	needNetns(t)
	nftnltest.Flush(t)
	nftnltest.LoadNFT(t, []byte(`table ip kube-proxy {
map service-ips {
type ipv4_addr . inet_proto . inet_service : verdict
}
chain service-a/ns/x/tcp/p {
meta l4proto tcp dnat ip to numgen random mod 1 map { 0 : 10.0.0.1 . 80 }
}
chain services {
ip daddr . meta l4proto . th dport vmap @service-ips
}
}
table ip other {
chain c {
}
}
`))
	ctx, cancel := context.WithCancel(context.Background())
	kp := Table{Family: unix.NFPROTO_IPV4, Name: "kube-proxy"}
	w, err := Watch(ctx, func(tb Table) bool { return tb == kp })
	if err != nil {
		t.Fatal(err)
	}
	defer stopped(t, cancel, w)
	nftnltest.LoadNFT(t, []byte(`add rule ip other c accept
flush chain ip kube-proxy service-a/ns/x/tcp/p
add rule ip kube-proxy service-a/ns/x/tcp/p meta l4proto tcp dnat ip to numgen random mod 2 map { 0 : 10.0.0.1 . 80, 1 : 10.0.0.2 . 80 }
add element ip kube-proxy service-ips { 10.96.0.1 . tcp . 80 : goto service-a/ns/x/tcp/p }
add chain ip kube-proxy endpoint-new
`))
	c, _ := next(t, w)
	d := c.Touched(kp)
	if d == nil || len(c.Details) != 1 {
		t.Fatalf("change %+v: no detail for %v alone", c, kp)
	}
	if !slices.Equal(d.Chains, []string{"service-a/ns/x/tcp/p", "endpoint-new"}) || !slices.Equal(d.ChainEvents, []string{"endpoint-new"}) {
		t.Errorf("chains %q, chain events %q", d.Chains, d.ChainEvents)
	}
	// The old rule's anonymous map goes, the new one comes, and service-ips changes.
	if !slices.Contains(d.Sets, "service-ips") || len(d.Sets) < 2 || d.TableEvent || d.Overflow || d.Other {
		t.Errorf("detail %+v", d)
	}
}
