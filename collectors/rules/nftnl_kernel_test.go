package rules

import (
	"bytes"
	"context"
	"net/netip"
	"os"
	"slices"
	"testing"

	"github.com/proxyhealth/proxyhealth/internal/nftnl"
	"github.com/proxyhealth/proxyhealth/internal/nftnl/nftnltest"
	"github.com/proxyhealth/proxyhealth/internal/testsupport/nft"
	"github.com/proxyhealth/proxyhealth/internal/testsupport/prereq"
)

// The netlink readers of internal/nftnl, given the real kube-proxy v1.36.3 captures loaded into
// the kernel, find the same service chains and endpoints as this package's text readers find
// in the captures themselves.

func TestNFTNLMatchesIPTablesTextReader(t *testing.T) {
	if !nftnltest.InNetns() {
		prereq.Skip(t, "needs root and unshare(1) to run in a network namespace of its own")
	}
	text, err := os.ReadFile("testdata/kube-proxy-v1.36.3/iptables-save-nat.txt")
	if err != nil {
		t.Fatal(err)
	}
	want, _, err := readIPTablesNAT(bytes.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	nftnltest.Flush(t)
	nftnltest.LoadIPTablesSave(t, text, false)
	got, err := nftnl.ReadIPTablesNAT(context.Background(), false, nftnl.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	// The text reader lists every declared service chain; netlink sees the chains with rules,
	// which in a kube-proxy table are all of them.
	if len(got.Chains) != len(want.chains) {
		t.Errorf("%d service chains, the text reader %d", len(got.Chains), len(want.chains))
	}
	for chain, eps := range want.chains {
		slices.SortFunc(eps, netip.AddrPort.Compare)
		if g := got.Chains[chain]; !slices.Equal(g, slices.Compact(eps)) {
			t.Errorf("%s: netlink %v, text %v", chain, g, eps)
		}
	}
}

func TestNFTNLMatchesNFTablesTextReader(t *testing.T) {
	if !nftnltest.InNetns() {
		prereq.Skip(t, "needs root and unshare(1) to run in a network namespace of its own")
	}
	doc, err := os.ReadFile("testdata/kube-proxy-v1.36.3-nftables/nft-list-table-ip-kube-proxy.json")
	if err != nil {
		t.Fatal(err)
	}
	rs, err := nft.Parse(bytes.NewReader(doc))
	if err != nil {
		t.Fatal(err)
	}
	want := newNFTRules(rs.Table("ip", "kube-proxy"))
	nftnltest.Flush(t)
	nftnltest.LoadNFTJSON(t, doc)
	got, err := nftnl.ReadKubeProxyNFT(context.Background(), false, nftnl.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Chains) != len(want.chains) {
		t.Errorf("%d service chains, the text reader %d", len(got.Chains), len(want.chains))
	}
	for chain, eps := range want.chains {
		if g := got.Chains[chain]; !slices.Equal(g, eps) {
			t.Errorf("%s: netlink %v, text %v", chain, g, eps)
		}
	}
	// Every service-ips element names a service chain the text reader found.
	for _, s := range got.Services {
		if _, ok := want.chains[s.Chain]; !ok {
			t.Errorf("service %+v: chain unknown to the text reader", s)
		}
	}
}

// TestMain re-runs the package's tests inside a network namespace of their own when it can
// (root and unshare(1)), so the kernel tests change rules only there.
func TestMain(m *testing.M) {
	nftnltest.ReexecInNetns()
	os.Exit(m.Run())
}
