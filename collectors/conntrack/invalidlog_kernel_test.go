package conntrack

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/common/promslog"
	"golang.org/x/sys/unix"

	"github.com/proxyhealth/proxyhealth/internal/cluster"
	"github.com/proxyhealth/proxyhealth/internal/hostrules"
	"github.com/proxyhealth/proxyhealth/internal/ruleset"
)

// webServiceRules is kube-proxy's iptables-mode shape for default/web, TCP port 80 on cluster
// IP 10.96.0.20, with one endpoint 10.0.0.1:8080 on this node.
const webServiceRules = `*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-SVC-WEBWEBWEBWEBWEB1 - [0:0]
:KUBE-SEP-WEBWEBWEBWEBWEB1 - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A KUBE-SERVICES -d 10.96.0.20/32 -p tcp -m comment --comment "default/web:http cluster IP" -m tcp --dport 80 -j KUBE-SVC-WEBWEBWEBWEBWEB1
-A KUBE-SVC-WEBWEBWEBWEBWEB1 -m comment --comment "default/web:http -> 10.0.0.1:8080" -j KUBE-SEP-WEBWEBWEBWEBWEB1
-A KUBE-SEP-WEBWEBWEBWEBWEB1 -p tcp -m comment --comment "default/web:http" -m tcp -j DNAT --to-destination 10.0.0.1:8080
COMMIT
`

// webServiceState is webServiceRules as internal/hostrules reads them, with an IPv6 twin of
// the Service (cluster IP fd00:96::20, endpoint [fd00::1]:8080).
var webServiceState = &hostrules.State{Seq: 1, Mode: hostrules.ModeIPTables, Proxy: map[bool]*ruleset.ProxyTable{
	false: {
		Chains:   map[string][]netip.AddrPort{"KUBE-SVC-WEBWEBWEBWEBWEB1": {netip.MustParseAddrPort("10.0.0.1:8080")}},
		Services: []ruleset.Service{{ClusterIP: netip.MustParseAddr("10.96.0.20"), Port: 80, Protocol: ruleset.ProtoTCP, Namespace: "default", Name: "web", PortName: "http", Chain: "KUBE-SVC-WEBWEBWEBWEBWEB1"}},
	},
	true: {
		Chains:   map[string][]netip.AddrPort{"KUBE-SVC-WEB6WEB6WEB6WEB6": {netip.MustParseAddrPort("[fd00::1]:8080")}},
		Services: []ruleset.Service{{ClusterIP: netip.MustParseAddr("fd00:96::20"), Port: 80, Protocol: ruleset.ProtoTCP, Namespace: "default", Name: "web6", PortName: "http", Chain: "KUBE-SVC-WEB6WEB6WEB6WEB6"}},
	},
}}

// clientNetns starts a network namespace of its own, held by a sleeping process, joined to
// this one by a veth pair: ph-c (the client, 10.0.1.2, fd00:1::2) there, ph-n (10.0.1.1,
// fd00:1::1) here. It returns the holder's pid.
func clientNetns(t *testing.T) int {
	t.Helper()
	holder := exec.Command("unshare", "--net", "sleep", "120")
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { holder.Process.Kill(); holder.Wait() })
	pid := holder.Process.Pid
	// unshare has made the namespace once the holder's differs from ours.
	own, _ := os.Readlink("/proc/self/ns/net")
	waitFor(t, "the client namespace", func() bool {
		ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", pid))
		return err == nil && ns != own
	})
	in := fmt.Sprintf("nsenter --net=/proc/%d/ns/net ", pid)
	// A pair of an earlier run (-count) goes first.
	sh(t, fmt.Sprintf(`ip link del ph-n 2>/dev/null || true
ip link add ph-n type veth peer name ph-c
ip link set ph-c netns %[1]d
ip addr add 10.0.1.1/24 dev ph-n
ip addr add fd00:1::1/64 dev ph-n nodad
ip link set ph-n up
%[2]s ip link set lo up
%[2]s ip addr add 10.0.1.2/24 dev ph-c
%[2]s ip addr add fd00:1::2/64 dev ph-c nodad
%[2]s ip link set ph-c up
%[2]s ip route add default via 10.0.1.1
%[2]s ip -6 route add default via fd00:1::1`, pid, in))
	return pid
}

// inNetns runs fn on a thread moved into the network namespace of pid; sockets it opens stay
// there.
func inNetns(t *testing.T, pid int, fn func()) {
	t.Helper()
	runtime.LockOSThread()
	own, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(own)
	target, err := unix.Open(fmt.Sprintf("/proc/%d/ns/net", pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(target)
	if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
		t.Fatal(err)
	}
	fn()
	if err := unix.Setns(own, unix.CLONE_NEWNET); err != nil {
		// The thread stays locked and ends with the goroutine, in the wrong namespace.
		t.Fatal(err)
	}
	runtime.UnlockOSThread()
}

const (
	tcpFIN = 0x01
	tcpSYN = 0x02
	tcpRST = 0x04
	tcpACK = 0x10
)

// tcpSegment builds a TCP header (no options, no data) from src to dst, its checksum right
// or, with badChecksum, off by one.
func tcpSegment(src, dst netip.AddrPort, flags byte, seq, ack uint32, badChecksum bool) []byte {
	b := make([]byte, 20)
	binary.BigEndian.PutUint16(b[0:2], src.Port())
	binary.BigEndian.PutUint16(b[2:4], dst.Port())
	binary.BigEndian.PutUint32(b[4:8], seq)
	binary.BigEndian.PutUint32(b[8:12], ack)
	b[12] = 5 << 4
	b[13] = flags
	binary.BigEndian.PutUint16(b[14:16], 64240)
	// The pseudo-header: addresses, protocol, length.
	var sum uint32
	add := func(p []byte) {
		for i := 0; i+1 < len(p); i += 2 {
			sum += uint32(binary.BigEndian.Uint16(p[i:]))
		}
	}
	add(src.Addr().AsSlice())
	add(dst.Addr().AsSlice())
	sum += 6 + uint32(len(b))
	add(b)
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	csum := ^uint16(sum)
	if badChecksum {
		csum++
	}
	binary.BigEndian.PutUint16(b[16:18], csum)
	return b
}

// rawTCPSender opens a raw TCP socket of src's family bound to src's address; the kernel adds
// the IP header.
func rawTCPSender(t *testing.T, src netip.AddrPort) func(dst netip.AddrPort, seg []byte) {
	t.Helper()
	family := unix.AF_INET
	if src.Addr().Is6() {
		family = unix.AF_INET6
	}
	fd, err := unix.Socket(family, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	sockaddr := func(a netip.AddrPort) unix.Sockaddr {
		if a.Addr().Is6() {
			return &unix.SockaddrInet6{Addr: a.Addr().As16()}
		}
		return &unix.SockaddrInet4{Addr: a.Addr().As4()}
	}
	if err := unix.Bind(fd, sockaddr(src)); err != nil {
		t.Fatal(err)
	}
	return func(dst netip.AddrPort, seg []byte) {
		t.Helper()
		// A flood fills the veth's queue, which slower kernels (and emulated CPUs) drain more
		// slowly: ENOBUFS then says "wait", not "fail". Every segment still goes out, so the
		// tests that count them stay exact.
		for try := 0; ; try++ {
			err := unix.Sendto(fd, seg, 0, sockaddr(dst))
			if err == nil {
				return
			}
			if !errors.Is(err, unix.ENOBUFS) || try == 1000 {
				t.Fatalf("send to %s: %v", dst, err)
			}
			time.Sleep(time.Millisecond)
		}
	}
}

// runInBackground runs run until the returned stop is called, or the test ends; stop waits
// for run to return (the reader puts the node's settings back before it does), and may be
// called more than once.
func runInBackground(t *testing.T, run func(context.Context)) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { run(ctx); close(done) }()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return stop
}

func readProcSettings(t *testing.T) string {
	t.Helper()
	return readSettings(t, "/proc")
}

func TestKernelInvalidReasons(t *testing.T) {
	requireOwnNetns(t, "ip", "iptables", "iptables-restore", "ip6tables-restore", "iptables-nft", "unshare", "nsenter")
	sh(t, `ip link set lo up
ip addr replace 10.0.0.1/32 dev lo
ip addr replace fd00::1/128 dev lo nodad
sysctl -qw net.ipv4.ip_forward=1`)
	// The IPv6 twin: conntrack tracks a family in a namespace only once something there
	// needs it (here, as on a node, kube-proxy's nat rules).
	web6 := strings.NewReplacer("10.96.0.20/32", "fd00:96::20/128", "10.0.0.1:8080", "[fd00::1]:8080", "WEBWEBWEBWEBWEB1", "WEB6WEB6WEB6WEB6", "default/web:", "default/web6:").Replace(webServiceRules)
	for tool, rules := range map[string]string{"iptables-restore": webServiceRules, "ip6tables-restore": web6} {
		restore := exec.Command(tool)
		restore.Stdin = strings.NewReader(rules)
		if out, err := restore.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", tool, err, out)
		}
	}
	client := clientNetns(t)
	// Loaded by the bind at the latest; the values here are this namespace's defaults.
	sh(t, "modprobe nfnetlink_log 2>/dev/null || true; sysctl -qw net.netfilter.nf_conntrack_log_invalid=0")
	before := readProcSettings(t)

	// The API view syncs later in the test, with two more Services that kube-proxy's rules
	// here do not name: only the API view gives node ports and external IPs.
	// The API view is published part way (notifyingView tells of it, as cluster.Cluster does).
	view := &notifyingView{snap: &cluster.Snapshot{}}
	cfg := Config{UnrepliedAfter: time.Second, MaxTrackedFlows: 100, MaxServiceSeries: 10, SocketBufferBytes: 1 << 20,
		ServiceRefreshInterval: time.Hour, ResyncMinInterval: time.Hour, ProcPath: "/proc",
		Rules: &rulesAt{webServiceState}, View: view, InvalidReasons: true}
	c, err := New(cfg, promslog.NewNopLogger())
	if err != nil {
		t.Fatal(err)
	}
	stop := runInBackground(t, c.Run)
	waitFor(t, "the INVALID log to be read", func() bool {
		return c.invalid.snapshot().err == nil && c.view.Load().endpoints.Len() == 2
	})
	if got := readProcSettings(t); got != "255 nfnetlink_log nfnetlink_log" {
		t.Fatalf("settings while reading: %s", got)
	}

	client4 := netip.MustParseAddrPort("10.0.1.2:40000")
	client6 := netip.MustParseAddrPort("[fd00:1::2]:40000")
	clusterIP := netip.MustParseAddrPort("10.96.0.20:80")
	endpoint4 := netip.MustParseAddrPort("10.0.0.1:8080")
	endpoint6 := netip.MustParseAddrPort("[fd00::1]:8080")
	inNetns(t, client, func() {
		send4, send6 := rawTCPSender(t, client4), rawTCPSender(t, client6)
		// SYN+FIN to the cluster IP: the flags are checked before any DNAT.
		send4(clusterIP, tcpSegment(client4, clusterIP, tcpSYN|tcpFIN, 1, 0, false))
		// A SYN with a bad checksum to the endpoint itself (as over a bridge, after DNAT
		// elsewhere); checked at PRE_ROUTING only, so it comes over the veth.
		send4(endpoint4, tcpSegment(client4, endpoint4, tcpSYN, 1, 0, true))
		send4(endpoint4, tcpSegment(client4, endpoint4, tcpSYN, 1, 0, true))
		// IPv6: SYN+FIN to the endpoint.
		send6(endpoint6, tcpSegment(client6, endpoint6, tcpSYN|tcpFIN, 1, 0, false))
	})
	for _, want := range []string{
		`proxyhealth_conntrack_invalid_reason_packets_total{reason="tcp_flags",service_name="web",service_namespace="default"} 1`,
		`proxyhealth_conntrack_invalid_reason_packets_total{reason="checksum",service_name="web",service_namespace="default"} 2`,
		`proxyhealth_conntrack_invalid_reason_packets_total{reason="tcp_flags",service_name="web6",service_namespace="default"} 1`,
	} {
		waitForScrape(t, c, want)
	}

	// From the API view: default/nodeport's node port 30080 on the node's address the client
	// reaches (ph-n's 10.0.1.1), and default/external's external IP 192.0.2.10 (routed to
	// the node, as a cloud's or a router's route sends it). A SYN+FIN to another port of the
	// node names no Service.
	node := netip.MustParseAddr("10.0.1.1")
	view.publish(&cluster.Snapshot{Synced: true, Generation: 1, Ports: []*cluster.ServicePort{{
		Name:       cluster.ServicePortName{Namespace: "default", Name: "external", Port: "http", Protocol: "TCP"},
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.40")}, ExternalIPs: []netip.Addr{netip.MustParseAddr("192.0.2.10")},
		Port: 80,
	}, {
		Name:       cluster.ServicePortName{Namespace: "default", Name: "nodeport", Port: "http", Protocol: "TCP"},
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.30")}, NodePort: 30080,
		Port: 80,
	}}})
	nodePort := netip.AddrPortFrom(node, 30080)
	otherPort := netip.AddrPortFrom(node, 30081)
	externalIP := netip.MustParseAddrPort("192.0.2.10:80")
	waitFor(t, "the API view's Service map", func() bool {
		_, ok := c.view.Load().services.Lookup(externalIP.Addr(), externalIP.Port(), ruleset.ProtoTCP)
		return ok
	})
	inNetns(t, client, func() {
		send4 := rawTCPSender(t, client4)
		send4(nodePort, tcpSegment(client4, nodePort, tcpSYN|tcpFIN, 1, 0, false))
		send4(externalIP, tcpSegment(client4, externalIP, tcpSYN|tcpFIN, 1, 0, false))
		send4(externalIP, tcpSegment(client4, externalIP, tcpSYN|tcpFIN, 1, 0, false))
		send4(otherPort, tcpSegment(client4, otherPort, tcpSYN|tcpFIN, 1, 0, false))
	})
	for _, want := range []string{
		`proxyhealth_conntrack_invalid_reason_packets_total{reason="tcp_flags",service_name="nodeport",service_namespace="default"} 1`,
		`proxyhealth_conntrack_invalid_reason_packets_total{reason="tcp_flags",service_name="external",service_namespace="default"} 2`,
		`proxyhealth_conntrack_invalid_reason_packets_total{reason="tcp_flags",service_name="",service_namespace=""} 1`,
	} {
		waitForScrape(t, c, want)
	}

	// Another user of NFLOG group 0: rules without --nflog-group, whose prefixes read like
	// conntrack's reasons. Their messages are counted apart, in no INVALID series.
	sh(t, `iptables -A INPUT -p udp --dport 9999 -j NFLOG --nflog-prefix "DROP bad checksum"
iptables -A INPUT -p udp --dport 9998 -j NFLOG --nflog-prefix "fw: ignored host"`)
	inNetns(t, client, func() {
		for _, port := range []string{"9999", "9998"} {
			conn, err := net.Dial("udp", net.JoinHostPort(node.String(), port))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := conn.Write([]byte("x")); err != nil {
				t.Fatal(err)
			}
			conn.Close()
		}
	})
	waitForScrape(t, c, "proxyhealth_conntrack_invalid_log_foreign_messages_total 2")
	out := scrape(t, c)
	for _, want := range []string{
		"proxyhealth_conntrack_invalid_reason_packets_lost_total 0",
		`proxyhealth_conntrack_invalid_reason_packets_total{reason="checksum",service_name="web",service_namespace="default"} 2`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("scrape lacks %s:\n%s", want, out)
		}
	}
	if strings.Contains(out, `reason="ignored"`) || strings.Count(out, `reason="checksum"`) != 1 {
		t.Errorf("a foreign message was counted as conntrack's:\n%s", out)
	}
	stop()
	if got := readProcSettings(t); got != before {
		t.Errorf("settings after the collector stopped: %s, want %s", got, before)
	}
}

func TestKernelInvalidReasonsGroupTaken(t *testing.T) {
	requireOwnNetns(t)
	sh(t, "modprobe nf_conntrack 2>/dev/null || true; sysctl -qw net.netfilter.nf_conntrack_log_invalid=0")
	before := readProcSettings(t)
	other, err := openInvalidLog(1 << 16)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()

	cfg := Config{UnrepliedAfter: time.Second, MaxTrackedFlows: 100, MaxServiceSeries: 10, SocketBufferBytes: 1 << 20,
		ServiceRefreshInterval: time.Hour, ResyncMinInterval: time.Hour, ProcPath: "/proc", InvalidReasons: true}
	c, err := New(cfg, promslog.NewNopLogger())
	if err != nil {
		t.Fatal(err)
	}
	runInBackground(t, c.Run)
	waitFor(t, "the taken group to be reported", func() bool { return errors.Is(c.invalid.snapshot().err, errGroupTaken) })
	if got := readProcSettings(t); got != before {
		t.Errorf("settings changed although the group is taken: %s, was %s", got, before)
	}
	// The rest of the collector works: the event listener runs.
	waitFor(t, "the event listener", func() bool { return c.resyncs.Load() >= 1 })
	t.Logf("reported: %v", c.invalid.snapshot().err)
}

// noNetAdminEnv makes TestKernelInvalidLogWithoutNetAdmin do its check: it is set in the
// copy of the test binary run without capabilities.
const noNetAdminEnv = "PROXYHEALTH_TEST_NO_NET_ADMIN"

// Without CAP_NET_ADMIN the bind's EPERM names the missing privilege, not a taken group.
func TestKernelInvalidLogWithoutNetAdmin(t *testing.T) {
	if os.Getenv(noNetAdminEnv) == "1" {
		if hasNetAdmin() {
			t.Fatal("still holds CAP_NET_ADMIN")
		}
		_, err := openInvalidLog(1 << 16)
		if err == nil || errors.Is(err, errGroupTaken) || !strings.Contains(err.Error(), "CAP_NET_ADMIN") {
			t.Fatalf("openInvalidLog without CAP_NET_ADMIN: %v, want the missing privilege named", err)
		}
		t.Logf("reported: %v", err)
		return
	}
	requireOwnNetns(t, "setpriv")
	// Root's uid, so the test binary stays readable, with no capability at all.
	cmd := exec.Command("setpriv", "--bounding-set=-all", "--inh-caps=-all", os.Args[0],
		"-test.run=^TestKernelInvalidLogWithoutNetAdmin$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), noNetAdminEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "reported:") {
		t.Fatalf("without CAP_NET_ADMIN: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}

// readOnlySysEnv makes TestKernelInvalidLogReadOnlyProcSys do its check: it is set in the copy
// of the test binary run with /proc/sys read-only, as container runtimes mount it.
const readOnlySysEnv = "PROXYHEALTH_TEST_RO_PROC_SYS"

// A read-only /proc/sys fails the part with the way out named, and binds nothing.
func TestKernelInvalidLogReadOnlyProcSys(t *testing.T) {
	if os.Getenv(readOnlySysEnv) == "1" {
		l := newInvalidLog(&Config{ProcPath: "/proc", SocketBufferBytes: 1 << 16, MaxServiceSeries: 1}, promslog.NewNopLogger(), nil)
		err := l.start()
		if err == nil || !strings.Contains(err.Error(), "read-only") || !strings.Contains(err.Error(), "--conntrack.invalid-reasons.netfilter-dir") {
			t.Fatalf("start with /proc/sys read-only: %v, want the read-only file system and the way out named", err)
		}
		// The group is free again: the socket was closed.
		other, err2 := openInvalidLog(1 << 16)
		if err2 != nil {
			t.Fatalf("group 0 still held after the failure: %v", err2)
		}
		other.Close()
		t.Logf("reported: %v", err)
		return
	}
	requireOwnNetns(t, "unshare", "mount")
	sh(t, "modprobe nf_conntrack 2>/dev/null || true")
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-ec",
		`mount --bind /proc/sys /proc/sys; mount -o remount,ro,bind /proc/sys; exec "$@"`, "sh",
		os.Args[0], "-test.run=^TestKernelInvalidLogReadOnlyProcSys$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), readOnlySysEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "reported:") {
		t.Fatalf("with /proc/sys read-only: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}

// failingSocket is an NFLOG socket whose receive fails at once, as recvmmsg or a malformed
// message length can.
type failingSocket struct{ eventSource }

func (failingSocket) receiveBatches(func([]byte) error) error {
	return errors.New("receive conntrack events: no buffer space")
}

// After a receive error the reader binds group 0 again in the same namespace and reads on: the
// failed socket is closed first, or the kernel refuses the bind as if another process held it.
func TestKernelInvalidLogRebindsAfterReceiveError(t *testing.T) {
	requireOwnNetns(t, "ip", "iptables")
	sh(t, `ip link set lo up
modprobe nfnetlink_log 2>/dev/null || true
sysctl -qw net.netfilter.nf_conntrack_log_invalid=0
iptables -w -A OUTPUT -m conntrack --ctstate INVALID -j ACCEPT`)
	t.Cleanup(func() {
		if out, err := exec.Command("iptables", "-w", "-D", "OUTPUT", "-m", "conntrack", "--ctstate", "INVALID", "-j", "ACCEPT").CombinedOutput(); err != nil {
			t.Errorf("remove the test's OUTPUT rule: %v\n%s", err, out)
		}
	})
	before := readProcSettings(t)

	view := &attributionView{services: emptyServiceMap{}, endpoints: emptyServiceMap{}, net: &localNet{}}
	l := newInvalidLog(&Config{ProcPath: "/proc", SocketBufferBytes: 1 << 20, MaxServiceSeries: 10}, promslog.NewNopLogger(),
		func() *attributionView { return view })
	var opened atomic.Int32
	l.open = func(n int) (eventSource, error) {
		sock, err := openInvalidLog(n)
		if err != nil {
			return nil, err
		}
		if opened.Add(1) == 1 {
			return failingSocket{sock}, nil
		}
		return sock, nil
	}
	stop := runInBackground(t, l.run)
	waitFor(t, "the group to be bound again", func() bool {
		return opened.Load() == 2 && l.snapshot().err == nil
	})
	if got := readProcSettings(t); got != "255 nfnetlink_log nfnetlink_log" {
		t.Errorf("settings after the re-bind: %s", got)
	}
	// The new socket reads: a SYN+FIN on loopback is INVALID at OUTPUT.
	local := netip.MustParseAddrPort("127.0.0.1:40000")
	dst := netip.MustParseAddrPort("127.0.0.1:80")
	rawTCPSender(t, local)(dst, tcpSegment(local, dst, tcpSYN|tcpFIN, 1, 0, false))
	waitFor(t, "the packet to be counted", func() bool {
		return l.snapshot().counts[invalidKey{invalidTCPFlags, "", ""}] >= 1
	})
	stop()
	if got := readProcSettings(t); got != before {
		t.Errorf("settings after the reader stopped: %s, want %s", got, before)
	}
}

// A flood of SYN+FIN segments to a Service, above --conntrack.invalid-reasons.max-rate: the
// reader goes to sampled windows, unbinding NFLOG group 0 in between and binding it again
// without error, the Service's tcp_flags count still rises window after window, and the time
// listened falls behind the time elapsed. Once the flood ends the reader reads every packet
// again. The flood is bounded in packets as well as time.
func TestKernelInvalidLogFloodIsSampled(t *testing.T) {
	requireOwnNetns(t, "ip", "iptables-restore", "iptables-nft", "unshare", "nsenter")
	sh(t, `ip link set lo up
ip addr replace 10.0.0.1/32 dev lo
sysctl -qw net.ipv4.ip_forward=1`)
	restore := exec.Command("iptables-restore")
	restore.Stdin = strings.NewReader(webServiceRules)
	if out, err := restore.CombinedOutput(); err != nil {
		t.Fatalf("iptables-restore: %v\n%s", err, out)
	}
	client := clientNetns(t)
	sh(t, "modprobe nfnetlink_log 2>/dev/null || true; sysctl -qw net.netfilter.nf_conntrack_log_invalid=0")
	before := readProcSettings(t)

	const maxRate = 200
	cfg := Config{UnrepliedAfter: time.Second, MaxTrackedFlows: 100, MaxServiceSeries: 10, SocketBufferBytes: 1 << 20,
		ServiceRefreshInterval: time.Hour, ResyncMinInterval: time.Hour, ProcPath: "/proc",
		Rules: &rulesAt{webServiceState}, InvalidReasons: true, InvalidReasonsMaxRate: maxRate}
	c, err := New(cfg, promslog.NewNopLogger())
	if err != nil {
		t.Fatal(err)
	}
	// A shorter period than the exporter's, so that the test sees several windows quickly.
	c.invalid.bound.period = 2 * time.Second
	stop := runInBackground(t, c.Run)
	waitFor(t, "the INVALID log to be read", func() bool {
		return c.invalid.snapshot().err == nil && c.view.Load().services.Len() > 0
	})
	started := time.Now()
	webFlags := invalidKey{invalidTCPFlags, "default", "web"}

	client4 := netip.MustParseAddrPort("10.0.1.2:40000")
	clusterIP := netip.MustParseAddrPort("10.96.0.20:80")
	synFin := tcpSegment(client4, clusterIP, tcpSYN|tcpFIN, 1, 0, false)
	var (
		sent            int
		firstSampled    uint64 // the Service's count when sampling was first seen
		rose            bool   // the count rose in a later window, while sampling
		sampledListened time.Duration
	)
	inNetns(t, client, func() {
		send := rawTCPSender(t, client4)
		const maxPackets = 20_000_000
		deadline := time.Now().Add(30 * time.Second)
		for sent < maxPackets && time.Now().Before(deadline) {
			for range 1000 {
				send(clusterIP, synFin)
			}
			sent += 1000
			s := c.invalid.snapshot()
			if s.err != nil {
				t.Fatalf("the reader failed during the flood: %v", s.err)
			}
			switch n := s.counts[webFlags]; {
			case !s.sampling:
			case firstSampled == 0:
				firstSampled = n
			case n > firstSampled:
				rose, sampledListened = true, s.listened
			}
			if rose {
				return
			}
		}
	})
	if firstSampled == 0 {
		t.Fatalf("the reader never sampled after %d packets above %d/s", sent, maxRate)
	}
	if !rose {
		t.Fatalf("the Service's tcp_flags count stayed at %d while sampling (%d packets sent)", firstSampled, sent)
	}
	elapsed := time.Since(started)
	if sampledListened >= elapsed {
		t.Errorf("listened %v of %v while sampling: not less", sampledListened, elapsed)
	}
	out := scrape(t, c)
	if !strings.Contains(out, "proxyhealth_conntrack_invalid_log_listened_seconds_total ") {
		t.Errorf("no time listened in the scrape:\n%s", out)
	}
	t.Logf("%d packets sent in %v; %d counted for default/web; listened %v", sent, elapsed,
		c.invalid.snapshot().counts[webFlags], sampledListened)

	// The flood is over: a quiet window returns the reader to reading every packet.
	waitFor(t, "the reader to read every packet again", func() bool {
		s := c.invalid.snapshot()
		return !s.sampling && s.listening
	})
	if got := readProcSettings(t); got != "255 nfnetlink_log nfnetlink_log" {
		t.Errorf("settings after the flood: %s", got)
	}
	// A quiet window has passed: nothing of the flood is left to read, and one more packet is
	// counted, exactly.
	n := c.invalid.snapshot().counts[webFlags]
	inNetns(t, client, func() { rawTCPSender(t, client4)(clusterIP, synFin) })
	waitForScrape(t, c, fmt.Sprintf(`proxyhealth_conntrack_invalid_reason_packets_total{reason="tcp_flags",service_name="web",service_namespace="default"} %d`, n+1))
	waitForScrape(t, c, "proxyhealth_conntrack_invalid_log_sampling 0")
	stop()
	if got := readProcSettings(t); got != before {
		t.Errorf("settings after the reader stopped: %s, want %s", got, before)
	}
}
