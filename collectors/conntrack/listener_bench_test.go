package conntrack

import (
	"net/netip"
	"runtime"
	"testing"

	"github.com/prometheus/common/promslog"
)

// BenchmarkHandleMessage is the listener's work per event (handleMessage: decode, count,
// follow the flow, attribute its end) on the event stream bench/conntrack-events makes: new
// unreplied UDP flows DNAT'ed to Service endpoints, each ending `window` flows later, so that
// the tracker holds `window` flows throughout. One op is one event. Reproduce:
//
//	go test -run '^$' -bench HandleMessage -benchmem ./collectors/conntrack/
func BenchmarkHandleMessage(b *testing.B) {
	const window = 50_000 // about the flows open at 50k new flows/s with a 1 s UDP timeout
	view := benchView()
	node := netip.MustParseAddr("192.168.0.5")
	news := make([][]byte, 2*window)
	ends := make([][]byte, 2*window)
	for i := range news {
		svc := i % 1000
		orig := tuple{
			src: netip.AddrFrom4([4]byte{10, 244, 128 + byte(i>>16), byte(i >> 8)}), dst: netip.AddrFrom4([4]byte{10, 96, byte(svc >> 8), byte(svc)}),
			srcPort: uint16(1024 + i%60000), dstPort: 80, proto: 17,
		}
		reply := tuple{src: netip.AddrFrom4([4]byte{10, 245, byte(svc >> 8), byte(svc)}), dst: node, srcPort: 8080, dstPort: orig.srcPort, proto: 17}
		news[i] = encodeFlowMessage(b, eventNew, uint32(i+1), statusDstNAT, orig, reply)
		ends[i] = encodeFlowMessage(b, eventDestroy, uint32(i+1), statusDstNAT, orig, reply)
	}
	cfg := Config{ProcPath: "testdata/proc-full", UnrepliedAfter: 3e9, MaxTrackedFlows: 65536, MaxServiceSeries: 100,
		SocketBufferBytes: 1 << 20, ServiceRefreshInterval: 60e9}
	c, err := New(cfg, promslog.NewNopLogger())
	if err != nil {
		b.Fatal(err)
	}
	c.view.Store(view)
	var ev flowEvent
	for i := range window {
		c.handleMessage(news[i], &ev)
	}
	runtime.GC() // the set-up's garbage is not the listener's
	b.ReportAllocs()
	b.ResetTimer()
	next := window // the next flow to start; the flow `window` before it ends first
	end := true
	for b.Loop() {
		if end {
			c.handleMessage(ends[(next-window)%len(ends)], &ev)
		} else {
			c.handleMessage(news[next%len(news)], &ev)
			next++
		}
		end = !end
	}
	if c.receiveErrors.Load() != 0 || c.events[eventDestroy].Load() == 0 {
		b.Fatalf("%d undecodable events, %d ends", c.receiveErrors.Load(), c.events[eventDestroy].Load())
	}
}
