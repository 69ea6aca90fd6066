//go:build e2e

// Command labtool is the e2e lab's traffic tool. The lab runs it inside its network namespaces
// with `ip netns exec <ns> labtool <subcommand> ...`:
//
//	serve-tcp <addr>                         accept connections and write a one-line reply (IPv4, or IPv6 for [ip]:port)
//	connect <addr> [--timeout 2s] [--count N] dial N times at once, each from its own socket
//	                                         (so its own source port), and print "succeeded K of N"
//	get <url> [--timeout 5s]                 HTTP GET, print the body (how the lab scrapes)
//	send-invalid <ip:port> [--count N]       send N crafted TCP SYN+FIN packets from a raw socket;
//	                                         conntrack marks every one INVALID
//	send-tcp <ip:port> --src <ip:port> [--flags SAFR] [--seq N] [--ack N] [--bad-checksum] [--count N]
//	                                         send N crafted TCP segments from a raw socket
//	serve-hold <addr>                        accept connections and keep them open, printing
//	                                         "reset <peer>" when one is reset
//	hold <addr> [--for 30s]                  connect, print "local <addr> rcvnxt <n> sndnxt <m>"
//	                                         (the connection's next sequence numbers, read in
//	                                         TCP repair mode), and keep it open
//	fault-proxy <listen> --to <addr> --control <addr>
//	                                         TCP proxy that black-holes and heals on command
//	                                         (test/kubelab's FaultProxy)
//	ipvs <procfs>                            print this namespace's IPVS virtual servers, their
//	                                         real servers (weights, connections) and the
//	                                         addresses of kube-ipvs0, read as the exporter reads
//	                                         them, as JSON (kpcapture.IPVSState)
package main

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
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
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/proxyhealth/proxyhealth/internal/ipvs"
	"github.com/proxyhealth/proxyhealth/internal/kpcapture"
	"github.com/proxyhealth/proxyhealth/test/kubelab"
)

func main() {
	if len(os.Args) < 3 {
		usage()
	}
	cmd, target, rest := os.Args[1], os.Args[2], os.Args[3:]
	var err error
	switch cmd {
	case "serve-tcp":
		err = serveTCP(target)
	case "connect":
		fs := flag.NewFlagSet(cmd, flag.ExitOnError)
		timeout := fs.Duration("timeout", 2*time.Second, "per-connection deadline (dial and reply)")
		count := fs.Int("count", 1, "connections to make, all at once")
		_ = fs.Parse(rest)
		err = connect(target, *timeout, *count)
	case "get":
		fs := flag.NewFlagSet(cmd, flag.ExitOnError)
		timeout := fs.Duration("timeout", 5*time.Second, "request deadline")
		_ = fs.Parse(rest)
		err = get(target, *timeout)
	case "send-invalid":
		fs := flag.NewFlagSet(cmd, flag.ExitOnError)
		count := fs.Int("count", 1, "packets to send")
		_ = fs.Parse(rest)
		err = sendInvalid(target, *count)
	case "send-tcp":
		fs := flag.NewFlagSet(cmd, flag.ExitOnError)
		src := fs.String("src", "", "source ip:port (an address of this namespace)")
		flags := fs.String("flags", "A", "TCP flags: any of S, A, F, R, P")
		seq := fs.Uint("seq", 1, "sequence number")
		ack := fs.Uint("ack", 0, "acknowledgment number")
		bad := fs.Bool("bad-checksum", false, "send a wrong TCP checksum")
		count := fs.Int("count", 1, "segments to send")
		_ = fs.Parse(rest)
		err = sendTCP(target, *src, *flags, uint32(*seq), uint32(*ack), *bad, *count)
	case "serve-hold":
		err = serveHold(target)
	case "hold":
		fs := flag.NewFlagSet(cmd, flag.ExitOnError)
		d := fs.Duration("for", 30*time.Second, "how long to keep the connection")
		_ = fs.Parse(rest)
		err = hold(target, *d)
	case "fault-proxy":
		fs := flag.NewFlagSet(cmd, flag.ExitOnError)
		to := fs.String("to", "", "upstream address")
		control := fs.String("control", "", "control endpoint address (HTTP)")
		_ = fs.Parse(rest)
		err = runFaultProxy(target, *to, *control)
	case "ipvs":
		err = printIPVS(target)
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "labtool %s: %v\n", cmd, err)
		os.Exit(1)
	}
}

// runFaultProxy serves a kubelab.FaultProxy from listen to upstream, commanded over HTTP on
// control; "ready" on stdout says both listen.
func runFaultProxy(listen, upstream, control string) error {
	ln, err := net.Listen("tcp4", listen)
	if err != nil {
		return err
	}
	ctl, err := net.Listen("tcp4", control)
	if err != nil {
		return err
	}
	p := kubelab.NewFaultProxy(upstream, nil)
	p.Logf = func(format string, args ...any) { fmt.Printf(format+"\n", args...) }
	errc := make(chan error, 2)
	go func() { errc <- http.Serve(ctl, p.Handler()) }()
	go func() { errc <- p.Serve(ln) }()
	fmt.Printf("ready %s -> %s, control on %s\n", listen, upstream, control)
	return <-errc
}

// printIPVS prints the virtual servers of the namespace it runs in, procfs being /proc there,
// and the addresses bound to kube-ipvs0 (none without it), as the version matrix keeps them.
func printIPVS(procfs string) error {
	servers, err := ipvs.Read(procfs)
	if err != nil {
		return err
	}
	state := kpcapture.IPVSState{VirtualServers: servers, Bound: []netip.Addr{}}
	if iface, err := net.InterfaceByName("kube-ipvs0"); err == nil {
		addrs, err := iface.Addrs()
		if err != nil {
			return fmt.Errorf("the addresses of kube-ipvs0: %w", err)
		}
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(n.IP); ok {
					state.Bound = append(state.Bound, ip.Unmap())
				}
			}
		}
		slices.SortFunc(state.Bound, netip.Addr.Compare)
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(state)
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: labtool serve-tcp|connect|get|send-invalid|send-tcp|serve-hold|hold|fault-proxy|ipvs <addr|url|procfs> [flags]")
	os.Exit(2)
}

// tcpNetwork is "tcp6" for an IPv6 address ("[ip]:port"), else "tcp4": an IPv4 address stays
// IPv4 only (0.0.0.0 does not listen on IPv6 too).
func tcpNetwork(addr string) string {
	if host, _, err := net.SplitHostPort(addr); err == nil && strings.Contains(host, ":") {
		return "tcp6"
	}
	return "tcp4"
}

// serveTCP prints "ready" once it listens, then answers every connection with one line naming
// the address it was reached on, until it is killed.
func serveTCP(addr string) error {
	ln, err := net.Listen(tcpNetwork(addr), addr)
	if err != nil {
		return err
	}
	fmt.Println("ready")
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go func() {
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			fmt.Fprintf(c, "hello from %s\n", c.LocalAddr())
		}()
	}
}

// connect dials addr count times concurrently; a connection succeeds when it is established and
// the server's reply line arrives within timeout. Each failure is printed to stderr.
func connect(addr string, timeout time.Duration, count int) error {
	if count < 1 || count > 1000 {
		return fmt.Errorf("--count %d out of range 1..1000", count)
	}
	var (
		wg sync.WaitGroup
		mu sync.Mutex
		ok int
	)
	for i := 0; i < count; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := connectOnce(addr, timeout)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				fmt.Fprintf(os.Stderr, "connect %d: %v\n", i, err)
				return
			}
			ok++
		}()
	}
	wg.Wait()
	fmt.Printf("succeeded %d of %d\n", ok, count)
	return nil
}

func connectOnce(addr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	c, err := net.DialTimeout(tcpNetwork(addr), addr, timeout)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(deadline)
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return fmt.Errorf("reading reply: %w", err)
	}
	if len(line) == 0 {
		return errors.New("empty reply")
	}
	return nil
}

func get(url string, timeout time.Duration) error {
	client := &http.Client{Timeout: timeout, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(os.Stdout, resp.Body); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	return nil
}

// sendInvalid writes count IPv4/TCP packets with both SYN and FIN set to dst. That flag
// combination is never valid, so conntrack's TCP tracker counts each packet as invalid (and
// tracks nothing) in every namespace whose netfilter the packet crosses. Checksums are correct,
// so the verdict comes from the flags alone.
func sendInvalid(dst string, count int) error {
	if count < 1 || count > 100000 {
		return fmt.Errorf("--count %d out of range 1..100000", count)
	}
	host, portStr, err := net.SplitHostPort(dst)
	if err != nil {
		return err
	}
	dstIP := net.ParseIP(host).To4()
	port, err := strconv.Atoi(portStr)
	if err != nil || dstIP == nil {
		return fmt.Errorf("destination %q: want ipv4:port", dst)
	}
	// The kernel picks the source address the route to dst would use.
	probe, err := net.Dial("udp4", dst)
	if err != nil {
		return err
	}
	srcIP := probe.LocalAddr().(*net.UDPAddr).IP.To4()
	probe.Close()

	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_RAW, syscall.IPPROTO_RAW) // implies IP_HDRINCL
	if err != nil {
		return fmt.Errorf("raw socket: %w", err)
	}
	defer syscall.Close(fd)
	sa := &syscall.SockaddrInet4{}
	copy(sa.Addr[:], dstIP)
	for i := 0; i < count; i++ {
		pkt := synFinPacket(srcIP, dstIP, uint16(40000+i%20000), uint16(port), uint16(i))
		if err := syscall.Sendto(fd, pkt, 0, sa); err != nil {
			return fmt.Errorf("packet %d: %w", i, err)
		}
	}
	fmt.Printf("sent %d\n", count)
	return nil
}

func synFinPacket(src, dst net.IP, sport, dport, id uint16) []byte {
	return tcpPacket(src, dst, sport, dport, id, 0x1000000+uint32(id), 0, 0x02|0x01, false)
}

// tcpPacket builds an IPv4/TCP packet (no options, no data); with badChecksum its TCP checksum
// is off by one.
func tcpPacket(src, dst net.IP, sport, dport, id uint16, seq, ack uint32, flags byte, badChecksum bool) []byte {
	const ipLen, tcpLen = 20, 20
	p := make([]byte, ipLen+tcpLen)
	ip, tcp := p[:ipLen], p[ipLen:]

	ip[0] = 0x45 // IPv4, 5 words
	binary.BigEndian.PutUint16(ip[2:], ipLen+tcpLen)
	binary.BigEndian.PutUint16(ip[4:], id)
	ip[8] = 64 // TTL
	ip[9] = syscall.IPPROTO_TCP
	copy(ip[12:16], src)
	copy(ip[16:20], dst)
	binary.BigEndian.PutUint16(ip[10:], checksum(ip, 0))

	binary.BigEndian.PutUint16(tcp[0:], sport)
	binary.BigEndian.PutUint16(tcp[2:], dport)
	binary.BigEndian.PutUint32(tcp[4:], seq)
	binary.BigEndian.PutUint32(tcp[8:], ack)
	tcp[12] = 5 << 4 // data offset
	tcp[13] = flags
	binary.BigEndian.PutUint16(tcp[14:], 65535)
	// Pseudo-header: src, dst, zero, protocol, TCP length.
	var sum uint32
	for i := 0; i < 4; i += 2 {
		sum += uint32(binary.BigEndian.Uint16(src[i:])) + uint32(binary.BigEndian.Uint16(dst[i:]))
	}
	sum += syscall.IPPROTO_TCP + tcpLen
	csum := checksum(tcp, sum)
	if badChecksum {
		csum++
	}
	binary.BigEndian.PutUint16(tcp[16:], csum)
	return p
}

func checksum(b []byte, sum uint32) uint16 {
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

// sendTCP writes count crafted TCP segments from src to dst through a raw socket.
func sendTCP(dst, src, flags string, seq, ack uint32, badChecksum bool, count int) error {
	if count < 1 || count > 100000 {
		return fmt.Errorf("--count %d out of range 1..100000", count)
	}
	d, err := netip.ParseAddrPort(dst)
	if err != nil || !d.Addr().Is4() {
		return fmt.Errorf("destination %q: want ipv4:port", dst)
	}
	s, err := netip.ParseAddrPort(src)
	if err != nil || !s.Addr().Is4() {
		return fmt.Errorf("--src %q: want ipv4:port", src)
	}
	var f byte
	for _, c := range flags {
		bit, ok := map[rune]byte{'F': 0x01, 'S': 0x02, 'R': 0x04, 'P': 0x08, 'A': 0x10}[c]
		if !ok {
			return fmt.Errorf("--flags %q: want letters of SAFRP", flags)
		}
		f |= bit
	}
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_RAW, syscall.IPPROTO_RAW) // implies IP_HDRINCL
	if err != nil {
		return fmt.Errorf("raw socket: %w", err)
	}
	defer syscall.Close(fd)
	sa := &syscall.SockaddrInet4{Addr: d.Addr().As4()}
	srcIP, dstIP := s.Addr().AsSlice(), d.Addr().AsSlice()
	for i := 0; i < count; i++ {
		pkt := tcpPacket(srcIP, dstIP, s.Port(), d.Port(), uint16(i), seq, ack, f, badChecksum)
		if err := syscall.Sendto(fd, pkt, 0, sa); err != nil {
			return fmt.Errorf("segment %d: %w", i, err)
		}
	}
	fmt.Printf("sent %d\n", count)
	return nil
}

// serveHold accepts connections and keeps each open until its peer closes or resets it.
func serveHold(addr string) error {
	ln, err := net.Listen("tcp4", addr)
	if err != nil {
		return err
	}
	fmt.Println("ready")
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go func() {
			defer c.Close()
			_, err := io.Copy(io.Discard, c)
			if errors.Is(err, syscall.ECONNRESET) {
				fmt.Printf("reset %s\n", c.RemoteAddr())
			} else {
				fmt.Printf("closed %s: %v\n", c.RemoteAddr(), err)
			}
		}()
	}
}

// hold connects to addr and keeps the connection for d, after printing its local address and
// the next sequence numbers it expects and sends, read in TCP repair mode (CAP_NET_ADMIN), so
// that a segment can be crafted in or out of its window.
func hold(addr string, d time.Duration) error {
	c, err := net.DialTimeout("tcp4", addr, 3*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		return err
	}
	var rcvNxt, sndNxt int
	var serr error
	if err := raw.Control(func(fd uintptr) {
		set := func(opt, v int) {
			if serr == nil {
				serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, opt, v)
			}
		}
		get := func(queue int, into *int) {
			set(unix.TCP_REPAIR_QUEUE, queue)
			if serr == nil {
				*into, serr = unix.GetsockoptInt(int(fd), syscall.IPPROTO_TCP, unix.TCP_QUEUE_SEQ)
			}
		}
		set(unix.TCP_REPAIR, unix.TCP_REPAIR_ON)
		// TCP_RECV_QUEUE and TCP_SEND_QUEUE of linux/tcp.h (not in x/sys/unix).
		const recvQueue, sendQueue = 1, 2
		get(recvQueue, &rcvNxt)
		get(sendQueue, &sndNxt)
		set(unix.TCP_REPAIR, unix.TCP_REPAIR_OFF)
	}); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("TCP repair mode: %w", serr)
	}
	fmt.Printf("local %s rcvnxt %d sndnxt %d\n", c.LocalAddr(), uint32(rcvNxt), uint32(sndNxt))
	_ = c.SetReadDeadline(time.Now().Add(d))
	_, err = io.Copy(io.Discard, c)
	switch {
	case errors.Is(err, syscall.ECONNRESET):
		fmt.Println("reset")
	case err != nil:
		fmt.Printf("ended: %v\n", err)
	default:
		fmt.Println("closed")
	}
	return nil
}
