//go:build e2e

package e2e

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/proxyhealth/proxyhealth/internal/kubeproxynames"
)

// The lab's addresses. Nothing here is routed to or from the root namespace.
const (
	bridgeGW = "10.244.1.1" // node's cni0
	podA     = "10.244.1.2" // client pod, on cni0
	podB     = "10.244.1.3" // server pod on the same bridge as A
	podB2    = "10.244.1.4" // second server "pod" (a second address in B's namespace)
	podC     = "10.244.2.2" // pod on a "remote node" (namespace C), behind a gateway route
	uplinkN  = "172.18.0.2" // node's side of the link to the remote node
	uplinkC  = "172.18.0.3" // remote node's address

	webVIP    = "10.96.0.10" // lab/web:http, endpoints B and B2 (same bridge as A)
	remoteVIP = "10.96.0.20" // lab/web-remote:http, endpoint C (does not answer)
	plainVIP  = "10.96.0.99" // a plain DNAT to C that no Service owns

	podPort   = "8080"
	blackPort = "9" // C silently drops this port too: the INVALID packets' target
)

// Lab is one set of network namespaces shaped like a Kubernetes node: the node namespace with
// bridge cni0 and kube-proxy's iptables rules, pods A and B on the bridge, and C behind a
// routed link. Everything it creates is removed by t.Cleanup.
type Lab struct {
	t   *testing.T
	ID  string
	Dir string // per-lab scratch directory (process logs)

	Node, A, B, C string // namespace names
}

// sysctls applied in the node namespace: conntrack timers shortened so that flows end within
// seconds instead of minutes.
var nodeSysctls = []string{
	"net.ipv4.ip_forward=1",
	"net.bridge.bridge-nf-call-iptables=1",
	"net.netfilter.nf_conntrack_tcp_be_liberal=0",
	"net.netfilter.nf_conntrack_tcp_timeout_syn_sent=5",
	"net.netfilter.nf_conntrack_tcp_timeout_syn_recv=5",
	"net.netfilter.nf_conntrack_tcp_timeout_fin_wait=2",
	"net.netfilter.nf_conntrack_tcp_timeout_close_wait=2",
	"net.netfilter.nf_conntrack_tcp_timeout_last_ack=2",
	"net.netfilter.nf_conntrack_tcp_timeout_time_wait=2",
	"net.netfilter.nf_conntrack_tcp_timeout_close=2",
	"net.netfilter.nf_conntrack_udp_timeout=3",
}

func newLab(t *testing.T) *Lab {
	t.Helper()
	return newLabRules(t, kubeProxyRules())
}

// newLabRules is newLab with the node namespace's initial rules (iptables-restore format) given:
// the control-plane lab starts from labRawRules alone and lets the real kube-proxy write the rest.
func newLabRules(t *testing.T, rules string) *Lab {
	t.Helper()
	requireLab(t)
	var b [3]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	id := hex.EncodeToString(b[:])
	// The test process's pid in the name lets a later run tell a leftover (its creator is gone)
	// from the lab of a run still going (removeLeftovers).
	prefix := fmt.Sprintf("%s%d-%s", nsPrefix, os.Getpid(), id)
	l := &Lab{t: t, ID: id, Dir: t.TempDir(),
		Node: prefix + "-node", A: prefix + "-a", B: prefix + "-b", C: prefix + "-c"}

	for _, ns := range []string{l.Node, l.A, l.B, l.C} {
		mustRun(t, "ip", "netns", "add", ns)
		t.Cleanup(func() {
			if out, err := run("ip", "netns", "del", ns); err != nil {
				t.Errorf("removing namespace %s: %v: %s", ns, err, out)
			}
		})
		// IPv6 off: no router/neighbour chatter through the node's conntrack.
		l.MustExec(ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1")
		l.ip(ns, "link", "set", "lo", "up")
	}

	// Node: bridge cni0 with the pod subnet's gateway.
	l.ip(l.Node, "link", "add", "cni0", "type", "bridge")
	l.ip(l.Node, "addr", "add", bridgeGW+"/24", "dev", "cni0")
	l.ip(l.Node, "link", "set", "cni0", "up")
	for _, p := range []struct{ ns, host string }{{l.A, "veth-a"}, {l.B, "veth-b"}} {
		l.ip(l.Node, "link", "add", p.host, "type", "veth", "peer", "name", "eth0", "netns", p.ns)
		l.ip(l.Node, "link", "set", p.host, "master", "cni0", "up")
	}
	l.ip(l.A, "addr", "add", podA+"/24", "dev", "eth0")
	l.ip(l.B, "addr", "add", podB+"/24", "dev", "eth0")
	l.ip(l.B, "addr", "add", podB2+"/24", "dev", "eth0")
	for _, ns := range []string{l.A, l.B} {
		l.ip(ns, "link", "set", "eth0", "up")
		l.ip(ns, "route", "add", "default", "via", bridgeGW)
	}

	// Remote node C, reached through a gateway route the way host-gw routing reaches another
	// node's pod subnet.
	l.ip(l.Node, "link", "add", "eth1", "type", "veth", "peer", "name", "eth0", "netns", l.C)
	l.ip(l.Node, "addr", "add", uplinkN+"/24", "dev", "eth1")
	l.ip(l.Node, "link", "set", "eth1", "up")
	l.ip(l.Node, "route", "add", "10.244.2.0/24", "via", uplinkC, "dev", "eth1")
	l.ip(l.C, "addr", "add", uplinkC+"/24", "dev", "eth0")
	l.ip(l.C, "addr", "add", podC+"/24", "dev", "eth0")
	l.ip(l.C, "link", "set", "eth0", "up")
	l.ip(l.C, "route", "add", "default", "via", uplinkN)
	// C answers nothing on the pod port nor on the INVALID packets' port: it drops them
	// silently, like an endpoint that is gone.
	l.MustExecInput(l.C, cNftRules, "nft", "-f", "-")

	l.MustExec(l.Node, append([]string{"sysctl", "-qw"}, nodeSysctls...)...)
	l.IptablesRestore(rules)

	t.Cleanup(func() {
		if t.Failed() {
			for _, c := range [][]string{{"conntrack", "-L"}, {"conntrack", "-S"}, {"iptables-save"}} {
				out, _ := l.Exec(l.Node, c...)
				t.Logf("node %s:\n%s", strings.Join(c, " "), out)
			}
		}
	})
	return l
}

const cNftRules = `table ip lab {
	chain input {
		type filter hook input priority 0; policy accept;
		tcp dport { ` + podPort + `, ` + blackPort + ` } drop
	}
}
`

// labRawRules leaves loopback (and the bridge's IGMP reports) untracked so that the lab's own
// scrapes, and the control plane's loopback traffic, add no flows, events or INVALID packets to
// what the scenarios count.
const labRawRules = `*raw
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
-A PREROUTING -i lo -j NOTRACK
-A OUTPUT -o lo -j NOTRACK
-A OUTPUT -p igmp -j NOTRACK
COMMIT
`

// iptablesServiceChains is kubeproxynames.IPTablesServiceChains of a service port written the
// way kube-proxy names it, "namespace/name:port" ("namespace/name" for an unnamed port).
func iptablesServiceChains(portName, protocol string) (cluster, local string) {
	ns, name, port := splitServicePortName(portName)
	return kubeproxynames.IPTablesServiceChains(ns, name, port, protocol)
}

// iptablesEndpointChain is kubeproxynames.IPTablesEndpointChain of a service port written as
// iptablesServiceChains takes it and an endpoint "ip:port".
func iptablesEndpointChain(portName, protocol, endpoint string) string {
	ns, name, port := splitServicePortName(portName)
	return kubeproxynames.IPTablesEndpointChain(ns, name, port, protocol, netip.MustParseAddrPort(endpoint))
}

func splitServicePortName(portName string) (ns, name, port string) {
	ns, rest, _ := strings.Cut(portName, "/")
	name, port, _ = strings.Cut(rest, ":")
	return ns, name, port
}

// kubeProxyRules is what kube-proxy (iptables mode) writes for two ClusterIP services, in its
// iptables-restore format: lab/web:http (port 80) with endpoints B and B2 on A's bridge, and
// lab/web-remote:http (port 80) with endpoint C on the remote node. A plain DNAT for plainVIP,
// outside KUBE-SERVICES, stands for a DNAT no Service owns. There is deliberately no
// "--ctstate INVALID -j DROP" rule in KUBE-FORWARD: that is incident 2's condition.
// The raw table is labRawRules.
func kubeProxyRules() string {
	type svc struct {
		name, vip string
		eps       []string
	}
	svcs := []svc{
		{"lab/web:http", webVIP, []string{podB + ":" + podPort, podB2 + ":" + podPort}},
		{"lab/web-remote:http", remoteVIP, []string{podC + ":" + podPort}},
	}
	var chains, rules strings.Builder
	for _, s := range svcs {
		svcChain, _ := iptablesServiceChains(s.name, "tcp")
		fmt.Fprintf(&chains, ":%s - [0:0]\n", svcChain)
		fmt.Fprintf(&rules, "-A KUBE-SERVICES -d %s/32 -p tcp -m comment --comment \"%s cluster IP\" -m tcp --dport 80 -j %s\n", s.vip, s.name, svcChain)
		fmt.Fprintf(&rules, "-A %s ! -s 10.244.0.0/16 -d %s/32 -p tcp -m comment --comment \"%s cluster IP\" -m tcp --dport 80 -j KUBE-MARK-MASQ\n", svcChain, s.vip, s.name)
		for i, ep := range s.eps {
			sepChain := iptablesEndpointChain(s.name, "tcp", ep)
			fmt.Fprintf(&chains, ":%s - [0:0]\n", sepChain)
			stat := ""
			if n := len(s.eps) - i; n > 1 {
				stat = fmt.Sprintf(" -m statistic --mode random --probability %0.10f", 1.0/float64(n))
			}
			fmt.Fprintf(&rules, "-A %s -m comment --comment \"%s -> %s\"%s -j %s\n", svcChain, s.name, ep, stat, sepChain)
			epIP := strings.Split(ep, ":")[0]
			fmt.Fprintf(&rules, "-A %s -s %s/32 -m comment --comment \"%s\" -j KUBE-MARK-MASQ\n", sepChain, epIP, s.name)
			fmt.Fprintf(&rules, "-A %s -p tcp -m comment --comment \"%s\" -m tcp -j DNAT --to-destination %s\n", sepChain, s.name, ep)
		}
	}
	return labRawRules + `*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-FORWARD - [0:0]
-A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
COMMIT
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-SERVICES - [0:0]
` + chains.String() + `-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A PREROUTING -d ` + plainVIP + `/32 -p tcp -m tcp --dport 80 -j DNAT --to-destination ` + podC + `:` + podPort + `
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully
` + rules.String() + `-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
COMMIT
`
}

// ip runs `ip -n ns args...` and fails the test on error.
func (l *Lab) ip(ns string, args ...string) {
	l.t.Helper()
	mustRun(l.t, "ip", append([]string{"-n", ns}, args...)...)
}

// Exec runs a command inside namespace ns and returns its combined output.
func (l *Lab) Exec(ns string, args ...string) (string, error) {
	return run("ip", append([]string{"netns", "exec", ns}, args...)...)
}

// MustExec is Exec that fails the test on error.
func (l *Lab) MustExec(ns string, args ...string) string {
	l.t.Helper()
	out, err := l.Exec(ns, args...)
	if err != nil {
		l.t.Fatalf("in %s: %s: %v\n%s", ns, strings.Join(args, " "), err, out)
	}
	return out
}

// MustExecInput is MustExec with stdin.
func (l *Lab) MustExecInput(ns, stdin string, args ...string) string {
	l.t.Helper()
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := runCmd(cmd)
	if err != nil {
		l.t.Fatalf("in %s: %s: %v\n%s", ns, strings.Join(args, " "), err, out)
	}
	return out
}

// IptablesRestore loads rules into the node namespace (iptables-nft, like kube-proxy on a
// current distribution).
func (l *Lab) IptablesRestore(rules string) {
	l.t.Helper()
	l.MustExecInput(l.Node, rules, "iptables-nft-restore")
}

// Sysctl sets one sysctl (key=value) in the node namespace.
func (l *Lab) Sysctl(kv string) {
	l.t.Helper()
	l.MustExec(l.Node, "sysctl", "-qw", kv)
}

// proc is a long-lived process the lab started.
type proc struct {
	cmd  *exec.Cmd
	log  string        // its stdout and stderr
	done chan struct{} // closed when it has exited
}

// Exited tells whether the process has ended.
func (p *proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Start runs a long-lived process inside ns with its output in a file under l.Dir; it is
// stopped (by pid) in cleanup and its output logged if the test failed.
func (l *Lab) Start(ns, name string, args ...string) *proc {
	l.t.Helper()
	return l.start(exec.Command("ip", append([]string{"netns", "exec", ns}, args...)...), name)
}

func (l *Lab) start(cmd *exec.Cmd, name string) *proc {
	l.t.Helper()
	t := l.t
	p := &proc{cmd: cmd, log: filepath.Join(l.Dir, name+".log"), done: make(chan struct{})}
	f, err := os.Create(p.log)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("starting %s: %v", name, err)
	}
	go func() { _ = cmd.Wait(); f.Close(); close(p.done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(3 * time.Second):
			_ = cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			b, _ := os.ReadFile(p.log)
			const max = 30000
			if len(b) > max {
				b = append([]byte("...\n"), b[len(b)-max:]...)
			}
			t.Logf("--- %s output (%s) ---\n%s", name, p.log, b)
		}
	})
	return p
}

// In returns the lab bound to t, so that a subtest's failures and cleanups are its own.
func (l *Lab) In(t *testing.T) *Lab {
	c := *l
	c.t = t
	return &c
}

// ServeTCP starts labtool serve-tcp in ns on addr and waits until it listens.
func (l *Lab) ServeTCP(ns, addr string) {
	l.t.Helper()
	p := l.Start(ns, "serve-"+strings.ReplaceAll(addr, ":", "_")+"-"+ns, labtoolBin, "serve-tcp", addr)
	waitFor(l.t, 5*time.Second, "serve-tcp "+addr+" ready", func() (bool, string) {
		b, _ := os.ReadFile(p.log)
		return strings.Contains(string(b), "ready"), string(b)
	})
}

var succeededRE = regexp.MustCompile(`succeeded (\d+) of (\d+)`)

// Connect dials addr from ns count times at once (one socket, so one source port and one flow,
// each) and returns how many got the server's reply.
func (l *Lab) Connect(ns, addr string, count int, timeout time.Duration) int {
	l.t.Helper()
	out := l.MustExec(ns, labtoolBin, "connect", addr, "--count", strconv.Itoa(count), "--timeout", timeout.String())
	m := succeededRE.FindStringSubmatch(out)
	if m == nil {
		l.t.Fatalf("labtool connect: unexpected output %q", out)
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// ConnectMany runs Connect for every address at once (count connections each) and returns the
// successes in the same order.
func (l *Lab) ConnectMany(ns string, count int, timeout time.Duration, addrs ...string) []int {
	l.t.Helper()
	type result struct {
		out string
		err error
	}
	results := make([]result, len(addrs))
	var wg sync.WaitGroup
	for i, addr := range addrs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := l.Exec(ns, labtoolBin, "connect", addr, "--count", strconv.Itoa(count), "--timeout", timeout.String())
			results[i] = result{out, err}
		}()
	}
	wg.Wait()
	ok := make([]int, len(addrs))
	for i, r := range results {
		m := succeededRE.FindStringSubmatch(r.out)
		if r.err != nil || m == nil {
			l.t.Fatalf("labtool connect %s: %v: %q", addrs[i], r.err, r.out)
		}
		ok[i], _ = strconv.Atoi(m[1])
	}
	return ok
}

// UnrepliedTo returns conntrack's SYN_SENT [UNREPLIED] entries in the node namespace whose
// original destination is vip.
func (l *Lab) UnrepliedTo(vip string) []string {
	l.t.Helper()
	out := l.MustExec(l.Node, "conntrack", "-L", "-p", "tcp", "--orig-dst", vip)
	var lines []string
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "SYN_SENT") && strings.Contains(line, "[UNREPLIED]") {
			lines = append(lines, line)
		}
	}
	return lines
}

// ReapExpired makes the kernel remove expired conntrack entries now. The conntrack garbage
// collector visits a small table only every tens of seconds (its interval follows the average
// timeout of the entries, up to a minute), so an expired flow's DESTROY event can wait that
// long; a table dump evicts every expired entry it walks over, at once.
func (l *Lab) ReapExpired() {
	l.t.Helper()
	l.MustExec(l.Node, "conntrack", "-L")
}

// SendInvalid sends count SYN+FIN packets from ns to dst.
func (l *Lab) SendInvalid(ns, dst string, count int) {
	l.t.Helper()
	l.MustExec(ns, labtoolBin, "send-invalid", dst, "--count", strconv.Itoa(count))
}

// Get fetches url from inside ns.
func (l *Lab) Get(ns, url string) (string, error) {
	cmd := exec.Command("ip", "netns", "exec", ns, labtoolBin, "get", url, "--timeout", (5 * time.Second * waitScale).String())
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("%v: %s", err, stderr.String())
	}
	return string(out), nil
}

// ConntrackInvalid sums the per-CPU "invalid" counters of `conntrack -S` in the node namespace.
func (l *Lab) ConntrackInvalid() int {
	l.t.Helper()
	out := l.MustExec(l.Node, "conntrack", "-S")
	total := 0
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		for _, f := range strings.Fields(sc.Text()) {
			if v, ok := strings.CutPrefix(f, "invalid="); ok {
				n, err := strconv.Atoi(v)
				if err != nil {
					l.t.Fatalf("conntrack -S: %q", sc.Text())
				}
				total += n
			}
		}
	}
	return total
}

// waitFor polls cond every 100ms until it holds or timeout passes; on timeout the test fails
// with cond's last detail.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	timeout *= waitScale
	deadline := time.Now().Add(timeout)
	for {
		ok, detail := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s; last: %s", timeout, what, detail)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitScaleEnv multiplies every bound the lab waits for (waitFor, Exporter.Poll, the timeouts
// of its requests to the apiserver, kube-proxy and the exporter): a kernel matrix guest under
// emulation (test/vm) runs the control plane several times slower. A bound only ends a wait
// that failed; it measures nothing.
const waitScaleEnv = "PROXYHEALTH_LAB_WAIT_SCALE"

var waitScale = func() time.Duration {
	n, err := strconv.Atoi(os.Getenv(waitScaleEnv))
	if err != nil || n < 1 {
		return 1
	}
	return time.Duration(n)
}()

func run(name string, args ...string) (string, error) {
	return runCmd(exec.Command(name, args...))
}

func runCmd(cmd *exec.Cmd) (string, error) {
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func mustRun(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := run(name, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return out
}
