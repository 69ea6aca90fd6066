package nftnl

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/proxyhealth/proxyhealth/internal/nftnl/nftnltest"
	"github.com/proxyhealth/proxyhealth/internal/ruleset"
	"github.com/proxyhealth/proxyhealth/internal/testsupport/iptables"
	"github.com/proxyhealth/proxyhealth/internal/testsupport/nft"
)

// invalidDropFixture is one ruleset of the text readers' tests, loaded into the kernel: the
// iptables-save text through iptables-nft-restore, or the nft script (or JSON).
type invalidDropFixture struct {
	name string // also names the replay file
	path string
	kind string // "iptables", "nft", "nft-json"
}

func invalidDropFixtures(t *testing.T) []invalidDropFixture {
	t.Helper()
	var out []invalidDropFixture
	for _, dir := range []string{"../testsupport/iptables/testdata", "../../collectors/node/testdata"} {
		files, _ := filepath.Glob(filepath.Join(dir, "*.txt"))
		for _, f := range files {
			if strings.Contains(f, "legacy") && strings.Contains(f, "empty") {
				continue // no filter table at all: nothing to load
			}
			if bytes.Contains(readFile(t, f), []byte("the kernel refuses jump loops")) {
				continue // hand-written cycles the kernel rejects (ELOOP); ruleset's tests cover them
			}
			out = append(out, invalidDropFixture{"iptables-" + strings.TrimSuffix(filepath.Base(f), ".txt"), f, "iptables"})
		}
	}
	for _, dir := range []string{"../testsupport/nft/testdata", "../../collectors/node/testdata"} {
		files, _ := filepath.Glob(filepath.Join(dir, "*.json"))
		for _, f := range files {
			base := strings.TrimSuffix(f, ".json")
			fx := invalidDropFixture{"nft-" + filepath.Base(base), f, "nft-json"}
			if _, err := os.Stat(base + ".nft"); err == nil {
				fx.kind = "nft"
			} else if bytes.Contains(readFile(t, f), []byte(`"xt"`)) {
				continue // x_tables expressions without their arguments cannot be loaded
			}
			out = append(out, fx)
		}
	}
	return out
}

// expected is what the text readers find in the fixture's text: iptables-nft's filter table
// (for an iptables-save fixture) and the native tables (for an nft one).
func (fx invalidDropFixture) expected(t *testing.T) bool {
	t.Helper()
	b := readFile(t, fx.path)
	if fx.kind == "iptables" {
		rs, err := iptables.Parse(bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		found, _ := rs.InvalidDropReachable("filter", "FORWARD")
		return found
	}
	rs, err := nft.Parse(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	found, _ := nft.InvalidDropReachable(rs)
	return found
}

func (fx invalidDropFixture) load(t *testing.T) {
	t.Helper()
	nftnltest.Flush(t)
	switch fx.kind {
	case "iptables":
		nftnltest.LoadIPTablesSave(t, readFile(t, fx.path), false)
	case "nft":
		nftnltest.LoadNFT(t, readFile(t, strings.TrimSuffix(fx.path, ".json")+".nft"))
	default:
		nftnltest.LoadNFTJSON(t, readFile(t, fx.path))
	}
}

// found reports what the graphs of the fixture's kind say: iptables-nft's filter graph for an
// iptables fixture, the native graphs for an nft one.
func (fx invalidDropFixture) found(gs []*ruleset.Graph) (bool, []string) {
	for _, g := range gs {
		if strings.HasSuffix(g.Name, "tables-nft filter") != (fx.kind == "iptables") {
			continue
		}
		if p := g.InvalidDropPath(); p != nil {
			return true, p
		}
	}
	return false, nil
}

func TestKernelForwardGraphsMatchTextReaders(t *testing.T) {
	needNetns(t)
	for _, fx := range invalidDropFixtures(t) {
		t.Run(fx.name, func(t *testing.T) {
			fx.load(t)
			q, save := kernelQuerier(t)
			gs, err := forwardGraphs(context.Background(), q)
			if err != nil {
				t.Fatal(err)
			}
			save("testdata/graph-" + fx.name + ".replay.json")
			got, path := fx.found(gs)
			if want := fx.expected(t); got != want {
				t.Errorf("INVALID drop found = %v (path %q), the text reader says %v", got, path, want)
			}
			t.Logf("found %v: %q", got, path)
		})
	}
}

// forwardGraphs is one whole read of the forward graphs on q, as a ForwardReader's first.
func forwardGraphs(ctx context.Context, q querier) ([]*ruleset.Graph, error) {
	var graphs []*ruleset.Graph
	err := consistently(ctx, q, func() error {
		var err error
		_, graphs, err = forwardTablesAndGraphs(ctx, q)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("read forward path rules: %w", err)
	}
	return nonNil(graphs), nil
}
