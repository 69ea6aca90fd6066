//go:build linux

package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/proxyhealth/proxyhealth/bench/internal/benchrun"
	"github.com/proxyhealth/proxyhealth/bench/internal/nsproc"
	"github.com/proxyhealth/proxyhealth/internal/kubeproxynames"
	"github.com/proxyhealth/proxyhealth/internal/testsupport/netnsdial"
)

// nsPrefix marks the soak's namespaces; a run removes the leftovers of a killed earlier one.
// The soak measures no speed, so it does not take the speed benchmarks' lock
// (/run/ph-bench.lock) and may run beside them; /run/ph-soak.lock keeps two soaks apart.
const nsPrefix = "ph-soak-"

const (
	exporterAddr  = "127.0.0.1:9869"
	kpMetricsAddr = "127.0.0.1:10249"
	kpHealthAddr  = "127.0.0.1:10256"
)

// run runs a command with a deadline; its combined output is in the error.
func run(ctx context.Context, stdin []byte, name string, args ...string) (string, error) {
	return nsproc.Output(ctx, 5*time.Minute, stdin, name, args...)
}

// setupNamespace creates ns with loopback up, short conntrack timers and kube-proxy shaped
// iptables-nft rules for services Services of five endpoints each.
func setupNamespace(ctx context.Context, ns string, services int) error {
	if _, err := run(ctx, nil, "ip", "netns", "add", ns); err != nil {
		return err
	}
	if _, err := run(ctx, nil, "ip", "-n", ns, "link", "set", "lo", "up"); err != nil {
		return err
	}
	if _, err := run(ctx, nil, "ip", "netns", "exec", ns, "sysctl", "-qw",
		"net.ipv6.conf.all.disable_ipv6=1",
		"net.netfilter.nf_conntrack_udp_timeout=2",
		"net.netfilter.nf_conntrack_udp_timeout_stream=2"); err != nil {
		return err
	}
	_, err := run(ctx, natRules(services, 0), "ip", "netns", "exec", ns, "iptables-nft-restore")
	return err
}

// servicePortName is the one port of every service, TCP.
const servicePortName = "http"

// serviceName is service s's namespace and name.
func serviceName(s int) (namespace, name string) {
	return fmt.Sprintf("ns%d", s%20), fmt.Sprintf("svc%d", s)
}

func serviceVIP(s int) string { return fmt.Sprintf("10.96.%d.%d", s/250, s%250+1) }

// endpointIP is endpoint e of service s in generation gen (rules churn moves endpoints).
func endpointIP(s, e, gen int) string {
	n := (s*5+e+gen*7)%60000 + 1
	return fmt.Sprintf("10.244.%d.%d", n/250, n%250+1)
}

// natRules is kube-proxy's iptables-restore input for services Services (generation gen of
// their endpoints), nat table only.
func natRules(services, gen int) []byte {
	var chains, rules bytes.Buffer
	chains.WriteString("*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n" +
		":KUBE-SERVICES - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n:KUBE-POSTROUTING - [0:0]\n")
	rules.WriteString("-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n" +
		"-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n" +
		"-A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING\n" +
		"-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000\n" +
		"-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN\n" +
		"-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0\n" +
		"-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully\n")
	for s := range services {
		writeService(&chains, &rules, s, gen)
	}
	chains.Write(rules.Bytes())
	chains.WriteString("COMMIT\n")
	return chains.Bytes()
}

// writeService writes service s: its KUBE-SERVICES jump and its chains.
func writeService(chains, rules io.Writer, s, gen int) {
	ns, svcName := serviceName(s)
	name := ns + "/" + svcName + ":" + servicePortName
	svc, _ := kubeproxynames.IPTablesServiceChains(ns, svcName, servicePortName, "TCP")
	fmt.Fprintf(rules, "-A KUBE-SERVICES -d %s/32 -p tcp -m comment --comment \"%s cluster IP\" -m tcp --dport 80 -j %s\n", serviceVIP(s), name, svc)
	writeServiceChains(chains, rules, s, gen)
}

// writeServiceChains writes service s's own chains, its endpoints those of generation gen
// (the rules churn rewrites only these).
func writeServiceChains(chains, rules io.Writer, s, gen int) {
	ns, svcName := serviceName(s)
	name := ns + "/" + svcName + ":" + servicePortName
	svc, _ := kubeproxynames.IPTablesServiceChains(ns, svcName, servicePortName, "TCP")
	fmt.Fprintf(chains, ":%s - [0:0]\n", svc)
	const endpoints = 5
	for e := range endpoints {
		ep := endpointIP(s, e, gen) + ":8080"
		sep := kubeproxynames.IPTablesEndpointChain(ns, svcName, servicePortName, "TCP", netip.MustParseAddrPort(ep))
		fmt.Fprintf(chains, ":%s - [0:0]\n", sep)
		stat := ""
		if n := endpoints - e; n > 1 {
			stat = fmt.Sprintf(" -m statistic --mode random --probability %0.10f", 1.0/float64(n))
		}
		fmt.Fprintf(rules, "-A %s -m comment --comment \"%s -> %s\"%s -j %s\n", svc, name, ep, stat, sep)
		fmt.Fprintf(rules, "-A %s -p tcp -m comment --comment \"%s\" -m tcp -j DNAT --to-destination %s\n", sep, name, ep)
	}
}

// fakeKubeProxy serves kube-proxy's metrics and health endpoints inside the namespace, from a
// capture of the real kube-proxy's metrics. It can go down (both listeners closed) or hang
// (requests accepted, never answered).
type fakeKubeProxy struct {
	ns      string
	metrics []byte

	mu      sync.Mutex
	servers []*http.Server
	hang    chan struct{} // non-nil while hanging; closed to release the held requests
}

func newFakeKubeProxy(ns string, metrics []byte) *fakeKubeProxy {
	return &fakeKubeProxy{ns: ns, metrics: metrics}
}

func (k *fakeKubeProxy) handler(w http.ResponseWriter, r *http.Request) {
	k.mu.Lock()
	hang := k.hang
	k.mu.Unlock()
	if hang != nil {
		select {
		case <-hang:
		case <-r.Context().Done():
			return
		}
	}
	switch r.URL.Path {
	case "/metrics":
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		_, _ = w.Write(k.metrics)
	case "/livez", "/healthz":
		_, _ = io.WriteString(w, "ok")
	default:
		http.NotFound(w, r)
	}
}

// up starts both listeners; it is a no-op while they serve.
func (k *fakeKubeProxy) up() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.servers != nil {
		return nil
	}
	for _, addr := range []string{kpMetricsAddr, kpHealthAddr} {
		var ln net.Listener
		var err error
		// A closed listener's port may linger a moment.
		for range 50 {
			if ln, err = netnsdial.Listen(k.ns, "tcp4", addr); err == nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			return fmt.Errorf("fake kube-proxy on %s: %w", addr, err)
		}
		srv := &http.Server{Handler: http.HandlerFunc(k.handler), ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		k.servers = append(k.servers, srv)
	}
	return nil
}

// down closes both listeners and every connection.
func (k *fakeKubeProxy) down() {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, s := range k.servers {
		_ = s.Close()
	}
	k.servers = nil
}

func (k *fakeKubeProxy) setHang(on bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	switch {
	case on && k.hang == nil:
		k.hang = make(chan struct{})
	case !on && k.hang != nil:
		close(k.hang)
		k.hang = nil
	}
}

// kubeProxyLog writes a kube-proxy log the way klog does, a line every interval and a
// reflector watch failure every tenth line, and rotates it on command. It counts what it wrote
// so that the exporter's counts can be checked line for line.
type kubeProxyLog struct {
	path string

	mu           sync.Mutex
	lines, fails uint64
	seq          int
	history      []logCount // the counts after each write of the last minute
}

// logCount is what had been written at a moment.
type logCount struct {
	at           time.Time
	lines, fails uint64
}

var watchTypes = []string{"*v1.Service", "*v1.EndpointSlice", "*v1.Node"}

func (l *kubeProxyLog) line(now time.Time) string {
	l.seq++
	head := "I" + now.Format("0102 15:04:05.000000") + "   4242 "
	if l.seq%10 == 0 {
		typ := watchTypes[(l.seq/10)%len(watchTypes)]
		return head + `reflector.go:664] "Warning: watch ended with error" reflector="k8s.io/client-go@v0.36.3/tools/cache/reflector.go:343" type="` +
			typ + `" err="an error on the server (\"unable to decode an event from the watch stream: http2: client connection lost\") has prevented the request from succeeding"` + "\n"
	}
	return head + `proxier.go:812] "SyncProxyRules complete" ipFamily="IPv4" elapsed="12.5ms" seq=` + strconv.Itoa(l.seq) + "\n"
}

// write appends n lines (the writer opens the file for each batch, as a shipper does, so a
// rename or a deletion is followed by a new file).
func (l *kubeProxyLog) write(n int) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.writeLocked(n)
}

func (l *kubeProxyLog) writeLocked(n int) error {
	f, err := os.OpenFile(l.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	var b strings.Builder
	now := time.Now()
	for range n {
		s := l.line(now)
		b.WriteString(s)
		l.lines++
		if strings.Contains(s, "watch ended with error") {
			l.fails++
		}
	}
	_, err = f.WriteString(b.String())
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	l.history = append(l.history, logCount{now, l.lines, l.fails})
	if len(l.history) > 1 && now.Sub(l.history[0].at) > time.Minute {
		l.history = slices.Delete(l.history, 0, len(l.history)/2)
	}
	return err
}

// countsAt returns what had been written by t (as far as the last minute's history tells).
func (l *kubeProxyLog) countsAt(t time.Time) (lines, fails uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := len(l.history) - 1; i >= 0; i-- {
		if !l.history[i].at.After(t) {
			return l.history[i].lines, l.history[i].fails
		}
	}
	return 0, 0
}

func (l *kubeProxyLog) counts() (lines, fails uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lines, l.fails
}

// run writes a line every interval until ctx ends.
func (l *kubeProxyLog) run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := l.write(1); err != nil {
				benchrun.Logf("writing the kube-proxy log: %v", err)
			}
		}
	}
}

// copyTruncate copies the log aside and truncates it in place, then at once writes more than
// it held, so that it has grown past the follower's offset before the next poll (the case a
// size check alone misses). caughtUp must say when the exporter has read every line so far:
// copytruncate itself loses what the follower had not read yet, on any node.
func (l *kubeProxyLog) copyTruncate(caughtUp func(lines uint64) bool) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	deadline := time.Now().Add(15 * time.Second)
	for !caughtUp(l.lines) {
		if time.Now().After(deadline) {
			return errors.New("the exporter did not read the log to its end before copytruncate")
		}
		time.Sleep(200 * time.Millisecond)
	}
	old, err := os.ReadFile(l.path)
	if err != nil {
		return err
	}
	if err := os.WriteFile(l.path+".1", old, 0o644); err != nil {
		return err
	}
	if err := os.Truncate(l.path, 0); err != nil {
		return err
	}
	// Lines are about 150-300 bytes: regrow past the old size.
	return l.writeLocked(len(old)/150 + 20)
}

// rename moves the log aside (logrotate's create mode); the next line starts a new file.
func (l *kubeProxyLog) rename() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return os.Rename(l.path, l.path+".1")
}

// remove deletes the log once the exporter has read it, and keeps it absent for gap.
func (l *kubeProxyLog) remove(caughtUp func(lines uint64) bool, gap time.Duration) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	deadline := time.Now().Add(15 * time.Second)
	for !caughtUp(l.lines) {
		if time.Now().After(deadline) {
			return errors.New("the exporter did not read the log to its end before the deletion")
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err := os.Remove(l.path); err != nil {
		return err
	}
	time.Sleep(gap)
	return nil
}
