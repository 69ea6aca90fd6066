package nftnl

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/proxyhealth/proxyhealth/internal/nftnl/nftnltest"
)

// BenchmarkKernelElementDumpByPosition dumps the elements of one anonymous map of
// kube-proxy's nftables table (10 elements each), the first map the table holds or the last,
// in tables of 1,000 to 16,000 maps. The kernel finds a set by name by walking the table's
// list of sets from the first (nft_set_lookup, and again in each dump callback), so a dump of
// the last map costs time in proportion to the maps before it while the first one's does not:
// reading every map, as a whole read of the table must, costs the square of their number.
//
//	go test -run '^$' -bench KernelElementDumpByPosition -benchtime 2000x ./internal/nftnl/
func BenchmarkKernelElementDumpByPosition(b *testing.B) {
	needNetns(b)
	for _, n := range []int{1000, 4000, 16000} {
		nftnltest.Flush(b)
		nftnltest.LoadNFT(b, genNFT(n))
		s, err := dial(Limits{})
		if err != nil {
			b.Fatal(err)
		}
		var first, last string
		kr := &kpReader{in: interp{family: nfproto(false)}, chains: map[string]*kpChain{}, endpoints: map[string]netip.AddrPort{}}
		if err := dumpRules(context.Background(), s, nfproto(false), kubeProxyTable, "", kr.rule); err != nil {
			b.Fatal(err)
		}
		for _, c := range kr.chains {
			for _, m := range c.dnatMaps {
				if first == "" || setNumber(m.set) < setNumber(first) {
					first = m.set
				}
				if last == "" || setNumber(m.set) > setNumber(last) {
					last = m.set
				}
			}
		}
		for _, pos := range []struct{ name, set string }{{"first", first}, {"last", last}} {
			b.Run(fmt.Sprintf("maps=%d/%s", n, pos.name), func(b *testing.B) {
				for b.Loop() {
					elements := 0
					err := dumpElements(context.Background(), s, nfproto(false), kubeProxyTable, pos.set, func(*element) error {
						elements++
						return nil
					})
					if err != nil || elements != 10 {
						b.Fatalf("map %s: %d elements, %v", pos.set, elements, err)
					}
				}
			})
		}
		s.Close()
	}
}

// setNumber is the number of an anonymous set's name (__map12 is 12): the kernel gives each
// new one the lowest free number, so in a table loaded at once it follows creation order.
func setNumber(name string) int {
	var n int
	if _, err := fmt.Sscanf(name, "__map%d", &n); err != nil {
		return -1
	}
	return n
}

// BenchmarkKernelWholeReadNFT sets the whole read of kube-proxy's nftables table beside what
// loading that table cost: nft -f, as kube-proxy's full sync runs it (knftables), in CPU
// seconds of the nft process, against the CPU seconds of one whole read (the exporter's start-
// up). Both grow with the square of the maps, for the same reason (the kernel walks the
// table's list of sets: to name each new anonymous map, to find each one to dump); the ratio
// stays flat.
//
//	go test -run '^$' -bench KernelWholeReadNFT -benchtime 1x ./internal/nftnl/
func BenchmarkKernelWholeReadNFT(b *testing.B) {
	needNetns(b)
	for _, n := range []int{1000, 4000, 16000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			nftnltest.Flush(b)
			cmd := exec.Command("nft", "-f", "-")
			cmd.Stdin = bytes.NewReader(genNFT(n))
			if out, err := cmd.CombinedOutput(); err != nil {
				b.Fatalf("nft -f: %v: %s", err, out)
			}
			load := cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
			s, err := dial(Limits{})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			before := processCPU(b)
			for b.Loop() {
				pt, err := readKubeProxyNFT(context.Background(), s, nfproto(false))
				if err != nil || len(pt.Chains) != n {
					b.Fatalf("read %d chains, want %d: %v", len(pt.Chains), n, err)
				}
			}
			read := (processCPU(b) - before) / time.Duration(b.N)
			b.ReportMetric(load.Seconds(), "load-cpu-s")
			b.ReportMetric(read.Seconds(), "read-cpu-s")
			b.ReportMetric(read.Seconds()/load.Seconds(), "read/load")
		})
	}
}

// processCPU is the user and system time the test process has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
