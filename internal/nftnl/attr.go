package nftnl

import "encoding/binary"

// attrs iterates netlink attributes without copying them: a table dump is hundreds of
// thousands of messages, and every attribute that is only looked at (or skipped) should cost
// nothing. Attribute values are big endian in nf_tables; the headers are host order.
type attrs struct {
	b   []byte
	typ uint16
	val []byte
	bad bool // a header claimed more bytes than were left
}

func newAttrs(b []byte) attrs { return attrs{b: b} }

// next moves to the next attribute and reports whether there is one.
func (a *attrs) next() bool {
	if len(a.b) < 4 {
		a.bad = a.bad || len(a.b) != 0
		return false
	}
	l := int(binary.NativeEndian.Uint16(a.b[0:2]))
	if l < 4 || l > len(a.b) {
		a.bad = true
		a.b = nil
		return false
	}
	// NLA_F_NESTED and NLA_F_NET_BYTEORDER are flags, not part of the type.
	a.typ = binary.NativeEndian.Uint16(a.b[2:4]) & 0x3fff
	a.val = a.b[4:l]
	a.b = a.b[min((l+3)&^3, len(a.b)):]
	return true
}

func (a *attrs) u32() (uint32, bool) {
	if len(a.val) != 4 {
		return 0, false
	}
	return binary.BigEndian.Uint32(a.val), true
}

func (a *attrs) u64() (uint64, bool) {
	if len(a.val) != 8 {
		return 0, false
	}
	return binary.BigEndian.Uint64(a.val), true
}

// str returns a NUL-terminated string attribute without its terminator, still in the buffer.
func (a *attrs) str() []byte { return cstr(a.val) }

func cstr(b []byte) []byte {
	for i, c := range b {
		if c == 0 {
			return b[:i]
		}
	}
	return b
}

func nativeU32(b []byte) uint32 { return binary.NativeEndian.Uint32(b) }
func nativeU16(b []byte) uint16 { return binary.NativeEndian.Uint16(b) }
