package conntrack

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/mdlayher/netlink"
)

// encodeFlowMessage builds a conntrack netlink message the way the kernel's ctnetlink does.
func encodeFlowMessage(t testing.TB, typ eventType, id, status uint32, orig, reply tuple) []byte {
	t.Helper()
	ae := netlink.NewAttributeEncoder()
	ae.ByteOrder = binary.BigEndian
	encodeTuple := func(tp tuple) func(*netlink.AttributeEncoder) error {
		return func(ae *netlink.AttributeEncoder) error {
			ae.ByteOrder = binary.BigEndian
			ae.Nested(ctaTupleIP, func(ae *netlink.AttributeEncoder) error {
				if tp.src.Is4() {
					ae.Bytes(ctaIPv4Src, tp.src.AsSlice())
					ae.Bytes(ctaIPv4Dst, tp.dst.AsSlice())
				} else {
					ae.Bytes(ctaIPv6Src, tp.src.AsSlice())
					ae.Bytes(ctaIPv6Dst, tp.dst.AsSlice())
				}
				return nil
			})
			ae.Nested(ctaTupleProto, func(ae *netlink.AttributeEncoder) error {
				ae.ByteOrder = binary.BigEndian
				ae.Uint8(ctaProtoNum, tp.proto)
				ae.Uint16(ctaProtoSrcPort, tp.srcPort)
				ae.Uint16(ctaProtoDstPort, tp.dstPort)
				return nil
			})
			return nil
		}
	}
	ae.Nested(ctaTupleOrig, encodeTuple(orig))
	ae.Nested(ctaTupleReply, encodeTuple(reply))
	ae.Uint32(ctaStatus, status)
	ae.Uint32(ctaID, id)
	attrs, err := ae.Encode()
	if err != nil {
		t.Fatal(err)
	}
	var msgType uint16 = nfnlSubsysCTNetlink<<8 | ipctnlMsgCTNew
	var flags uint16
	switch typ {
	case eventNew:
		flags = nlmFCreate | nlmFExcl
	case eventDestroy:
		msgType = nfnlSubsysCTNetlink<<8 | ipctnlMsgCTDelete
	}
	msg := make([]byte, nlmsgHeaderLen+nfgenHeaderLen, nlmsgHeaderLen+nfgenHeaderLen+len(attrs))
	msg = append(msg, attrs...)
	binary.NativeEndian.PutUint32(msg[0:4], uint32(len(msg)))
	binary.NativeEndian.PutUint16(msg[4:6], msgType)
	binary.NativeEndian.PutUint16(msg[6:8], flags)
	msg[nlmsgHeaderLen] = 2 // AF_INET
	return msg
}

var (
	client   = netip.MustParseAddr("10.244.1.2")
	vip      = netip.MustParseAddr("10.96.0.10")
	endpoint = netip.MustParseAddr("10.244.1.3")
)

func dnatTuples(srcPort uint16) (orig, reply tuple) {
	orig = tuple{src: client, dst: vip, srcPort: srcPort, dstPort: 80, proto: 6}
	reply = tuple{src: endpoint, dst: client, srcPort: 8080, dstPort: srcPort, proto: 6}
	return orig, reply
}

func TestDecodeFlowMessage(t *testing.T) {
	orig, reply := dnatTuples(40000)
	for _, tc := range []struct {
		typ    eventType
		status uint32
	}{
		{eventNew, statusDstNAT},
		{eventUpdate, statusDstNAT | statusSeenReply},
		{eventDestroy, statusDstNAT},
	} {
		var ev flowEvent
		msg := encodeFlowMessage(t, tc.typ, 77, tc.status, orig, reply)
		if err := decodeFlowMessage(msg, &ev); err != nil {
			t.Fatalf("%v: %v", tc.typ, err)
		}
		want := flowEvent{typ: tc.typ, id: 77, status: tc.status, hasStatus: true, orig: orig, reply: reply}
		if ev != want {
			t.Errorf("%v: decoded\n %+v\nwant\n %+v", tc.typ, ev, want)
		}
		if !ev.dnat() {
			t.Errorf("%v: dnat() = false for a DNAT'ed flow", tc.typ)
		}
	}
}

func TestDecodeIPv6(t *testing.T) {
	orig := tuple{src: netip.MustParseAddr("fd00::2"), dst: netip.MustParseAddr("fd00:96::a"), srcPort: 1, dstPort: 53, proto: 17}
	reply := tuple{src: netip.MustParseAddr("fd00::3"), dst: orig.src, srcPort: 53, dstPort: 1, proto: 17}
	var ev flowEvent
	if err := decodeFlowMessage(encodeFlowMessage(t, eventNew, 1, 0, orig, reply), &ev); err != nil {
		t.Fatal(err)
	}
	if ev.orig != orig || ev.reply != reply {
		t.Errorf("decoded %+v / %+v", ev.orig, ev.reply)
	}
	if !ev.dnat() {
		t.Error("reply source differs from original destination, want dnat() true")
	}
}

func TestDecodeRejects(t *testing.T) {
	orig, reply := dnatTuples(1)
	good := encodeFlowMessage(t, eventNew, 1, 0, orig, reply)
	var ev flowEvent
	for name, msg := range map[string][]byte{
		"empty":              nil,
		"header only":        good[:nlmsgHeaderLen],
		"length beyond data": good[:len(good)-4],
	} {
		if err := decodeFlowMessage(msg, &ev); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	exp := append([]byte(nil), good...)
	binary.NativeEndian.PutUint16(exp[4:6], 2<<8) // NFNL_SUBSYS_CTNETLINK_EXP
	if err := decodeFlowMessage(exp, &ev); err != errNotConntrack {
		t.Errorf("expectation message: got %v, want errNotConntrack", err)
	}
}

func TestDecodeDoesNotAllocate(t *testing.T) {
	orig, reply := dnatTuples(1)
	msg := encodeFlowMessage(t, eventNew, 1, 0, orig, reply)
	var ev flowEvent
	if n := testing.AllocsPerRun(100, func() { _ = decodeFlowMessage(msg, &ev) }); n != 0 {
		t.Errorf("decodeFlowMessage allocates %v times per message, want 0", n)
	}
}

func FuzzDecodeFlowMessage(f *testing.F) {
	orig, reply := dnatTuples(1)
	f.Add(encodeFlowMessage(f, eventNew, 1, statusDstNAT, orig, reply))
	f.Add(encodeFlowMessage(f, eventDestroy, 2, statusSeenReply, orig, reply))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, msg []byte) {
		var ev flowEvent
		_ = decodeFlowMessage(msg, &ev) // must not panic
		for len(msg) > 0 {
			n, err := messageSpan(msg)
			if err != nil {
				return
			}
			if n <= 0 || n > len(msg) {
				t.Fatalf("messageSpan = %d for %d bytes", n, len(msg))
			}
			msg = msg[n:]
		}
	})
}

func BenchmarkDecodeFlowMessage(b *testing.B) {
	orig, reply := dnatTuples(1)
	msg := encodeFlowMessage(b, eventNew, 1, statusDstNAT, orig, reply)
	var ev flowEvent
	b.ReportAllocs()
	for b.Loop() {
		if err := decodeFlowMessage(msg, &ev); err != nil {
			b.Fatal(err)
		}
	}
}
