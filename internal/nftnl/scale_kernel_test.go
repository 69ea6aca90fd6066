package nftnl

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"runtime/metrics"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/proxyhealth/proxyhealth/internal/nftnl/nftnltest"
	"github.com/proxyhealth/proxyhealth/internal/ruleset"
)

// Scale: kube-proxy's tables at N services x 10 endpoints, generated in its own forms, loaded
// in the test's namespace, read once while the heap is sampled, and compared with the child
// process the exporter runs today. Sizes come from PROXYHEALTH_NFTNL_SCALE (e.g. "1000,3000");
// without it the tests skip: loading iptables-nft's nat table at 3,000 services takes minutes.

func scaleSizes(t *testing.T) []int {
	t.Helper()
	needNetns(t)
	env := os.Getenv("PROXYHEALTH_NFTNL_SCALE")
	if env == "" {
		t.Skip("set PROXYHEALTH_NFTNL_SCALE=1000,3000 to run")
	}
	var out []int
	for _, f := range strings.Split(env, ",") {
		n, err := strconv.Atoi(f)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, n)
	}
	return out
}

// epIP is endpoint ep of service svc, distinct for up to 16,384 services.
func epIP(svc, ep int) string {
	return fmt.Sprintf("10.%d.%d.%d", 128+svc/256/4, svc%256, (svc/256%4)*16+ep+1)
}

func vip(svc int) string { return fmt.Sprintf("10.96.%d.%d", svc/256, svc%256) }

// genNFT writes kube-proxy's nftables-mode table for n services of 10 endpoints (inline maps).
func genNFT(n int) []byte {
	var b bytes.Buffer
	b.WriteString("table ip kube-proxy {\n")
	for i := range n {
		fmt.Fprintf(&b, "chain service-%08d-ns/svc%d/tcp/http {\nmeta l4proto tcp dnat ip to numgen random mod 10 map { ", i, i)
		for e := range 10 {
			if e > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "%d : %s . 8080", e, epIP(i, e))
		}
		b.WriteString(" }\n}\n")
	}
	b.WriteString("map service-ips {\ntype ipv4_addr . inet_proto . inet_service : verdict\nelements = { ")
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s . tcp . 80 : goto service-%08d-ns/svc%d/tcp/http", vip(i), i, i)
	}
	b.WriteString(" }\n}\nchain services {\nip daddr . meta l4proto . th dport vmap @service-ips\n}\n}\n")
	return b.Bytes()
}

// genIPTables writes services [from, to) of kube-proxy's iptables-mode nat table: per service
// a KUBE-SVC chain (masquerade rule and 10 statistic jumps), 10 KUBE-SEP chains (masquerade and
// DNAT) and a KUBE-SERVICES rule, every rule commented, as kube-proxy writes them below 1,000
// endpoints.
func genIPTables(from, to int, first bool) []byte {
	var b bytes.Buffer
	b.WriteString("*nat\n")
	if first {
		b.WriteString(":KUBE-SERVICES - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000\n")
	}
	for i := from; i < to; i++ {
		fmt.Fprintf(&b, ":KUBE-SVC-%016d - [0:0]\n", i)
		for e := range 10 {
			fmt.Fprintf(&b, ":KUBE-SEP-%014d%02d - [0:0]\n", i, e)
		}
	}
	for i := from; i < to; i++ {
		name := fmt.Sprintf("ns/svc%d:http", i)
		fmt.Fprintf(&b, "-A KUBE-SERVICES -d %s/32 -p tcp -m comment --comment \"%s cluster IP\" -m tcp --dport 80 -j KUBE-SVC-%016d\n", vip(i), name, i)
		fmt.Fprintf(&b, "-A KUBE-SVC-%016d ! -s 10.244.0.0/16 -d %s/32 -p tcp -m comment --comment \"%s cluster IP\" -m tcp --dport 80 -j KUBE-MARK-MASQ\n", i, vip(i), name)
		for e := range 10 {
			stat := ""
			if e < 9 {
				stat = fmt.Sprintf(" -m statistic --mode random --probability %.11f", 1/float64(10-e))
			}
			fmt.Fprintf(&b, "-A KUBE-SVC-%016d -m comment --comment \"%s -> %s:8080\"%s -j KUBE-SEP-%014d%02d\n", i, name, epIP(i, e), stat, i, e)
			fmt.Fprintf(&b, "-A KUBE-SEP-%014d%02d -s %s/32 -m comment --comment \"%s\" -j KUBE-MARK-MASQ\n", i, e, epIP(i, e), name)
			fmt.Fprintf(&b, "-A KUBE-SEP-%014d%02d -p tcp -m comment --comment \"%s\" -m tcp -j DNAT --to-destination %s:8080\n", i, e, name, epIP(i, e))
		}
	}
	b.WriteString("COMMIT\n")
	return b.Bytes()
}

// measure runs read once after a GC and reports its time, allocations and the peak of live
// heap seen by a 1 ms sampler.
func measure(t *testing.T, label string, read func() (*ruleset.ProxyTable, error)) *ruleset.ProxyTable {
	t.Helper()
	runtime.GC()
	sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(sample)
	base := sample[0].Value.Uint64()
	stop, peakc := make(chan struct{}), make(chan uint64)
	go func() {
		peak := uint64(0)
		tk := time.NewTicker(time.Millisecond)
		defer tk.Stop()
		for {
			metrics.Read(sample)
			peak = max(peak, sample[0].Value.Uint64())
			select {
			case <-stop:
				peakc <- peak
				return
			case <-tk.C:
			}
		}
	}()
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	start := time.Now()
	pt, err := read()
	elapsed := time.Since(start)
	runtime.ReadMemStats(&ms1)
	close(stop)
	peak := <-peakc
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: %v, %.1f MiB allocated in %d allocations, live heap peak %.1f MiB above %.1f MiB before",
		label, elapsed.Round(time.Millisecond), float64(ms1.TotalAlloc-ms0.TotalAlloc)/(1<<20), ms1.Mallocs-ms0.Mallocs,
		float64(peak-min(peak, base))/(1<<20), float64(base)/(1<<20))
	return pt
}

// child runs the command the exporter runs today and reports its time and peak RSS.
func child(t *testing.T, name string, args ...string) {
	t.Helper()
	start := time.Now()
	cmd := exec.Command(name, args...)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	ru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	t.Logf("child %s %s: %v, %.1f MiB output, peak RSS %.1f MiB", name, strings.Join(args, " "),
		time.Since(start).Round(time.Millisecond), float64(len(out))/(1<<20), float64(ru.Maxrss)/1024)
}

func TestScaleKubeProxyNFT(t *testing.T) {
	for _, n := range scaleSizes(t) {
		t.Run(strconv.Itoa(n), func(t *testing.T) {
			nftnltest.Flush(t)
			start := time.Now()
			nftnltest.LoadNFT(t, genNFT(n))
			t.Logf("loaded %d services x 10 endpoints in %v", n, time.Since(start).Round(time.Millisecond))
			pt := measure(t, "ReadKubeProxyNFT", func() (*ruleset.ProxyTable, error) { return ReadKubeProxyNFT(context.Background(), false, Limits{}) })
			if len(pt.Chains) != n || len(pt.Services) != n || len(pt.Chains[fmt.Sprintf("service-%08d-ns/svc0/tcp/http", 0)]) != 10 {
				t.Fatalf("read %d chains, %d services", len(pt.Chains), len(pt.Services))
			}
			child(t, "nft", "-j", "list", "table", "ip", "kube-proxy")
		})
	}
}

func TestScaleIPTablesNAT(t *testing.T) {
	for _, n := range scaleSizes(t) {
		t.Run(strconv.Itoa(n), func(t *testing.T) {
			nftnltest.Flush(t)
			start := time.Now()
			for from := 0; from < n; from += 500 {
				// In batches of 500 services: one restore of a large table takes quadratic time.
				nftnltest.LoadIPTablesSave(t, genIPTables(from, min(from+500, n), from == 0), false, "--noflush")
			}
			t.Logf("loaded %d services x 10 endpoints in %v", n, time.Since(start).Round(time.Millisecond))
			pt := measure(t, "ReadIPTablesNAT", func() (*ruleset.ProxyTable, error) { return ReadIPTablesNAT(context.Background(), false, Limits{}) })
			if len(pt.Chains) != n || len(pt.Services) != n || len(pt.Chains[fmt.Sprintf("KUBE-SVC-%016d", 0)]) != 10 {
				t.Fatalf("read %d chains, %d services", len(pt.Chains), len(pt.Services))
			}
			child(t, "iptables-nft-save", "-t", "nat")
		})
	}
}

// cpu runs fn and reports the process's CPU time (user and system: the kernel's dump work is
// done in the reading thread) and its allocations.
func cpu(t *testing.T, label string, fn func()) {
	t.Helper()
	var ru0, ru1 syscall.Rusage
	var ms0, ms1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms0)
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
	start := time.Now()
	fn()
	elapsed := time.Since(start)
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
	runtime.ReadMemStats(&ms1)
	tv := func(a, b syscall.Timeval) time.Duration { return time.Duration(b.Nano() - a.Nano()) }
	t.Logf("%s: %v wall, %v user + %v system CPU, %.2f MiB in %d allocations", label, elapsed.Round(time.Microsecond),
		tv(ru0.Utime, ru1.Utime).Round(time.Microsecond), tv(ru0.Stime, ru1.Stime).Round(time.Microsecond),
		float64(ms1.TotalAlloc-ms0.TotalAlloc)/(1<<20), ms1.Mallocs-ms0.Mallocs)
}

// followScale loads a table, follows it (reporting the heap it holds), makes one service's
// change and measures the Apply.
func followScale(t *testing.T, load func(), change func(), check func(f *Follower), opts ...WatchOption) {
	needNetns(t)
	nftnltest.Flush(t)
	start := time.Now()
	load()
	t.Logf("loaded in %v", time.Since(start).Round(time.Millisecond))
	var ms0, ms1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms0)
	ft := newFollowTest(t, opts...)
	runtime.GC()
	runtime.ReadMemStats(&ms1)
	t.Logf("the Follower and its watch hold %.2f MiB of heap", float64(int64(ms1.HeapAlloc)-int64(ms0.HeapAlloc))/(1<<20))
	cpu(t, "Follower full read (Resync)", func() {
		if err := ft.f.Resync(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
	change()
	chg := ft.changes()
	before := ft.f.Stats()
	cpu(t, "Apply one service's change", func() {
		if err := ft.f.Apply(context.Background(), chg...); err != nil {
			t.Fatal(err)
		}
	})
	after := ft.f.Stats()
	t.Logf("reads: %d full, %d rule dumps, %d element dumps", after.FullReads-before.FullReads, after.RuleDumps-before.RuleDumps, after.ElementDumps-before.ElementDumps)
	check(ft.f)
	ft.same("after one change")
}

func TestScaleFollowIPTablesNAT(t *testing.T) {
	for _, n := range scaleSizes(t) {
		t.Run(strconv.Itoa(n), func(t *testing.T) {
			followScale(t, func() {
				for from := 0; from < n; from += 500 {
					nftnltest.LoadIPTablesSave(t, genIPTables(from, min(from+500, n), from == 0), false, "--noflush")
				}
			}, func() {
				// kube-proxy's partial sync for service 0's endpoint 0 replaced: KUBE-SERVICES and
				// the service chain written again, the old endpoint chain deleted, a new one.
				full := string(genIPTables(0, n, true))
				var b strings.Builder
				b.WriteString("*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-0000000000000000 - [0:0]\n:KUBE-SEP-0000000000000000 - [0:0]\n:KUBE-SEP-NEWNEWNEWNEW0001 - [0:0]\n")
				for _, l := range strings.Split(full, "\n") {
					if strings.HasPrefix(l, "-A KUBE-SERVICES ") || strings.HasPrefix(l, "-A KUBE-SVC-0000000000000000 ") {
						b.WriteString(strings.ReplaceAll(l, "KUBE-SEP-0000000000000000", "KUBE-SEP-NEWNEWNEWNEW0001") + "\n")
					}
				}
				b.WriteString("-A KUBE-SEP-NEWNEWNEWNEW0001 -p tcp -m tcp -j DNAT --to-destination 10.250.0.1:8080\n-X KUBE-SEP-0000000000000000\nCOMMIT\n")
				nftnltest.LoadIPTablesSave(t, []byte(b.String()), false, "--noflush")
			}, func(f *Follower) {
				pt, _ := f.IPTablesNAT(false)
				if eps := pt.Chains["KUBE-SVC-0000000000000000"]; len(eps) != 10 || eps[len(eps)-1].String() != "10.250.0.1:8080" {
					t.Errorf("service 0: %v", eps)
				}
			})
		})
	}
}

func TestScaleFollowKubeProxyNFT(t *testing.T) {
	for _, n := range scaleSizes(t) {
		t.Run(strconv.Itoa(n), func(t *testing.T) {
			followScale(t, func() { nftnltest.LoadNFT(t, genNFT(n)) }, func() {
				nftnltest.LoadNFT(t, []byte("flush chain ip kube-proxy service-00000000-ns/svc0/tcp/http\n"+
					"add rule ip kube-proxy service-00000000-ns/svc0/tcp/http meta l4proto tcp dnat ip to numgen random mod 2 map { 0 : 10.250.0.1 . 8080, 1 : 10.250.0.2 . 8080 }\n"))
			}, func(f *Follower) {
				pt, _ := f.KubeProxyNFT(false)
				if eps := pt.Chains["service-00000000-ns/svc0/tcp/http"]; len(eps) != 2 {
					t.Errorf("service 0: %v", eps)
				}
			}, FollowNFTMaps())
		})
	}
}
