package nftnl

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/proxyhealth/proxyhealth/internal/ruleset"
)

// element is one set or map element: its key, and its data (a value, or a verdict), as views
// into the message.
type element struct {
	key, value  []byte
	verdict     ruleset.VerdictKind
	hasVerdict  bool
	target      []byte
	intervalEnd bool
}

// dumpElements streams the elements of set (anonymous ones too, "__map0") of table.
func dumpElements(ctx context.Context, q querier, family uint8, table, set string, fn func(e *element) error) error {
	attrs := appendStrAttr(nil, unix.NFTA_SET_ELEM_LIST_TABLE, table)
	attrs = appendStrAttr(attrs, unix.NFTA_SET_ELEM_LIST_SET, set)
	err := q.query(ctx, request{typ: unix.NFT_MSG_GETSETELEM, family: family, dump: true, attrs: attrs}, func(m message) error {
		if m.typ != unix.NFT_MSG_NEWSETELEM {
			return nil
		}
		return eachElement(m.attrs, fn)
	})
	if err != nil {
		return fmt.Errorf("elements of set %s: %w", set, err)
	}
	return nil
}

// eachElement decodes one NFT_MSG_NEWSETELEM message's NFTA_SET_ELEM_LIST_ELEMENTS.
func eachElement(b []byte, fn func(e *element) error) error {
	a := newAttrs(b)
	for a.next() {
		if a.typ != unix.NFTA_SET_ELEM_LIST_ELEMENTS {
			continue
		}
		l := newAttrs(a.val)
		for l.next() {
			if l.typ != unix.NFTA_LIST_ELEM {
				continue
			}
			var e element
			ea := newAttrs(l.val)
			for ea.next() {
				switch ea.typ {
				case unix.NFTA_SET_ELEM_KEY:
					e.key = dataValue(ea.val)
				case unix.NFTA_SET_ELEM_FLAGS:
					f, _ := ea.u32()
					e.intervalEnd = f&unix.NFT_SET_ELEM_INTERVAL_END != 0
				case unix.NFTA_SET_ELEM_DATA:
					d := newAttrs(ea.val)
					for d.next() {
						switch d.typ {
						case unix.NFTA_DATA_VALUE:
							e.value = d.val
						case unix.NFTA_DATA_VERDICT:
							e.verdict, e.target, e.hasVerdict = decodeVerdict(d.val)
						}
					}
				}
			}
			if ea.bad {
				return errMalformed
			}
			if err := fn(&e); err != nil {
				return err
			}
		}
		if l.bad {
			return errMalformed
		}
	}
	if a.bad {
		return errMalformed
	}
	return nil
}

// splitConcat cuts a concatenated key or value into its fields: each field of a concatenation
// takes a whole number of 4-byte registers (`10.96.0.10 . udp . 53` is 4 + 4 + 4 bytes, the
// protocol and port in the first bytes of theirs). It reports false unless b is exactly that
// long.
func splitConcat(b []byte, lens ...int) ([][]byte, bool) {
	out := make([][]byte, 0, len(lens))
	for _, l := range lens {
		padded := (l + 3) &^ 3
		if l <= 0 || len(b) < padded {
			return nil, false
		}
		out = append(out, b[:l])
		b = b[padded:]
	}
	return out, len(b) == 0
}

func addrLen(family uint8) int {
	if family == unix.NFPROTO_IPV6 {
		return 16
	}
	return 4
}

// addrPort reads `ADDR . PORT` map data (kube-proxy's inline endpoints).
func addrPort(family uint8, b []byte) (netip.AddrPort, bool) {
	f, ok := splitConcat(b, addrLen(family), 2)
	if !ok {
		return netip.AddrPort{}, false
	}
	ip, _ := netip.AddrFromSlice(f[0])
	return netip.AddrPortFrom(ip.Unmap(), binary.BigEndian.Uint16(f[1])), true
}

// serviceKey reads a service-ips key, `ADDR . PROTO . PORT`.
func serviceKey(family uint8, b []byte) (addr netip.Addr, proto uint8, port uint16, ok bool) {
	f, ok := splitConcat(b, addrLen(family), 1, 2)
	if !ok {
		return netip.Addr{}, 0, 0, false
	}
	addr, _ = netip.AddrFromSlice(f[0])
	return addr.Unmap(), f[1][0], binary.BigEndian.Uint16(f[2]), true
}
