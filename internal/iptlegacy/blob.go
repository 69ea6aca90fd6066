package iptlegacy

import (
	"bytes"
	"encoding/binary"
	"fmt"
)

// The entries blob is a sequence of variable-size entries, each a fixed header (ipt_entry or
// ip6t_entry), its matches and its target. The kernel validated it when it was loaded, but the
// decoders take it as untrusted: every offset is checked against the blob, so that a table
// replaced halfway, a layout this package gets wrong or fuzzed bytes end in an error, never in
// a panic or a loop.

var ne = binary.NativeEndian // the kernel writes the blob in the machine's byte order

// entry is one entry of a blob; raw aliases the blob.
type entry struct {
	off int // offset in the blob: what jumps and hook_entry name it by
	raw []byte
	l   *entryLayout
}

// cursor walks a blob's entries in order.
type cursor struct {
	blob []byte
	l    *entryLayout
	off  int
}

// more reports whether an entry is left.
func (c *cursor) more() bool { return c.off < len(c.blob) }

// next returns the entry at the cursor and moves past it. Every entry it returns has a header,
// a target header within it, and a non-zero size, so a walk always ends.
func (c *cursor) next() (entry, error) {
	rest := c.blob[c.off:]
	l := c.l
	if len(rest) < l.size {
		return entry{}, fmt.Errorf("entry at offset %d: %d bytes left, an entry header is %d", c.off, len(rest), l.size)
	}
	tgt := int(ne.Uint16(rest[l.targetOffset:]))
	next := int(ne.Uint16(rest[l.nextOffset:]))
	switch {
	case next > len(rest):
		return entry{}, fmt.Errorf("entry at offset %d: size %d runs past the blob's end (%d bytes left)", c.off, next, len(rest))
	case tgt < l.size || tgt+extHeader > next:
		return entry{}, fmt.Errorf("entry at offset %d: target offset %d outside [%d, %d]", c.off, tgt, l.size, next-extHeader)
	}
	if tsize := int(ne.Uint16(rest[tgt:])); tsize < extHeader || tgt+tsize > next {
		return entry{}, fmt.Errorf("entry at offset %d: target size %d does not fit in the entry", c.off, tsize)
	}
	e := entry{off: c.off, raw: rest[:next:next], l: l}
	c.off += next
	return e, nil
}

// ext is one match or target: its name, revision and data.
type ext struct {
	name []byte
	rev  uint8
	data []byte
}

// parseExt reads the extension header at the start of b; size is the header's size field.
func parseExt(b []byte, size int) ext {
	return ext{name: cString(b[2 : 2+extNameLen]), rev: b[2+extNameLen], data: b[extHeader:size:size]}
}

// target returns the entry's target (next checked that its header fits).
func (e entry) target() ext {
	tgt := int(ne.Uint16(e.raw[e.l.targetOffset:]))
	return parseExt(e.raw[tgt:], int(ne.Uint16(e.raw[tgt:])))
}

// matches returns an iterator over the entry's matches.
func (e entry) matches() matchIter {
	tgt := int(ne.Uint16(e.raw[e.l.targetOffset:]))
	return matchIter{b: e.raw[e.l.size:tgt], off: e.off + e.l.size}
}

// matchIter walks the matches between an entry's header and its target.
type matchIter struct {
	b   []byte
	off int // blob offset of b, for errors
	err error
}

// next returns the next match; false at the end or on a malformed match (then err is set).
func (it *matchIter) next() (ext, bool) {
	if len(it.b) == 0 || it.err != nil {
		return ext{}, false
	}
	if len(it.b) < extHeader {
		it.err = fmt.Errorf("match at offset %d: %d bytes left, a match header is %d", it.off, len(it.b), extHeader)
		return ext{}, false
	}
	size := int(ne.Uint16(it.b))
	if size < extHeader || size > len(it.b) {
		it.err = fmt.Errorf("match at offset %d: size %d outside [%d, %d]", it.off, size, extHeader, len(it.b))
		return ext{}, false
	}
	m := parseExt(it.b, size)
	it.b, it.off = it.b[size:], it.off+size
	return m, true
}

// standardVerdict returns the verdict of a standard target (empty name), ok false for any
// other target.
func (t ext) standardVerdict() (v int32, ok bool) {
	if len(t.name) != 0 || len(t.data) < standardTargetMin-extHeader {
		return 0, false
	}
	return int32(ne.Uint32(t.data)), true
}

// errorName returns the chain name an ERROR target carries, ok false for any other target.
// User chains start with such an entry, and the table ends with one named "ERROR". The name
// is the blob's bytes: valid while the entry is.
func (t ext) errorName() ([]byte, bool) {
	if string(t.name) != "ERROR" {
		return nil, false
	}
	return cString(t.data[:min(len(t.data), errorNameLen)]), true
}

// cString returns b up to its first NUL.
func cString(b []byte) []byte {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		return b[:i]
	}
	return b
}
