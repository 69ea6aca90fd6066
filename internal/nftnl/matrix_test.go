package nftnl

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/proxyhealth/proxyhealth/internal/kpcapture"
	"github.com/proxyhealth/proxyhealth/internal/nftnl/nftnltest"
	"github.com/proxyhealth/proxyhealth/internal/ruleset"
)

// The version matrix: kube-proxy's rules as each version wrote them in iptables mode with the
// nft backend and in nftables mode, both families (kpcapture, written by the lab's
// TestCaptureKubeProxyRules). TestKernelMatrix loads each into the kernel and reads it back;
// with -update it records the kernel's replies in testdata/matrix/, which TestReplayMatrix
// decodes without root. Both compare with what the capture says kube-proxy programmed.

// matrixCaptures are the captures this package reads: the modes whose rules are nf_tables.
func matrixCaptures(t *testing.T) []kpcapture.Capture {
	t.Helper()
	all, err := kpcapture.Captures("../..")
	if err != nil {
		t.Fatal(err)
	}
	var out []kpcapture.Capture
	for _, c := range all {
		if c.Mode == kpcapture.IPTablesNFT || c.Mode == kpcapture.NFTables {
			out = append(out, c)
		}
	}
	if len(out) == 0 {
		t.Fatalf("no captures under %s", kpcapture.Dir)
	}
	return out
}

func matrixReplay(c kpcapture.Capture, ipv6 bool) string {
	return filepath.Join("testdata", "matrix", fmt.Sprintf("%s-%s-%s.replay.json", c.Version, c.Mode, kpcapture.Family(ipv6)))
}

// readMatrix reads one family of a capture's mode through q.
func readMatrix(c kpcapture.Capture, q querier, ipv6 bool) (*ruleset.ProxyTable, error) {
	if c.Mode == kpcapture.NFTables {
		return readKubeProxyNFT(context.Background(), q, nfproto(ipv6))
	}
	return readIPTablesNAT(context.Background(), q, nfproto(ipv6))
}

func TestKernelMatrix(t *testing.T) {
	needNetns(t)
	for _, c := range matrixCaptures(t) {
		want, err := c.Load()
		if err != nil {
			t.Fatal(err)
		}
		for _, ipv6 := range []bool{false, true} {
			t.Run(c.Version+"/"+c.Mode+"/"+kpcapture.Family(ipv6), func(t *testing.T) {
				nftnltest.Flush(t)
				text := readFile(t, c.File(kpcapture.RulesFile(c.Mode, ipv6)))
				if c.Mode == kpcapture.NFTables {
					nftnltest.LoadNFTJSON(t, text)
				} else {
					nftnltest.LoadIPTablesSave(t, text, ipv6)
				}
				q, save := kernelQuerier(t)
				pt, err := readMatrix(c, q, ipv6)
				if err != nil {
					t.Fatal(err)
				}
				if d := want.Families[kpcapture.Family(ipv6)].Compare(pt); d != "" {
					t.Errorf("read from the kernel:\n%s", d)
				}
				save(matrixReplay(c, ipv6))
			})
		}
	}
}

func TestReplayMatrix(t *testing.T) {
	for _, c := range matrixCaptures(t) {
		want, err := c.Load()
		if err != nil {
			t.Fatal(err)
		}
		for _, ipv6 := range []bool{false, true} {
			t.Run(c.Version+"/"+c.Mode+"/"+kpcapture.Family(ipv6), func(t *testing.T) {
				path := matrixReplay(c, ipv6)
				if _, err := os.Stat(path); err != nil {
					t.Fatalf("no recording of the capture (test/kube/capture.sh records it): %v", err)
				}
				pt, err := readMatrix(c, loadReplay(t, path), ipv6)
				if err != nil {
					t.Fatal(err)
				}
				if d := want.Families[kpcapture.Family(ipv6)].Compare(pt); d != "" {
					t.Errorf("decoded from %s:\n%s", path, d)
				}
			})
		}
	}
}
