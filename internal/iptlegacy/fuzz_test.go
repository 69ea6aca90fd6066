package iptlegacy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/proxyhealth/proxyhealth/internal/ruleset"
)

// FuzzDecode feeds arbitrary info and entries to both decoders and the INVALID-drop search:
// offsets out of range, zero-size entries, matches that overrun, jumps anywhere (cycles
// included) must end in a result or an error, never in a panic or a loop. The input is a
// struct ipt_getinfo, then the entries; the seeds are the blobs in testdata, whose last byte
// of the table name's space carries the family.
func FuzzDecode(f *testing.F) {
	paths, err := filepath.Glob("testdata/*.blob")
	if err != nil {
		f.Fatal(err)
	}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		if strings.HasPrefix(filepath.Base(p), "v6-") {
			b[tableNameLen-1] = 1
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < getInfoSize {
			return
		}
		info, err := decodeInfo(data, data[tableNameLen-1]&1 != 0)
		if err != nil {
			t.Fatal(err)
		}
		blob := data[getInfoSize:]
		released := 0
		pt, _, err := decodeNAT(&info, blob, func(upTo int) {
			if upTo < released || upTo > len(blob) {
				t.Fatalf("release(%d) after release(%d) of %d bytes", upTo, released, len(blob))
			}
			released = upTo
		})
		if err == nil && pt == nil {
			t.Fatal("decodeNAT: no table and no error")
		}
		g, err := decodeFilter(&info, blob)
		if err == nil {
			g.InvalidDropPath()
			for _, c := range g.Chains {
				for _, r := range c.Rules {
					if (r.Verdict.Kind == ruleset.Jump || r.Verdict.Kind == ruleset.Goto) && g.Chains[r.Verdict.Target] == nil {
						t.Fatalf("%s jumps to unknown chain %q", r.Desc, r.Verdict.Target)
					}
				}
			}
		}
	})
}
