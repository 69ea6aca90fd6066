package conntrack

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/promslog"
	"github.com/proxyhealth/proxyhealth/collectors/collectortest"
	"github.com/proxyhealth/proxyhealth/internal/hostrules"
	"github.com/proxyhealth/proxyhealth/internal/ruleset"
	"github.com/proxyhealth/proxyhealth/internal/testsupport/prereq"
)

// inNetnsEnv marks the test binary re-executed inside its own network namespace.
const inNetnsEnv = "PROXYHEALTH_TEST_NETNS"

// TestMain re-runs the package's tests inside a new network namespace when it can (root and
// unshare(1) present), so the kernel tests below change rules and sysctls only there; the
// namespace disappears with the process.
func TestMain(m *testing.M) {
	if os.Getenv(inNetnsEnv) == "" && os.Geteuid() == 0 {
		if unshare, err := exec.LookPath("unshare"); err == nil {
			cmd := exec.Command(unshare, append([]string{"--net", "--", os.Args[0]}, os.Args[1:]...)...)
			cmd.Env = append(os.Environ(), inNetnsEnv+"=1")
			cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
			if err := cmd.Run(); err != nil {
				if ee, ok := err.(*exec.ExitError); ok {
					os.Exit(ee.ExitCode())
				}
				fmt.Fprintln(os.Stderr, "unshare:", err)
				os.Exit(1)
			}
			os.Exit(0)
		}
	}
	os.Exit(m.Run())
}

func requireOwnNetns(t *testing.T, tools ...string) {
	t.Helper()
	if os.Getenv(inNetnsEnv) != "1" {
		prereq.Skip(t, "needs root and unshare(1) to run in a network namespace of its own")
	}
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			prereq.Skipf(t, "%s not installed", tool)
		}
	}
}

func sh(t *testing.T, script string) {
	t.Helper()
	out, err := exec.Command("sh", "-ec", script).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", script, err, out)
	}
}

// kubeDNSRules is kube-proxy's iptables-mode shape for one UDP service port with one endpoint.
const kubeDNSRules = `*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-SVC-TCOU7JCQXEZGVUNU - [0:0]
:KUBE-SEP-2BQ7TVJBHSYQZ5EO - [0:0]
:KUBE-SVC-ALTDNS54ALTDNS54 - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A KUBE-SERVICES -d 10.96.0.10/32 -p udp -m comment --comment "kube-system/kube-dns:dns cluster IP" -m udp --dport 53 -j KUBE-SVC-TCOU7JCQXEZGVUNU
-A KUBE-SVC-TCOU7JCQXEZGVUNU -m comment --comment "kube-system/kube-dns:dns -> 10.0.0.1:5353" -j KUBE-SEP-2BQ7TVJBHSYQZ5EO
-A KUBE-SEP-2BQ7TVJBHSYQZ5EO -p udp -m comment --comment "kube-system/kube-dns:dns" -m udp -j DNAT --to-destination 10.0.0.1:5353
-A KUBE-SERVICES -d 10.96.0.10/32 -p udp -m comment --comment "kube-system/early:dns cluster IP" -m udp --dport 54 -j KUBE-SVC-ALTDNS54ALTDNS54
-A KUBE-SVC-ALTDNS54ALTDNS54 -p udp -j DNAT --to-destination 10.0.0.1:5354
COMMIT
`

// kubeDNSServices is kubeDNSRules' KUBE-SERVICES as internal/hostrules reads it.
var kubeDNSServices = &hostrules.State{Seq: 1, Mode: hostrules.ModeIPTables, Proxy: map[bool]*ruleset.ProxyTable{false: {
	Services: []ruleset.Service{
		{ClusterIP: netip.MustParseAddr("10.96.0.10"), Port: 53, Protocol: ruleset.ProtoUDP, Namespace: "kube-system", Name: "kube-dns", PortName: "dns"},
		{ClusterIP: netip.MustParseAddr("10.96.0.10"), Port: 54, Protocol: ruleset.ProtoUDP, Namespace: "kube-system", Name: "early", PortName: "dns"},
	}}}}

func sendUDP(t *testing.T, n int, dst string) {
	t.Helper()
	for i := 0; i < n; i++ {
		conn, err := net.Dial("udp4", dst)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Write([]byte("q")); err != nil {
			t.Fatal(err)
		}
		conn.Close()
	}
}

func TestKernelUnrepliedServiceFlows(t *testing.T) {
	requireOwnNetns(t, "ip", "iptables-restore", "iptables-nft")
	sh(t, `ip link set lo up
ip link add ph-a type veth peer name ph-b
ip addr add 10.0.0.1/24 dev ph-a
ip link set ph-a up; ip link set ph-b up
ip route add 10.96.0.0/16 dev ph-a
sysctl -qw net.netfilter.nf_conntrack_udp_timeout=3`)
	restore := exec.Command("iptables-restore")
	restore.Stdin = strings.NewReader(kubeDNSRules)
	if out, err := restore.CombinedOutput(); err != nil {
		t.Fatalf("iptables-restore: %v\n%s", err, out)
	}

	// One flow exists before the collector starts, to another Service port: it must be seeded
	// from the table dump. Whether the kernel reports its end (nf_conntrack_events=2 attaches
	// event delivery at creation only while a listener exists) is the kernel's business; it
	// must leave the open gauge either way.
	sendUDP(t, 1, "10.96.0.10:54")

	cfg := Config{UnrepliedAfter: 200 * time.Millisecond, MaxTrackedFlows: 100, MaxServiceSeries: 10,
		SocketBufferBytes: 1 << 20, ServiceRefreshInterval: time.Hour, ResyncMinInterval: time.Hour,
		ProcPath: "/proc", Rules: &rulesAt{kubeDNSServices}, SilentCheckInterval: 200 * time.Millisecond}
	c, err := New(cfg, promslog.NewNopLogger())
	if err != nil {
		t.Fatal(err)
	}
	runInBackground(t, c.Run)

	waitFor(t, "the listener to seed from the table", func() bool { return c.resyncs.Load() >= 1 && c.view.Load().services.Len() == 2 })
	early := `protocol="udp",reason="local_endpoint",service_name="early",service_namespace="kube-system",service_port="54"`
	waitForScrape(t, c, "proxyhealth_conntrack_open_unreplied_flows{"+early+"} 1")
	sendUDP(t, 2, "10.96.0.10:53")

	// 10.0.0.1 is this namespace's own address: a local endpoint.
	labels := `protocol="udp",reason="local_endpoint",service_name="kube-dns",service_namespace="kube-system",service_port="53"`
	waitForScrape(t, c, "proxyhealth_conntrack_open_unreplied_flows{"+labels+"} 2")
	// They end when the UDP timeout (3s) expires. The kernel reaps expired entries of a
	// near-empty table only every tens of seconds; reading the table reaps them at once.
	reap := func() { _ = dumpTable(func(*flowEvent) {}) }
	waitForScrape(t, c, "proxyhealth_conntrack_unreplied_flows_total{"+labels+"} 2", reap)
	out := scrape(t, c)
	for _, want := range []string{`proxyhealth_conntrack_events_total{event="new"} 2`, `proxyhealth_conntrack_events_lost_total 0`, `proxyhealth_conntrack_tracked_flows 0`} {
		if !strings.Contains(out, want) {
			t.Errorf("scrape lacks %q:\n%s", want, out)
		}
	}
	if err := c.Update(make(chan prometheus.Metric, 200)); err != nil {
		t.Errorf("Update: %v", err)
	}
}

func scrape(t *testing.T, c *Collector) string {
	t.Helper()
	got, _ := collectortest.Collect(t, c)
	return got.String()
}

// waitForScrape scrapes until want is in the output, running each of between before each try.
func waitForScrape(t *testing.T, c *Collector, want string, between ...func()) {
	t.Helper()
	var last string
	deadline := time.Now().Add(20 * time.Second)
	for {
		for _, f := range between {
			f()
		}
		if last = scrape(t, c); strings.Contains(last, want) {
			return
		}
		if time.Now().After(deadline) {
			out, _ := exec.Command("conntrack", "-L").CombinedOutput()
			t.Fatalf("timed out waiting for %s; last scrape:\n%s\nconntrack -L:\n%s", want, last, out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
