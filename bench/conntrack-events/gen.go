//go:build linux

package main

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// genResult is what the gen subcommand prints (one JSON object on stdout).
type genResult struct {
	Target  float64           `json:"target"`
	Sent    uint64            `json:"sent"`
	Errors  map[string]uint64 `json:"errors,omitempty"`
	Seconds float64           `json:"seconds"`
	Tuples  uint64            `json:"tuples"`
	// EarlyReuse counts blocks sent to again before --reuse-after (the tuple space ran out).
	EarlyReuse uint64 `json:"early_reuse,omitempty"`
}

// genMaxMessages bounds one generator run whatever the flags say.
const genMaxMessages = 200_000_000

// runGen sends UDP datagrams to vip:port so that each one is a new conntrack flow: the source
// address walks a client prefix that is local to the namespace's loopback (set per datagram
// with IP_PKTINFO) and the source port walks a set of sockets, one sendmmsg batch at a time.
// It must run inside the benchmark's network namespace, whose rules DNAT the VIP to endpoints
// routed to a veth whose peer is down: the datagrams are dropped by the veth once conntrack
// has confirmed their flow, and nothing receives them.
func runGen(args []string) error {
	fs := flag.NewFlagSet("gen", flag.ContinueOnError)
	var (
		vipS       = fs.String("vip", defaultVIP, "destination (service VIP)")
		port       = fs.Int("port", defaultPort, "destination UDP port")
		clientsS   = fs.String("clients", defaultClients, "client prefix; local to lo in the namespace")
		sockets    = fs.Int("sockets", 64, "number of sending sockets (source ports)")
		rate       = fs.Float64("rate", 0, "new flows per second; 0 sends as fast as possible")
		dur        = fs.Duration("duration", 5*time.Second, "how long to send")
		batch      = fs.Int("batch", 32, "datagrams per sendmmsg call")
		reuseAfter = fs.Duration("reuse-after", 1100*time.Millisecond, "send to a tuple again once this long has passed (longer than the UDP timeout)")
		invalid    = fs.Bool("invalid", false, "send TCP SYN+FIN segments, which conntrack marks INVALID (invalid tcp flag combination), instead of new UDP flows")
	)
	if err := fs.Parse(args); err != nil {
		return err
	}
	vip, err := netip.ParseAddr(*vipS)
	if err != nil || !vip.Is4() {
		return fmt.Errorf("bad --vip %q", *vipS)
	}
	clients, err := netip.ParsePrefix(*clientsS)
	if err != nil || !clients.Addr().Is4() || clients.Bits() > 30 {
		return fmt.Errorf("bad --clients %q (IPv4, at most /30)", *clientsS)
	}
	if *sockets < 1 || *sockets > 1024 || *batch < 1 || *batch > 1024 {
		return errors.New("--sockets and --batch must be in 1..1024")
	}
	if *dur <= 0 || *dur > 10*time.Minute {
		return errors.New("--duration must be in (0, 10m]")
	}
	if *rate < 0 {
		return errors.New("--rate must be >= 0")
	}
	if *invalid {
		return genInvalid(vip, uint16(*port), *rate, *dur, *batch)
	}

	// Host addresses of the client prefix, without network and broadcast addresses.
	base := binary.BigEndian.Uint32(clients.Masked().Addr().AsSlice()) + 1
	nHosts := uint32(1)<<(32-clients.Bits()) - 2

	fds := make([]int, *sockets)
	for i := range fds {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("socket: %w", err)
		}
		defer unix.Close(fd)
		if err := unix.Bind(fd, &unix.SockaddrInet4{}); err != nil {
			return fmt.Errorf("bind: %w", err)
		}
		fds[i] = fd
	}

	b := *batch
	payload := make([]byte, 32)
	copy(payload, "proxyhealth conntrack bench")
	dst := &unix.RawSockaddrInet4{Family: unix.AF_INET, Addr: vip.As4()}
	binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&dst.Port))[:], uint16(*port))

	cmsgSpace := unix.CmsgSpace(unix.SizeofInet4Pktinfo)
	ctl := make([]byte, b*cmsgSpace)
	iov := make([]unix.Iovec, b)
	msgs := make([]unix.Mmsghdr, b)
	for i := 0; i < b; i++ {
		c := ctl[i*cmsgSpace : (i+1)*cmsgSpace]
		h := (*unix.Cmsghdr)(unsafe.Pointer(&c[0]))
		h.Level = unix.IPPROTO_IP
		h.Type = unix.IP_PKTINFO
		h.SetLen(unix.CmsgLen(unix.SizeofInet4Pktinfo))
		iov[i].Base = &payload[0]
		iov[i].SetLen(len(payload))
		m := &msgs[i].Hdr
		m.Name = (*byte)(unsafe.Pointer(dst))
		m.Namelen = unix.SizeofSockaddrInet4
		m.Iov = &iov[i]
		m.SetIovlen(1)
		m.Control = &c[0]
		m.SetControllen(cmsgSpace)
	}
	// Offset of Inet4Pktinfo.Spec_dst inside each control block.
	specOff := unix.CmsgLen(0) + 4

	res := genResult{Target: *rate, Errors: map[string]uint64{}, Tuples: uint64(nHosts/uint32(b)) * uint64(b) * uint64(len(fds))}
	// Blocks of b tuples (one socket, b consecutive client addresses) are used in FIFO order:
	// a block is sent to again once --reuse-after has passed since its last use, so that its
	// previous entries have expired and the kernel's lookup of the new datagram evicts them
	// (a DESTROY event right before the NEW one, in steady state), as busy nodes see it.
	perSock := nHosts / uint32(b)
	if perSock == 0 {
		return errors.New("--clients prefix smaller than one batch")
	}
	totalBlocks := uint64(perSock) * uint64(len(fds))
	type used struct {
		block uint64
		at    time.Time
	}
	ring := make([]used, totalBlocks)
	var head, size, allocated uint64
	nextBlock := func(now time.Time) uint64 {
		if size > 0 && (now.Sub(ring[head].at) >= *reuseAfter || allocated == totalBlocks) {
			if now.Sub(ring[head].at) < *reuseAfter {
				res.EarlyReuse++
			}
			blk := ring[head].block
			head = (head + 1) % totalBlocks
			size--
			return blk
		}
		allocated++
		return allocated - 1
	}

	var attempted uint64
	start := time.Now()
	deadline := start.Add(*dur)
	for iter := 0; iter < genMaxMessages && attempted < genMaxMessages; iter++ {
		now := time.Now()
		if !now.Before(deadline) {
			break
		}
		if *rate > 0 {
			due := start.Add(time.Duration(float64(attempted) / *rate * float64(time.Second)))
			if now.Before(due) {
				wait := due.Sub(now)
				if rest := deadline.Sub(now); rest < wait {
					wait = rest
				}
				time.Sleep(wait)
				continue
			}
		}
		blk := nextBlock(now)
		fd := fds[blk%uint64(len(fds))]
		host := uint32(blk/uint64(len(fds))) * uint32(b)
		for i := 0; i < b; i++ {
			binary.BigEndian.PutUint32(ctl[i*cmsgSpace+specOff:], base+host+uint32(i))
		}
		r, _, e := unix.Syscall6(unix.SYS_SENDMMSG, uintptr(fd), uintptr(unsafe.Pointer(&msgs[0])), uintptr(b), 0, 0, 0)
		runtime.KeepAlive(msgs)
		runtime.KeepAlive(ctl)
		runtime.KeepAlive(iov)
		runtime.KeepAlive(payload)
		runtime.KeepAlive(dst)
		ring[(head+size)%totalBlocks] = used{block: blk, at: time.Now()}
		size++
		if e != 0 {
			// The first datagram of the batch failed (EPERM when conntrack drops it, for
			// instance): count it; the rest of the block waits for its next turn.
			res.Errors[errnoName(e)]++
			attempted++
			continue
		}
		res.Sent += uint64(r)
		attempted += uint64(r)
	}
	res.Seconds = time.Since(start).Seconds()
	return json.NewEncoder(os.Stdout).Encode(res)
}

func errnoName(e syscall.Errno) string {
	if n := unix.ErrnoName(e); n != "" {
		return n
	}
	return e.Error()
}

// genInvalid sends TCP segments with SYN and FIN set to vip:port from a raw socket, batch at a
// time, each from another source port. conntrack marks each INVALID ("invalid tcp flag
// combination") in the output hook, before any NAT, and creates no entry: with
// nf_conntrack_log_invalid set, each is one message of conntrack's log. The segments then go
// the way of the flow generator's datagrams, to the veth whose peer is down. Checksums are
// left zero: conntrack checks them only for packets coming in.
func genInvalid(vip netip.Addr, port uint16, rate float64, dur time.Duration, b int) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
	if err != nil {
		return fmt.Errorf("raw socket: %w", err)
	}
	defer unix.Close(fd)
	const segLen = 20
	segs := make([]byte, b*segLen)
	iov := make([]unix.Iovec, b)
	msgs := make([]unix.Mmsghdr, b)
	dst := &unix.RawSockaddrInet4{Family: unix.AF_INET, Addr: vip.As4()}
	for i := 0; i < b; i++ {
		seg := segs[i*segLen : (i+1)*segLen]
		binary.BigEndian.PutUint16(seg[2:4], port)
		binary.BigEndian.PutUint32(seg[4:8], 1)
		seg[12] = 5 << 4
		seg[13] = 0x03 // SYN|FIN
		binary.BigEndian.PutUint16(seg[14:16], 64240)
		iov[i].Base = &seg[0]
		iov[i].SetLen(segLen)
		m := &msgs[i].Hdr
		m.Name = (*byte)(unsafe.Pointer(dst))
		m.Namelen = unix.SizeofSockaddrInet4
		m.Iov = &iov[i]
		m.SetIovlen(1)
	}
	res := genResult{Target: rate, Errors: map[string]uint64{}, Tuples: 1 << 16}
	var attempted uint64
	srcPort := uint16(1024)
	start := time.Now()
	deadline := start.Add(dur)
	for iter := 0; iter < genMaxMessages && attempted < genMaxMessages; iter++ {
		now := time.Now()
		if !now.Before(deadline) {
			break
		}
		if rate > 0 {
			due := start.Add(time.Duration(float64(attempted) / rate * float64(time.Second)))
			if now.Before(due) {
				time.Sleep(min(due.Sub(now), deadline.Sub(now)))
				continue
			}
		}
		for i := 0; i < b; i++ {
			binary.BigEndian.PutUint16(segs[i*segLen:], srcPort)
			if srcPort++; srcPort == 0 {
				srcPort = 1024
			}
		}
		r, _, e := unix.Syscall6(unix.SYS_SENDMMSG, uintptr(fd), uintptr(unsafe.Pointer(&msgs[0])), uintptr(b), 0, 0, 0)
		runtime.KeepAlive(msgs)
		runtime.KeepAlive(iov)
		runtime.KeepAlive(segs)
		runtime.KeepAlive(dst)
		if e != 0 {
			res.Errors[errnoName(e)]++
			attempted++
			continue
		}
		res.Sent += uint64(r)
		attempted += uint64(r)
	}
	res.Seconds = time.Since(start).Seconds()
	return json.NewEncoder(os.Stdout).Encode(res)
}
