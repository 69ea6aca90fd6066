package iptlegacy

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// smallNAT is a kube-proxy nat table with n endpoints of one service; endpoint e of the
// service DNATs to 10.244.0.<base+e>.
func smallNAT(n, base int) string {
	var b strings.Builder
	b.WriteString("*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-AAAAAAAAAAAAAAAA - [0:0]\n")
	for e := range n {
		fmt.Fprintf(&b, ":KUBE-SEP-%016d - [0:0]\n", base+e)
	}
	b.WriteString("-A KUBE-SERVICES -d 10.96.0.1/32 -p tcp -m comment --comment \"ns/svc:http cluster IP\" -m tcp --dport 80 -j KUBE-SVC-AAAAAAAAAAAAAAAA\n")
	for e := range n {
		fmt.Fprintf(&b, "-A KUBE-SVC-AAAAAAAAAAAAAAAA -j KUBE-SEP-%016d\n", base+e)
		fmt.Fprintf(&b, "-A KUBE-SEP-%016d -p tcp -m tcp -j DNAT --to-destination 10.244.0.%d:8080\n", base+e, base+e)
	}
	b.WriteString("COMMIT\n")
	return b.String()
}

// Asking for a table that does not exist must not create it: the readers look at
// ip_tables_names first and report nothing.
func TestKernelNeverCreatesTable(t *testing.T) {
	inFreshNetns(t, func() {
		check := func(stage string) {
			for _, ipv6 := range []bool{false, true} {
				if pt, err := ReadNAT(threadProc, ipv6, Limits{}); pt != nil || err != nil {
					t.Errorf("%s: ReadNAT(ipv6 %v) = %v, %v; want nil, nil", stage, ipv6, pt, err)
				}
				if info, err := ReadInfo(threadProc, ipv6, "nat"); info != nil || err != nil {
					t.Errorf("%s: ReadInfo(ipv6 %v, nat) = %v, %v; want nil, nil", stage, ipv6, info, err)
				}
				if info, err := ReadInfo(threadProc, ipv6, "mangle"); info != nil || err != nil {
					t.Errorf("%s: ReadInfo(ipv6 %v, mangle) = %v, %v; want nil, nil", stage, ipv6, info, err)
				}
			}
			if g, err := ReadFilter(threadProc, true, Limits{}); g != nil || err != nil {
				t.Errorf("%s: ReadFilter(ipv6) = %v, %v; want nil, nil", stage, g, err)
			}
		}
		check("empty namespace")
		if g, err := ReadFilter(threadProc, false, Limits{}); g != nil || err != nil {
			t.Errorf("empty namespace: ReadFilter = %v, %v; want nil, nil", g, err)
		}
		if v4, v6 := tableNames(t, false), tableNames(t, true); v4 != "" || v6 != "" {
			t.Errorf("after reading an empty namespace: tables %q and %q exist", v4, v6)
		}
		if !restore(t, false, "*filter\n:FORWARD ACCEPT [0:0]\n-A FORWARD -m conntrack --ctstate INVALID -j DROP\nCOMMIT\n") {
			return
		}
		check("filter table only")
		if g, err := ReadFilter(threadProc, false, Limits{}); err != nil || g == nil || g.InvalidDropPath() == nil {
			t.Errorf("ReadFilter = %v, %v; want the drop", g, err)
		}
		if v4, v6 := tableNames(t, false), tableNames(t, true); v4 != "filter" || v6 != "" {
			t.Errorf("tables %q and %q, want only the IPv4 filter table", v4, v6)
		}
		// A nat table that is not kube-proxy's (no KUBE-SERVICES) reads as none.
		if !restore(t, false, "*nat\n:PREROUTING ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n-A POSTROUTING -j MASQUERADE\nCOMMIT\n") {
			return
		}
		if pt, err := ReadNAT(threadProc, false, Limits{}); pt != nil || err != nil {
			t.Errorf("nat without KUBE-SERVICES: %v, %v; want nil, nil", pt, err)
		}
		// The control: asking the kernel directly for a missing table creates it, which is
		// why the readers look at the list first.
		s, err := openSocket(false)
		if err != nil {
			t.Errorf("%v", err)
			return
		}
		defer s.close()
		if _, err := s.info("mangle"); err != nil {
			t.Errorf("get info of mangle: %v", err)
		}
		if v4 := tableNames(t, false); !strings.Contains(v4, "mangle") {
			t.Errorf("a direct get info of mangle left tables %q: the control did not create it", v4)
		}
	})
}

// A table list that cannot be read is an error, not a reason to ask the kernel anyway.
func TestReadUnreadableTableList(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "net", "ip_tables_names"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadNAT(dir, false, Limits{}); err == nil || !strings.Contains(err.Error(), "without creating") {
		t.Errorf("ReadNAT: %v, want the table list's error", err)
	}
	if _, err := ReadFilter(dir, false, Limits{}); err == nil {
		t.Error("ReadFilter: no error")
	}
	if _, err := ReadInfo(dir, false, "nat"); err == nil {
		t.Error("ReadInfo: no error")
	}
	// No list at all: x_tables is not loaded, so no legacy table exists.
	if pt, err := ReadNAT(t.TempDir(), false, Limits{}); pt != nil || err != nil {
		t.Errorf("no list: %v, %v; want nil, nil", pt, err)
	}
}

// Without CAP_NET_ADMIN (or CAP_NET_RAW for the socket) the error names the capability.
func TestKernelMissingCapability(t *testing.T) {
	inFreshNetns(t, func() {
		if !restore(t, false, smallNAT(2, 1)) || !restore(t, false, "*filter\n:FORWARD ACCEPT [0:0]\nCOMMIT\n") {
			return
		}
		for _, tc := range []struct {
			capability int
			name       string
		}{{unix.CAP_NET_ADMIN, "CAP_NET_ADMIN"}, {unix.CAP_NET_RAW, "CAP_NET_RAW"}} {
			restoreCaps, err := dropEffectiveCap(tc.capability)
			if err != nil {
				t.Errorf("drop %s: %v", tc.name, err)
				return
			}
			_, natErr := ReadNAT(threadProc, false, Limits{})
			_, filterErr := ReadFilter(threadProc, false, Limits{})
			_, infoErr := ReadInfo(threadProc, false, "nat")
			if err := restoreCaps(); err != nil {
				t.Errorf("restore capabilities: %v", err)
				return
			}
			for what, err := range map[string]error{"ReadNAT": natErr, "ReadFilter": filterErr, "ReadInfo": infoErr} {
				if err == nil || !strings.Contains(err.Error(), tc.name) || !errors.Is(err, os.ErrPermission) {
					t.Errorf("without %s: %s: %v, want a permission error naming it", tc.name, what, err)
				}
			}
		}
		if pt, err := ReadNAT(threadProc, false, Limits{}); err != nil || len(pt.Chains) != 1 {
			t.Errorf("capabilities back: %v, %v", pt, err)
		}
	})
}

// dropEffectiveCap removes a capability from the calling thread's effective set (the one the
// kernel checks) and returns how to put it back.
func dropEffectiveCap(c int) (func() error, error) {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return nil, err
	}
	saved := data
	data[c/32].Effective &^= 1 << (c % 32)
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return nil, err
	}
	return func() error { return unix.Capset(&hdr, &saved[0]) }, nil
}

// Info moves when rules are added and stays when nothing changed. An endpoint swapped for
// another of the same shape keeps it too: Info is only a hint.
func TestKernelInfo(t *testing.T) {
	inFreshNetns(t, func() {
		if !restore(t, false, smallNAT(3, 1)) {
			return
		}
		a, err := ReadInfo(threadProc, false, "nat")
		if err != nil || a == nil {
			t.Errorf("ReadInfo: %v, %v", a, err)
			return
		}
		if a.Table != "nat" || a.IPv6 || a.ValidHooks != 0b11011 || a.NumEntries == 0 || a.Size == 0 {
			t.Errorf("info %+v", a)
		}
		if b, err := ReadInfo(threadProc, false, "nat"); err != nil || *b != *a {
			t.Errorf("unchanged table: %+v, %v; want %+v", b, err, a)
		}
		if !restore(t, false, smallNAT(4, 1)) {
			return
		}
		c, err := ReadInfo(threadProc, false, "nat")
		if err != nil || *c == *a || c.NumEntries <= a.NumEntries || c.Size <= a.Size {
			t.Errorf("an endpoint added: %+v, %v; was %+v", c, err, a)
		}
		before, err := ReadNAT(threadProc, false, Limits{})
		if err != nil {
			t.Errorf("ReadNAT: %v", err)
			return
		}
		if !restore(t, false, smallNAT(4, 5)) { // other endpoints, same shape
			return
		}
		d, err := ReadInfo(threadProc, false, "nat")
		after, err2 := ReadNAT(threadProc, false, Limits{})
		if err != nil || err2 != nil || *d != *c {
			t.Errorf("endpoints swapped: info %+v, %v, %v; want it unchanged, %+v", d, err, err2, c)
		}
		if diffProxyTables(before, after) == "" {
			t.Errorf("endpoints swapped: the tables read the same: %v", after.Chains)
		}
	})
}

// A table replaced between the info and the entries calls is read again; one that keeps
// changing ends in an error after a bounded number of reads.
func TestKernelReadRetriesOnReplace(t *testing.T) {
	inFreshNetns(t, func() {
		defer func() { beforeEntries = nil }()
		if !restore(t, false, smallNAT(2, 1)) {
			return
		}
		calls := 0
		beforeEntries = func() {
			calls++
			if calls == 1 {
				restore(t, false, smallNAT(5, 1))
			}
		}
		pt, err := ReadNAT(threadProc, false, Limits{})
		if err != nil || calls != 2 || len(pt.Chains["KUBE-SVC-AAAAAAAAAAAAAAAA"]) != 5 {
			t.Errorf("replaced once: %v, %v after %d reads; want the 5 endpoints of the new table after 2", pt, err, calls)
		}
		calls = 0
		beforeEntries = func() {
			calls++
			restore(t, false, smallNAT(2+calls%2, 1))
		}
		if _, err := ReadNAT(threadProc, false, Limits{}); err == nil || calls != maxAttempts || !strings.Contains(err.Error(), "changed") {
			t.Errorf("replaced at every read: %v after %d reads; want an error after %d", err, calls, maxAttempts)
		}
	})
}
