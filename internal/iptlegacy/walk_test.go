package iptlegacy

import (
	"bytes"
	"strings"
	"testing"
)

// Malformed blobs end in an error naming what is wrong, never in a panic.
func TestWalkMalformed(t *testing.T) {
	info, blob := loadBlob(t, "testdata/kube-proxy-nat.nat.blob", false)
	l := layoutFor(false) // the first entry starts at offset 0
	tests := []struct {
		name   string
		mutate func(in *Info, b []byte) []byte
		want   string
	}{
		{"truncated", func(_ *Info, b []byte) []byte { return b[:len(b)-1] }, "runs past"},
		{"truncated header", func(_ *Info, b []byte) []byte { return b[:50] }, "an entry header is 112"},
		{"zero-size entry", func(_ *Info, b []byte) []byte { ne.PutUint16(b[l.nextOffset:], 0); return b }, "target offset"},
		{"entry past the end", func(_ *Info, b []byte) []byte { ne.PutUint16(b[l.nextOffset:], 0xffff); return b }, "runs past"},
		{"target inside the header", func(_ *Info, b []byte) []byte { ne.PutUint16(b[l.targetOffset:], 10); return b }, "target offset"},
		{"target of size 0", func(_ *Info, b []byte) []byte {
			tgt := ne.Uint16(b[l.targetOffset:])
			ne.PutUint16(b[tgt:], 0)
			return b
		}, "target size"},
		{"entry count", func(in *Info, b []byte) []byte { in.NumEntries++; return b }, "changed while read"},
		{"hook offset", func(in *Info, b []byte) []byte { in.HookEntry[4] += 8; return b }, "builtin chains"},
		{"no closing entry", func(_ *Info, b []byte) []byte {
			return append(b, b[:ne.Uint16(b[l.nextOffset:])]...) // the first entry again
		}, "does not end with its ERROR entry"},
	}
	for _, tt := range tests {
		in := *info
		b := tt.mutate(&in, bytes.Clone(blob))
		_, _, err := decodeNAT(&in, b, nil)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: decodeNAT: %v, want an error containing %q", tt.name, err, tt.want)
		}
		if _, err := decodeFilter(&in, b); err == nil {
			t.Errorf("%s: decodeFilter: no error", tt.name)
		}
	}
}

// A jump to an offset where no chain starts is an error, as it is for iptables-save.
func TestDecodeFilterBadJump(t *testing.T) {
	info, blob := loadBlob(t, "testdata/kube-proxy.filter.blob", false)
	b := bytes.Clone(blob)
	c := cursor{blob: b, l: layoutFor(false)}
	patched := false
	for c.more() && !patched {
		e, err := c.next()
		if err != nil {
			t.Fatal(err)
		}
		if v, ok := e.target().standardVerdict(); ok && v >= 0 && int(v) != e.off+len(e.raw) {
			tgt := int(ne.Uint16(e.raw[e.l.targetOffset:]))
			ne.PutUint32(e.raw[tgt+extHeader:], uint32(v+8))
			patched = true
		}
	}
	if !patched {
		t.Fatal("no jump in the blob")
	}
	if _, err := decodeFilter(info, b); err == nil || !strings.Contains(err.Error(), "where no chain starts") {
		t.Errorf("decodeFilter: %v", err)
	}
}

// The nat decoder never looks back at the part of the blob it released: with a release after
// every entry that wipes what it is given, the result is the same.
func TestDecodeNATReleasesBehindItself(t *testing.T) {
	defer func(n int) { releaseEvery = n }(releaseEvery)
	releaseEvery = 1
	for _, path := range []string{"testdata/kube-proxy-v1.36.3.nat.blob", "testdata/v6-kube-proxy.nat.blob", "testdata/v4-odd.nat.blob"} {
		ipv6 := strings.Contains(path, "v6")
		info, blob := loadBlob(t, path, ipv6)
		want, _, err := decodeNAT(info, blob, nil)
		if err != nil {
			t.Fatal(err)
		}
		b := bytes.Clone(blob)
		released, calls := 0, 0
		got, _, err := decodeNAT(info, b, func(upTo int) {
			if upTo < released || upTo > len(b) {
				t.Errorf("%s: release(%d) after release(%d)", path, upTo, released)
			}
			clear(b[:upTo])
			released = upTo
			calls++
		})
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if calls == 0 {
			t.Errorf("%s: nothing released", path)
		}
		if d := diffProxyTables(got, want); d != "" {
			t.Errorf("%s: with release:\n%s", path, d)
		}
	}
}

func TestMappingRelease(t *testing.T) {
	m, err := newMapping(3<<20, false)
	if err != nil {
		t.Fatal(err)
	}
	defer m.free()
	for i := range m.b {
		m.b[i] = 1
	}
	m.release(2<<20 + 100)
	if m.released != 2<<20 || m.b[2<<20-1] != 0 || m.b[2<<20] != 1 {
		t.Errorf("released %d, bytes around it %d %d", m.released, m.b[2<<20-1], m.b[2<<20])
	}
	m.release(100) // already given back: nothing happens
	if m.released != 2<<20 {
		t.Errorf("released moved back to %d", m.released)
	}
	h, err := newMapping(100, true)
	if err != nil {
		t.Fatal(err)
	}
	h.release(100)
	h.free()
}

// A table large enough to matter is mapped only after the process's garbage is collected.
func TestMappingCollectsBeforeLargeTables(t *testing.T) {
	collected := 0
	defer func(old func()) { collectGarbage = old }(collectGarbage)
	collectGarbage = func() { collected++ }
	for _, tc := range []struct {
		n       int
		heap    bool
		collect int
	}{
		{collectBeforeBytes - 1, false, 0},
		{collectBeforeBytes, false, 1},
		{collectBeforeBytes, true, 0}, // the comparison's heap buffer: no mapping
	} {
		collected = 0
		m, err := newMapping(tc.n, tc.heap)
		if err != nil {
			t.Fatal(err)
		}
		m.free()
		if collected != tc.collect {
			t.Errorf("a %d byte mapping (heap %v) collected %d times, want %d", tc.n, tc.heap, collected, tc.collect)
		}
	}
}
