package conntrack

import (
	"net/netip"
	"runtime"
	"testing"
)

// BenchmarkTrackerFull reports what the tracker's flows cost in heap at the default
// --conntrack.max-tracked-flows (57344), the most it holds: live heap bytes per flow and in
// all, after a collection, IPv4 flows. One op fills a new tracker. Reproduce:
//
//	go test -run '^$' -bench TrackerFull -benchtime 5x ./collectors/conntrack/
func BenchmarkTrackerFull(b *testing.B) {
	const flows = 57344
	view := benchView()
	events := make([]flowEvent, flows)
	for i := range events {
		svc := i % 1000
		events[i] = flowEvent{typ: eventNew, id: uint32(i + 1), status: statusDstNAT, hasStatus: true,
			orig: tuple{src: netip.AddrFrom4([4]byte{10, 244, 128 + byte(i>>16), byte(i >> 8)}), dst: netip.AddrFrom4([4]byte{10, 96, byte(svc >> 8), byte(svc)}),
				srcPort: uint16(1024 + i%60000), dstPort: 80, proto: 17},
			reply: tuple{src: netip.AddrFrom4([4]byte{10, 245, byte(svc >> 8), byte(svc)}), srcPort: 8080, proto: 17}}
	}
	var live uint64
	for b.Loop() {
		before := heapLive()
		tr := newFlowTracker(flows, 100)
		for i := range events {
			tr.handle(&events[i], 0, view)
		}
		live = heapLive() - before
		runtime.KeepAlive(tr)
	}
	b.ReportMetric(float64(live)/flows, "heap-B/flow")
	b.ReportMetric(float64(live)/(1<<20), "heap-MiB")
}

func heapLive() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
