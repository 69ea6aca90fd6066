//go:build linux

package main

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/proxyhealth/proxyhealth/internal/kubeproxynames"
)

func TestParseNetlink(t *testing.T) {
	in := `sk               Eth Pid        Groups   Rmem     Wmem     Dump  Locks    Drops    Inode
000000005fe6c720 0   0          00000000 0        0        0     2        0        12049   
000000002ba0be70 12  4054467627 00000007 4352     0        0     2        1234     12075   
0000000071621d4d 12  7005       00000000 0        0        0     2        0        12074   
`
	rows, err := parseNetlink(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 3 {
		t.Fatalf("got %d rows", len(rows))
	}
	r := rows[1]
	if r.Proto != netlinkNetfilter || r.Groups != 7 || r.Rmem != 4352 || r.Drops != 1234 || r.Inode != 12075 {
		t.Errorf("row 1 = %+v", r)
	}
	if _, err := parseNetlink(strings.NewReader("bogus header\n")); err == nil {
		t.Error("want an error for an unknown header")
	}
}

func TestParseSocketLink(t *testing.T) {
	if ino, ok := parseSocketLink("socket:[12075]"); !ok || ino != 12075 {
		t.Errorf("got %d %v", ino, ok)
	}
	for _, l := range []string{"pipe:[1]", "/dev/null", "socket:[x]", "socket:[12"} {
		if _, ok := parseSocketLink(l); ok {
			t.Errorf("%q parsed as a socket", l)
		}
	}
}

func TestParseStatCPU(t *testing.T) {
	// The command may contain spaces and parentheses.
	s := "4242 (conn (track) x) S 1 4242 4242 0 -1 4194560 120 0 0 0 37 5 0 0 20 0 1 0 100 1000 200"
	u, st, err := parseStatCPU(s)
	if err != nil {
		t.Fatal(err)
	}
	if u != 37 || st != 5 {
		t.Errorf("utime, stime = %d, %d, want 37, 5", u, st)
	}
}

func TestParseStatusKB(t *testing.T) {
	s := "Name:\tconntrack\nVmPeak:\t   10000 kB\nVmHWM:\t    1936 kB\nVmRSS:\t    1800 kB\n"
	if v, err := parseStatusKB(s, "VmHWM"); err != nil || v != 1936 {
		t.Errorf("VmHWM = %d, %v", v, err)
	}
	if _, err := parseStatusKB(s, "VmSwap"); err == nil {
		t.Error("want an error for a missing field")
	}
}

func TestParseCTStats(t *testing.T) {
	in := `entries  clashres found new invalid ignore delete chainlength insert insert_failed drop early_drop icmp_error  expect_new expect_create expect_delete search_restart
000007e0  00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000001 00000002 00000010 00000000  00000000 00000000 00000000 00000000
000007e0  00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000003 00000001 00000000  00000000 00000000 00000000 00000000
`
	st, err := parseCTStats(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	want := ctStats{Entries: 0x7e0, Drop: 5, EarlyDrop: 17, InsertFailed: 1}
	if st != want {
		t.Errorf("got %+v, want %+v", st, want)
	}
}

func TestParseExporterMetrics(t *testing.T) {
	in := `# HELP proxyhealth_conntrack_events_total Conntrack events received.
# TYPE proxyhealth_conntrack_events_total counter
proxyhealth_conntrack_events_total{event="destroy"} 1.5e+06
proxyhealth_conntrack_events_total{event="new"} 2e+06
proxyhealth_conntrack_events_total{event="update"} 3
proxyhealth_conntrack_events_lost_total 17
proxyhealth_conntrack_events_lost_total_other 99
proxyhealth_conntrack_entries 12
`
	c, err := parseExporterMetrics(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if !c.HaveEvents || !c.HaveLost || c.Events != 3_500_003 || c.Lost != 17 {
		t.Errorf("got %+v", c)
	}
	c, err = parseExporterMetrics(strings.NewReader("proxyhealth_conntrack_entries 1\n"))
	if err != nil || c.HaveEvents || c.HaveLost {
		t.Errorf("got %+v, %v", c, err)
	}
}

func TestParseSteps(t *testing.T) {
	got, err := parseSteps("10k, 25000,max")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[0].Rate != 10000 || got[1].Rate != 25000 || got[2].Rate != 0 || got[2].Label != "max" {
		t.Errorf("got %+v", got)
	}
	for _, bad := range []string{"", "fast", "-5", "0", "1e9"} {
		if _, err := parseSteps(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestKubeProxyRules(t *testing.T) {
	r := kubeProxyRules(2, 9869)
	for _, want := range []string{
		"-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES",
		"-d 10.96.0.10/32 -p udp -m comment --comment \"kube-system/kube-dns:dns cluster IP\" -m udp --dport 53 -j KUBE-SVC-",
		"-m statistic --mode random --probability 0.33333333333 -j KUBE-SEP-",
		"-m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-",
		"-j DNAT --to-destination 10.244.1.4:53",
		"-A OUTPUT -p tcp -m tcp --sport 9869 -j CT --notrack",
	} {
		if !strings.Contains(r, want) {
			t.Errorf("rules lack %q:\n%s", want, r)
		}
	}
	if n := strings.Count(r, "-j DNAT"); n != 5 {
		t.Errorf("%d DNAT rules, want 5 (2 filler + 3 endpoints)", n)
	}
	if n := strings.Count(r, "COMMIT"); n != 2 {
		t.Errorf("%d COMMITs, want 2", n)
	}
}

// The chains are named as kube-proxy names them: kube-dns's UDP port is KUBE-SVC-TCOU7JCQXEZGVUNU
// on every cluster.
func TestKubeProxyRulesChainNames(t *testing.T) {
	r := kubeProxyRules(2, 9869)
	want := []string{"-j KUBE-SVC-TCOU7JCQXEZGVUNU\n"}
	for _, ep := range endpoints {
		sep := kubeproxynames.IPTablesEndpointChain("kube-system", "kube-dns", "dns", "UDP", netip.AddrPortFrom(netip.MustParseAddr(ep), defaultPort))
		want = append(want, "-A KUBE-SVC-TCOU7JCQXEZGVUNU -m comment --comment \"kube-system/kube-dns:dns -> "+ep+":53\"", ":"+sep+" - [0:0]\n", "-A "+sep+" -p udp")
	}
	for _, w := range want {
		if !strings.Contains(r, w) {
			t.Errorf("rules lack %q:\n%s", w, r)
		}
	}
}
