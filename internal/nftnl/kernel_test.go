package nftnl

import (
	"context"
	"net/netip"
	"os"
	"testing"

	"github.com/proxyhealth/proxyhealth/internal/nftnl/nftnltest"
	"github.com/proxyhealth/proxyhealth/internal/testsupport/prereq"
)

func TestMain(m *testing.M) {
	nftnltest.ReexecInNetns()
	os.Exit(m.Run())
}

func needNetns(t testing.TB) {
	t.Helper()
	if !nftnltest.InNetns() {
		prereq.Skip(t, "needs root and unshare(1) to run in a network namespace of its own")
	}
}

func readFile(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

const (
	natCapture = "../../collectors/rules/testdata/kube-proxy-v1.36.3/iptables-save-nat.txt"
	nftCapture = "../../collectors/rules/testdata/kube-proxy-v1.36.3-nftables/nft-list-table-ip-kube-proxy.json"
)

func TestKernelIPTablesNAT(t *testing.T) {
	needNetns(t)
	nftnltest.Flush(t)
	nftnltest.LoadIPTablesSave(t, readFile(t, natCapture), false)
	q, save := kernelQuerier(t)
	pt, err := readIPTablesNAT(context.Background(), q, nfproto(false))
	if err != nil {
		t.Fatal(err)
	}
	save("testdata/kube-proxy-v1.36.3-nat.replay.json")
	t.Logf("%+v", pt)
}

func TestKernelKubeProxyNFT(t *testing.T) {
	needNetns(t)
	nftnltest.Flush(t)
	nftnltest.LoadNFTJSON(t, readFile(t, nftCapture))
	q, save := kernelQuerier(t)
	pt, err := readKubeProxyNFT(context.Background(), q, nfproto(false))
	if err != nil {
		t.Fatal(err)
	}
	save("testdata/kube-proxy-v1.36.3-nftables.replay.json")
	t.Logf("%+v", pt)
}

// kube-proxy v1.37 writes a service chain with a single endpoint as a plain dnat
// (writeServiceToEndpointDNATs), in each family's table: the whole read finds the endpoint.
func TestKernelKubeProxyNFTSingleEndpoint(t *testing.T) {
	needNetns(t)
	nftnltest.Flush(t)
	nftnltest.LoadNFT(t, []byte(`table ip kube-proxy {
	chain service-AAAAAAAA-ns/one/tcp/http {
		meta l4proto tcp dnat to 10.244.8.1:8787
	}
}
table ip6 kube-proxy {
	chain local-BBBBBBBB-ns/one/tcp/http {
		meta l4proto tcp dnat to [fd00:10:244:8::1]:8080
	}
}
`))
	for _, tc := range []struct {
		ipv6  bool
		chain string
		want  netip.AddrPort
	}{
		{false, "service-AAAAAAAA-ns/one/tcp/http", netip.MustParseAddrPort("10.244.8.1:8787")},
		{true, "local-BBBBBBBB-ns/one/tcp/http", netip.MustParseAddrPort("[fd00:10:244:8::1]:8080")},
	} {
		pt, err := ReadKubeProxyNFT(context.Background(), tc.ipv6, Limits{})
		if err != nil {
			t.Fatal(err)
		}
		if got := pt.Chains[tc.chain]; len(got) != 1 || got[0] != tc.want {
			t.Errorf("ipv6=%v: %s holds %v, want %v", tc.ipv6, tc.chain, got, tc.want)
		}
	}
}
