package iptlegacy

import (
	"flag"
	"fmt"
	"runtime"
	"strings"
	"testing"
)

var (
	benchServices  = flag.Int("iptlegacy.bench-services", 1000, "Services in the nat table BenchmarkKernelReadNAT reads")
	benchEndpoints = flag.Int("iptlegacy.bench-endpoints", 10, "endpoints per Service in the nat table BenchmarkKernelReadNAT reads")
)

// largeClusterNAT writes a nat table of services x endpoints ClusterIP Services in kube-proxy
// v1.36's shape once a node has more than 1,000 endpoints (its large-cluster mode): comments
// on the KUBE-SERVICES jumps only.
func largeClusterNAT(services, endpoints int) string {
	var chains, rules strings.Builder
	chains.WriteString("*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n")
	rules.WriteString("-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n")
	rules.WriteString("-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n")
	rules.WriteString("-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000\n")
	for s := range services {
		svc := fmt.Sprintf("KUBE-SVC-%016X", s)
		vip := fmt.Sprintf("10.96.%d.%d", (16+s)>>8&0xff, (16+s)&0xff)
		fmt.Fprintf(&chains, ":%s - [0:0]\n", svc)
		fmt.Fprintf(&rules, "-A KUBE-SERVICES -d %s/32 -p tcp -m comment --comment \"ns%d/svc%d:http cluster IP\" -m tcp --dport 80 -j %s\n", vip, s%100, s, svc)
		fmt.Fprintf(&rules, "-A %s ! -s 10.244.0.0/16 -d %s/32 -p tcp -m tcp --dport 80 -j KUBE-MARK-MASQ\n", svc, vip)
		for e := range endpoints {
			n := 1 + s*endpoints + e
			ip := fmt.Sprintf("10.%d.%d.%d", 128+n>>16&0x7f, n>>8&0xff, n&0xff)
			sep := fmt.Sprintf("KUBE-SEP-%08X%08X", s, e)
			fmt.Fprintf(&chains, ":%s - [0:0]\n", sep)
			if left := endpoints - e; left > 1 {
				fmt.Fprintf(&rules, "-A %s -m statistic --mode random --probability %0.10f -j %s\n", svc, 1/float64(left), sep)
			} else {
				fmt.Fprintf(&rules, "-A %s -j %s\n", svc, sep)
			}
			fmt.Fprintf(&rules, "-A %s -s %s/32 -j KUBE-MARK-MASQ\n", sep, ip)
			fmt.Fprintf(&rules, "-A %s -p tcp -m tcp -j DNAT --to-destination %s:8080\n", sep, ip)
		}
	}
	rules.WriteString("COMMIT\n")
	return chains.String() + rules.String()
}

// BenchmarkKernelReadNAT reads a kube-proxy nat table of -iptlegacy.bench-services x
// -iptlegacy.bench-endpoints from the kernel: the cost of one legacy read, the copy out of the
// kernel and the decode. Its size is reported as table-MiB, and the heap the decoded table
// holds as result-B/service.
func BenchmarkKernelReadNAT(b *testing.B) {
	rules := largeClusterNAT(*benchServices, *benchEndpoints)
	inFreshNetns(b, func() {
		if !restore(b, false, rules) {
			return
		}
		info, err := ReadInfo(threadProc, false, "nat")
		if err != nil || info == nil {
			b.Errorf("ReadInfo: %v, %v", info, err)
			return
		}
		b.ReportAllocs()
		b.ResetTimer()
		for b.Loop() {
			pt, err := ReadNAT(threadProc, false, Limits{})
			if err != nil || pt == nil {
				b.Errorf("ReadNAT: %v", err)
				return
			}
			if got := len(pt.Services); got != *benchServices {
				b.Errorf("ReadNAT found %d services, want %d", got, *benchServices)
				return
			}
		}
		b.StopTimer()
		b.ReportMetric(float64(info.Size)/(1<<20), "table-MiB")
		if held, ok := resultBytes(b); ok {
			b.ReportMetric(float64(held)/float64(*benchServices), "result-B/service")
		}
	})
}

// resultBytes is the heap a read's result holds, measured as the live heap with it and
// without it: what a read keeps until the next one, and so what the process holds besides the
// blob while that next read's blob is mapped whole.
// It runs off the benchmark's goroutine, as inFreshNetns's fn does.
func resultBytes(b *testing.B) (uint64, bool) {
	live := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	before := live()
	pt, err := ReadNAT(threadProc, false, Limits{})
	if err != nil || pt == nil {
		b.Errorf("ReadNAT: %v", err)
		return 0, false
	}
	after := live()
	runtime.KeepAlive(pt)
	return after - before, true
}
