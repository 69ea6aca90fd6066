package nftnl

import (
	"context"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/proxyhealth/proxyhealth/internal/nftnl/nftnltest"
)

// dropPath is the INVALID drop path of the first graph, nil when there is none.
func dropPath(t *testing.T, r *ForwardReader, changes []Change) []string {
	t.Helper()
	graphs, err := r.Read(context.Background(), changes)
	if err != nil {
		t.Fatal(err)
	}
	if len(graphs) != 1 {
		t.Fatalf("%d forward graphs, want 1 (iptables-nft's filter table)", len(graphs))
	}
	return graphs[0].InvalidDropPath()
}

// A ForwardReader reads a forward table again only when a change touched it, and lists the
// base chains again when a change may have added or removed one.
func TestKernelForwardReaderFollowsChanges(t *testing.T) {
	needNetns(t)
	nftnltest.Flush(t)
	iptablesNFT(t, "-t", "filter", "-N", "KUBE-FORWARD")
	iptablesNFT(t, "-t", "filter", "-A", "FORWARD", "-j", "KUBE-FORWARD")
	iptablesNFT(t, "-t", "filter", "-A", "KUBE-FORWARD", "-m", "conntrack", "--ctstate", "INVALID", "-j", "DROP")
	iptablesNFT(t, "-t", "nat", "-N", "KUBE-SERVICES")
	var r ForwardReader
	defer r.Close()
	if p := dropPath(t, &r, nil); p == nil {
		t.Fatal("no INVALID drop path on the first read")
	}
	filter := Table{Family: unix.NFPROTO_IPV4, Name: "filter"}
	nat := Table{Family: unix.NFPROTO_IPV4, Name: "nat"}

	iptablesNFT(t, "-t", "filter", "-F", "KUBE-FORWARD")
	// A change elsewhere: the filter table is not read again (the reader keeps its graph,
	// though the kernel's has changed behind its back, which the watch would have told).
	natOnly := []Change{{Tables: []Table{nat}, Details: []TableChange{{Table: nat, Chains: []string{"KUBE-SERVICES"}}}}}
	if p := dropPath(t, &r, natOnly); p == nil {
		t.Error("a change to the nat table alone read the filter table again")
	}
	// The change to the filter table: read again, the drop rule is gone.
	filterChange := []Change{{Tables: []Table{filter}, Details: []TableChange{{Table: filter, Chains: []string{"KUBE-FORWARD"}}}}}
	if p := dropPath(t, &r, filterChange); p != nil {
		t.Errorf("after the filter table's change: drop path %q, want none", p)
	}
	// A base chain event lists the tables again: a native table's forward chain appears.
	nftnltest.LoadNFT(t, []byte("table inet guard {\nchain forwarding {\ntype filter hook forward priority 0; policy accept;\nct state invalid drop\n}\n}\n"))
	guard := Table{Family: unix.NFPROTO_INET, Name: "guard"}
	created := []Change{{Tables: []Table{guard}, Details: []TableChange{{Table: guard, Chains: []string{"forwarding"}, ChainEvents: []string{"forwarding"}, BaseChainEvent: true}}}}
	graphs, err := r.Read(context.Background(), created)
	if err != nil {
		t.Fatal(err)
	}
	if len(graphs) != 2 {
		t.Fatalf("after a new forward base chain: %d graphs, want 2", len(graphs))
	}
}

// The watch tells a base chain's creation apart from a regular chain's.
func TestKernelWatchBaseChainEvent(t *testing.T) {
	needNetns(t)
	nftnltest.Flush(t)
	nftnltest.LoadNFT(t, []byte("table inet guard {\nchain regular {\n}\n}\n"))
	ctx, cancel := context.WithCancel(context.Background())
	guard := Table{Family: unix.NFPROTO_INET, Name: "guard"}
	w, err := Watch(ctx, func(tb Table) bool { return tb == guard })
	if err != nil {
		t.Fatal(err)
	}
	defer stopped(t, cancel, w)
	nftnltest.LoadNFT(t, []byte("add chain inet guard another\n"))
	c, _ := next(t, w)
	if d := c.Touched(guard); d == nil || d.BaseChainEvent {
		t.Errorf("a regular chain created: detail %+v, want no base chain event", d)
	}
	nftnltest.LoadNFT(t, []byte("add chain inet guard forwarding { type filter hook forward priority 0; }\n"))
	c, _ = next(t, w)
	if d := c.Touched(guard); d == nil || !d.BaseChainEvent {
		t.Errorf("a base chain created: detail %+v, want a base chain event", d)
	}
}
