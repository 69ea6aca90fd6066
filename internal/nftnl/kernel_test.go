package nftnl

import (
	"context"
	"os"
	"testing"

	"github.com/proxyhealth/proxyhealth/internal/nftnl/nftnltest"
	"github.com/proxyhealth/proxyhealth/internal/testsupport/prereq"
)

func TestMain(m *testing.M) {
	nftnltest.ReexecInNetns()
	os.Exit(m.Run())
}

func needNetns(t *testing.T) {
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
