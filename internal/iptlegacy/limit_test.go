package iptlegacy

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// kubeProxyNAT is kube-proxy's nat table for services Services of 10 endpoints, every rule
// commented as kube-proxy writes them below 1,000 endpoints.
func kubeProxyNAT(services int) string {
	var chains, rules strings.Builder
	chains.WriteString("*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n")
	rules.WriteString("-A PREROUTING -j KUBE-SERVICES\n-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000\n")
	for i := range services {
		name := fmt.Sprintf("ns/svc%d:http", i)
		vip := fmt.Sprintf("10.96.%d.%d", i/250, i%250+1)
		fmt.Fprintf(&chains, ":KUBE-SVC-%016d - [0:0]\n", i)
		fmt.Fprintf(&rules, "-A KUBE-SERVICES -d %s/32 -p tcp -m comment --comment \"%s cluster IP\" -m tcp --dport 80 -j KUBE-SVC-%016d\n", vip, name, i)
		fmt.Fprintf(&rules, "-A KUBE-SVC-%016d ! -s 10.244.0.0/16 -d %s/32 -p tcp -m comment --comment \"%s cluster IP\" -m tcp --dport 80 -j KUBE-MARK-MASQ\n", i, vip, name)
		for e := range 10 {
			ep := fmt.Sprintf("10.%d.%d.%d", 128+i/250, i%250, e+1)
			fmt.Fprintf(&chains, ":KUBE-SEP-%014d%02d - [0:0]\n", i, e)
			stat := ""
			if e < 9 {
				stat = fmt.Sprintf(" -m statistic --mode random --probability %.11f", 1/float64(10-e))
			}
			fmt.Fprintf(&rules, "-A KUBE-SVC-%016d -m comment --comment \"%s -> %s:8080\"%s -j KUBE-SEP-%014d%02d\n", i, name, ep, stat, i, e)
			fmt.Fprintf(&rules, "-A KUBE-SEP-%014d%02d -s %s/32 -m comment --comment \"%s\" -j KUBE-MARK-MASQ\n", i, e, ep, name)
			fmt.Fprintf(&rules, "-A KUBE-SEP-%014d%02d -p tcp -m comment --comment \"%s\" -m tcp -j DNAT --to-destination %s:8080\n", i, e, name, ep)
		}
	}
	return chains.String() + rules.String() + "COMMIT\n"
}

// A table whose info gives a blob above the read's limit is refused with ErrTableTooLarge
// before any of it is copied; under the limit, or with the default, it reads as before.
func TestKernelTableLimit(t *testing.T) {
	const services = 300
	inFreshNetns(t, func() {
		filter := "*filter\n:FORWARD ACCEPT [0:0]\n-A FORWARD -m conntrack --ctstate INVALID -j DROP\nCOMMIT\n"
		if !restore(t, false, kubeProxyNAT(services)+filter) {
			return
		}
		info, err := ReadInfo(threadProc, false, "nat")
		if err != nil || info == nil {
			t.Errorf("ReadInfo: %v, %v", info, err)
			return
		}
		t.Logf("nat table of %d services x 10 endpoints (commented): %d bytes (%.0f bytes a service)",
			services, info.Size, float64(info.Size)/services)

		below := Limits{MaxTableBytes: int64(info.Size) - 1}
		pt, err := ReadNAT(threadProc, false, below)
		if !errors.Is(err, ErrTableTooLarge) || pt != nil {
			t.Errorf("ReadNAT with a limit one byte below the table: %v, %v; want nil and ErrTableTooLarge", pt, err)
		}
		t.Logf("limited: %v", err)
		if g, err := ReadFilter(threadProc, false, Limits{MaxTableBytes: 1}); !errors.Is(err, ErrTableTooLarge) || g != nil {
			t.Errorf("ReadFilter with a one byte limit: %v, %v; want nil and ErrTableTooLarge", g, err)
		}
		if g, err := ReadFilter(threadProc, false, Limits{}); err != nil || g == nil || g.InvalidDropPath() == nil {
			t.Errorf("ReadFilter under the default limit: %v, %v; want the INVALID drop", g, err)
		}

		pt, err = ReadNAT(threadProc, false, Limits{MaxTableBytes: int64(info.Size)})
		if err != nil || pt == nil || len(pt.Services) != services {
			t.Errorf("ReadNAT with a limit of the table's size: %+v, %v; want %d services", pt, err, services)
		}
		// The limit is the read's own: the next read, without one, has the default.
		pt, err = ReadNAT(threadProc, false, Limits{})
		if err != nil || pt == nil || len(pt.Services) != services {
			t.Errorf("ReadNAT under the default limit after a limited one: %+v, %v; want %d services", pt, err, services)
		}
	})
}

// However much memory a limit gives, a read is never allowed more than the fixed default: a
// huge but finite cgroup limit (1 TiB) must not let a table of a terabyte be read whole.
func TestMaxTableBytesWithinNeverAboveTheDefault(t *testing.T) {
	for _, tc := range []struct{ limit, want int64 }{
		{0, DefaultMaxTableBytes},
		{1 << 40, DefaultMaxTableBytes},
		{1<<62 - 1, DefaultMaxTableBytes},
		{384 << 20, 305040290}, // (384 MiB - 64 MiB) / 1.1
		{32 << 20, 1},
	} {
		if got := MaxTableBytesWithin(tc.limit, 64<<20); got != tc.want {
			t.Errorf("MaxTableBytesWithin(%d, 64 MiB) = %d, want %d", tc.limit, got, tc.want)
		}
	}
}
