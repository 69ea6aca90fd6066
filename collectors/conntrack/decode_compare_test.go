package conntrack

import (
	"bytes"
	"flag"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mdlayher/netlink"
	timo "github.com/ti-mo/conntrack"
)

// capturedEvents holds conntrack event messages as the kernel sent them to an event socket,
// netlink headers included, one after another (each 4-byte aligned, as on the socket): the
// input of the decoder comparison and benchmarks below. Rewritten by
// `go test ./collectors/conntrack -run TestCaptureEvents -capture` (root: the test runs in a
// network namespace of its own).
const capturedEvents = "testdata/conntrack-events.nlmsg"

var capture = flag.Bool("capture", false, "rewrite "+capturedEvents+" from this kernel's event stream (TestCaptureEvents)")

// TestCaptureEvents records the events of Service traffic through kube-proxy-shaped DNAT rules:
// TCP connections to a Service whose endpoint answers (NEW, the UPDATEs of the handshake and
// teardown, DESTROY) and UDP datagrams to one whose endpoint does not (NEW, DESTROY unreplied),
// over IPv4 and, for UDP, IPv6.
func TestCaptureEvents(t *testing.T) {
	if !*capture {
		t.Skip("rewrites " + capturedEvents + " only with -capture")
	}
	requireOwnNetns(t, "ip", "iptables", "iptables-restore", "ip6tables")
	sh(t, `ip link set lo up
ip link add ph-a type veth peer name ph-b
ip addr add 10.0.0.1/24 dev ph-a
ip addr add fd00::1/64 dev ph-a nodad
ip link set ph-a up; ip link set ph-b up
ip route add 10.96.0.0/16 dev ph-a
ip route add fd00:96::/64 dev ph-a
sysctl -qw net.netfilter.nf_conntrack_udp_timeout=1
sysctl -qw net.netfilter.nf_conntrack_tcp_timeout_time_wait=1
sysctl -qw net.netfilter.nf_conntrack_tcp_timeout_close=1`)
	restore := exec.Command("iptables-restore")
	restore.Stdin = strings.NewReader(kubeDNSRules)
	if out, err := restore.CombinedOutput(); err != nil {
		t.Fatalf("iptables-restore: %v\n%s", err, out)
	}
	sh(t, `iptables -t nat -A OUTPUT -d 10.96.0.20/32 -p tcp --dport 80 -m comment --comment "lab/web:http" -j DNAT --to-destination 10.0.0.1:8080
ip6tables -t nat -A OUTPUT -d fd00:96::10/128 -p udp --dport 53 -m comment --comment "kube-system/kube-dns:dns" -j DNAT --to-destination [fd00::1]:5353`)

	ln, err := net.Listen("tcp4", "10.0.0.1:8080")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				_, _ = io.Copy(conn, io.LimitReader(conn, 5))
			}()
		}
	}()

	sock, err := openEventSocket(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu       sync.Mutex
		msgs     bytes.Buffer
		destroys int
	)
	received := make(chan error, 1)
	go func() {
		received <- sock.receiveBatches(func(msg []byte) error {
			var ev flowEvent
			mu.Lock()
			defer mu.Unlock()
			msgs.Write(msg)
			if decodeFlowMessage(msg, &ev) == nil && ev.typ == eventDestroy {
				destroys++
			}
			return nil
		})
	}()

	const tcpFlows, udpFlows, udp6Flows = 20, 10, 5
	for range tcpFlows {
		conn, err := net.DialTimeout("tcp4", "10.96.0.20:80", 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Write([]byte("hello")); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(conn, make([]byte, 5)); err != nil {
			t.Fatal(err)
		}
		conn.Close()
	}
	sendUDP(t, udpFlows, "10.96.0.10:53")
	for range udp6Flows {
		conn, err := net.Dial("udp6", "[fd00:96::10]:53")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Write([]byte("q")); err != nil {
			t.Fatal(err)
		}
		conn.Close()
	}
	// The flows end as their short timeouts expire; reading the table reaps expired entries.
	waitFor(t, "every flow's DESTROY event", func() bool {
		_ = dumpTable(func(*flowEvent) {})
		mu.Lock()
		defer mu.Unlock()
		return destroys >= tcpFlows+udpFlows+udp6Flows
	})
	sock.Close()
	if err := <-received; err != errSocketClosed {
		t.Fatalf("receiving events: %v", err)
	}
	if err := os.MkdirAll("testdata", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(capturedEvents, msgs.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %d bytes, %d messages, to %s", msgs.Len(), len(splitMessages(t, msgs.Bytes())), capturedEvents)
}

func splitMessages(tb testing.TB, b []byte) [][]byte {
	tb.Helper()
	var out [][]byte
	for len(b) > 0 {
		n, err := messageSpan(b)
		if err != nil {
			tb.Fatalf("%s: %v", capturedEvents, err)
		}
		out = append(out, b[:n])
		b = b[n:]
	}
	return out
}

func loadCapturedEvents(tb testing.TB) [][]byte {
	tb.Helper()
	b, err := os.ReadFile(capturedEvents)
	if err != nil {
		tb.Fatal(err)
	}
	msgs := splitMessages(tb, b)
	if len(msgs) == 0 {
		tb.Fatalf("%s holds no messages", capturedEvents)
	}
	return msgs
}

// decodeTiMo is ti-mo/conntrack's decoding of one event message, as its Conn.Listen does it:
// mdlayher/netlink's message, then Event.Unmarshal (the whole Flow) into a fresh Event (it
// refuses to reuse one).
func decodeTiMo(msg []byte, ev *timo.Event) error {
	*ev = timo.Event{}
	var m netlink.Message
	if err := m.UnmarshalBinary(msg); err != nil {
		return err
	}
	return ev.Unmarshal(m)
}

// TestDecodeAgreesWithTiMo: on every captured message both decoders read the same event
// type, flow id, status and both tuples.
func TestDecodeAgreesWithTiMo(t *testing.T) {
	sameType := func(ours eventType, theirs timo.Event) bool {
		switch ours {
		case eventNew:
			return theirs.Type == timo.EventNew
		case eventUpdate:
			return theirs.Type == timo.EventUpdate
		case eventDestroy:
			return theirs.Type == timo.EventDestroy
		}
		return false
	}
	seen := map[eventType]int{}
	families := map[int]int{}
	for i, msg := range loadCapturedEvents(t) {
		var ours flowEvent
		if err := decodeFlowMessage(msg, &ours); err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		var theirs timo.Event
		if err := decodeTiMo(msg, &theirs); err != nil {
			t.Fatalf("message %d: ti-mo/conntrack: %v", i, err)
		}
		seen[ours.typ]++
		if ours.orig.src.Is6() {
			families[6]++
		} else {
			families[4]++
		}
		f := theirs.Flow
		if !sameType(ours.typ, theirs) || ours.id != f.ID || ours.status != uint32(f.Status) {
			t.Errorf("message %d: type %v id %d status %#x, ti-mo/conntrack %v %d %#x", i, ours.typ, ours.id, ours.status, theirs.Type, f.ID, uint32(f.Status))
		}
		for _, dir := range []struct {
			name   string
			ours   tuple
			theirs timo.Tuple
		}{{"orig", ours.orig, f.TupleOrig}, {"reply", ours.reply, f.TupleReply}} {
			want := tuple{src: dir.theirs.IP.SourceAddress, dst: dir.theirs.IP.DestinationAddress,
				srcPort: dir.theirs.Proto.SourcePort, dstPort: dir.theirs.Proto.DestinationPort, proto: dir.theirs.Proto.Protocol}
			if dir.ours != want {
				t.Errorf("message %d: %s tuple %+v, ti-mo/conntrack %+v", i, dir.name, dir.ours, want)
			}
		}
	}
	if seen[eventNew] == 0 || seen[eventUpdate] == 0 || seen[eventDestroy] == 0 {
		t.Errorf("the capture lacks an event type: %v", seen)
	}
	if families[4] == 0 || families[6] == 0 {
		t.Errorf("the capture lacks IPv4 or IPv6 flows: %v", families)
	}
}

// BenchmarkDecodeCaptured decodes the captured messages in turn, one per op, with this
// package's decoder and with ti-mo/conntrack's (BENCHMARKS.md, "Conntrack event decoding").
func BenchmarkDecodeCaptured(b *testing.B) {
	msgs := loadCapturedEvents(b)
	b.Run("decoder=proxyhealth", func(b *testing.B) {
		var ev flowEvent
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if err := decodeFlowMessage(msgs[i], &ev); err != nil {
				b.Fatal(err)
			}
			if i++; i == len(msgs) {
				i = 0
			}
		}
	})
	b.Run("decoder=ti-mo-conntrack", func(b *testing.B) {
		var ev timo.Event
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if err := decodeTiMo(msgs[i], &ev); err != nil {
				b.Fatal(err)
			}
			if i++; i == len(msgs) {
				i = 0
			}
		}
	})
}
