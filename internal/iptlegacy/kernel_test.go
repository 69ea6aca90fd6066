package iptlegacy

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/*.blob from the kernel (needs root)")

// TestKernelFixtures loads each fixture with iptables-legacy-restore into a namespace of its
// own, reads it back through the socket options and compares with the text readers, on the
// fixture's text and on iptables-legacy-save's output of what was loaded. With -update it
// stores the blobs for the unit tests.
func TestKernelFixtures(t *testing.T) {
	kernelTest(t)
	for _, f := range fixtures {
		t.Run(f.name, func(t *testing.T) {
			inFreshNetns(t, func() {
				for _, name := range nfacctNames {
					if err := addNFAcct(name); err != nil {
						t.Errorf("%v", err)
						return
					}
				}
				src := f.source(t)
				if !restore(t, f.ipv6, f.loadable(src)) {
					return
				}
				for _, table := range f.tables {
					checkKernelTable(t, &f, table, src)
				}
			})
		})
	}
}

func checkKernelTable(t *testing.T, f *fixture, table, src string) {
	saved, ok := save(t, f.ipv6, table)
	if !ok {
		return
	}
	switch table {
	case "nat":
		got, err := ReadNAT(threadProc, f.ipv6, Limits{})
		if err != nil {
			t.Errorf("ReadNAT: %v", err)
			return
		}
		for what, text := range map[string]string{"fixture": src, "iptables-legacy-save": saved} {
			want, _ := textNAT(t, text)
			if d := diffProxyTables(got, want); d != "" {
				t.Errorf("nat against the %s text:\n%s", what, d)
			}
		}
	case "filter":
		g, err := ReadFilter(threadProc, f.ipv6, Limits{})
		if err != nil {
			t.Errorf("ReadFilter: %v", err)
			return
		}
		compareDropPaths(t, g, saved)
		if !f.loops {
			compareDropPaths(t, g, src)
		}
	}
	if *update && f.blob == "" {
		writeBlob(t, f, table)
	}
}

// writeBlob stores the table's info and entries as testdata/<fixture>.<table>.blob: the
// struct ipt_getinfo as the kernel returned it, then the entries. Loop fixtures are patched to
// jump where their text says.
func writeBlob(t *testing.T, f *fixture, table string) {
	info, blob, err := readRaw(f.ipv6, table)
	if err != nil {
		t.Errorf("read %s: %v", table, err)
		return
	}
	if f.loops {
		if blob, err = patchStandIns(&info, blob); err != nil {
			t.Errorf("patch %s: %v", table, err)
			return
		}
	}
	var b bytes.Buffer
	b.Write(encodeInfo(&info))
	b.Write(blob)
	if err := os.WriteFile(f.blobPath(table), b.Bytes(), 0o644); err != nil {
		t.Errorf("%v", err)
	}
}

// readRaw reads a table's info and a copy of its entries from the calling thread's namespace.
func readRaw(ipv6 bool, table string) (Info, []byte, error) {
	var info Info
	var blob []byte
	found, err := readTable(threadProc, ipv6, table, readOptions{}, func(in *Info, m *mapping) error {
		info, blob = *in, bytes.Clone(m.b[getEntriesHeader:])
		return nil
	})
	if err == nil && !found {
		err = fmt.Errorf("no %s table", table)
	}
	return info, blob, err
}

// patchStandIns sends every jump into a STANDIN-X chain to chain X instead (see
// fixture.loops).
func patchStandIns(info *Info, blob []byte) ([]byte, error) {
	idx := chainIndex{starts: map[int]string{}}
	if err := walk(info, blob, &idx, nil); err != nil {
		return nil, err
	}
	byName := map[string]int{}
	for off, name := range idx.starts {
		byName[name] = off
	}
	c := cursor{blob: blob, l: layoutFor(info.IPv6)}
	patched := 0
	for c.more() {
		e, err := c.next()
		if err != nil {
			return nil, err
		}
		v, ok := e.target().standardVerdict()
		if !ok || v < 0 {
			continue
		}
		name, ok := strings.CutPrefix(idx.starts[int(v)], "STANDIN-")
		if !ok {
			continue
		}
		to, ok := byName[name]
		if !ok {
			return nil, fmt.Errorf("no chain %s", name)
		}
		tgt := int(ne.Uint16(e.raw[e.l.targetOffset:]))
		ne.PutUint32(e.raw[tgt+extHeader:], uint32(to))
		patched++
	}
	if patched == 0 {
		return nil, fmt.Errorf("no jump into a STANDIN- chain")
	}
	return blob, nil
}

func encodeInfo(in *Info) []byte {
	b := make([]byte, getInfoSize)
	copy(b, in.Table)
	off := tableNameLen
	put := func(v uint32) {
		ne.PutUint32(b[off:], v)
		off += 4
	}
	put(in.ValidHooks)
	for _, v := range in.HookEntry {
		put(v)
	}
	for _, v := range in.Underflow {
		put(v)
	}
	put(in.NumEntries)
	put(in.Size)
	return b
}
