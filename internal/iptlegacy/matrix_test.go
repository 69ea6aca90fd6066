package iptlegacy

import (
	"fmt"
	"testing"

	"github.com/proxyhealth/proxyhealth/internal/kpcapture"
)

// The version matrix: kube-proxy's nat tables as each version wrote them in iptables mode with
// the legacy backend, both families (kpcapture, written by the lab's
// TestCaptureKubeProxyRules). Each is a fixture: TestKernelFixtures loads it with
// iptables-legacy-restore and, with -update, stores its blob; TestDecodeFixtures decodes the blob
// against the text readers, and TestDecodeMatrix against what kube-proxy programmed.

// matrixCaptures are the iptables-legacy captures.
func matrixCaptures() ([]kpcapture.Capture, error) {
	all, err := kpcapture.Captures("../..")
	if err != nil {
		return nil, err
	}
	var out []kpcapture.Capture
	for _, c := range all {
		if c.Mode == kpcapture.IPTablesLegacy {
			out = append(out, c)
		}
	}
	return out, nil
}

func matrixFixture(c kpcapture.Capture, ipv6 bool) fixture {
	return fixture{
		name:   fmt.Sprintf("matrix-%s-%s", c.Version, kpcapture.Family(ipv6)),
		path:   c.File(kpcapture.RulesFile(c.Mode, ipv6)),
		ipv6:   ipv6,
		tables: []string{"nat"},
	}
}

func init() {
	cs, err := matrixCaptures()
	if err != nil {
		panic(fmt.Sprintf("the version matrix's captures: %v", err))
	}
	for _, c := range cs {
		fixtures = append(fixtures, matrixFixture(c, false), matrixFixture(c, true))
	}
}

func TestDecodeMatrix(t *testing.T) {
	cs, err := matrixCaptures()
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) == 0 {
		t.Fatalf("no iptables-legacy captures under %s", kpcapture.Dir)
	}
	for _, c := range cs {
		want, err := c.Load()
		if err != nil {
			t.Fatal(err)
		}
		for _, ipv6 := range []bool{false, true} {
			f := matrixFixture(c, ipv6)
			t.Run(f.name, func(t *testing.T) {
				info, blob := loadBlob(t, f.blobPath("nat"), ipv6)
				pt, _, err := decodeNAT(info, blob, nil)
				if err != nil {
					t.Fatal(err)
				}
				if d := want.Families[kpcapture.Family(ipv6)].Compare(pt); d != "" {
					t.Errorf("decoded from %s:\n%s", f.blobPath("nat"), d)
				}
			})
		}
	}
}
