//go:build linux

package main

import (
	"flag"
	"fmt"
	"net"
	"time"
)

// runStorm (run inside the soak's namespace) sends one UDP datagram to each of many loopback
// addresses and ports, each a new conntrack flow: a storm of NEW events, and DESTROY events
// as the flows expire (the namespace's UDP timeout is 2 s). Nothing listens, so each datagram
// also draws an ICMP port unreachable, which conntrack relates to its flow.
func runStorm(args []string) error {
	fs := flag.NewFlagSet("storm", flag.ContinueOnError)
	rate := fs.Int("rate", 20000, "new flows per second")
	d := fs.Duration("duration", 10*time.Second, "how long")
	if err := fs.Parse(args); err != nil {
		return err
	}
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		return err
	}
	defer c.Close()
	payload := []byte("soak")
	start := time.Now()
	sent := 0
	for i := 0; time.Since(start) < *d; i++ {
		// 64 addresses x 50,000 ports: no tuple comes back within a storm.
		dst := &net.UDPAddr{IP: net.IPv4(127, 1, byte(i/50000%64), 1), Port: 10000 + i%50000}
		if _, err := c.WriteToUDP(payload, dst); err == nil {
			sent++
		}
		if i%64 != 63 {
			continue
		}
		if want := time.Duration(float64(i+1) / float64(*rate) * float64(time.Second)); time.Since(start) < want {
			time.Sleep(want - time.Since(start))
		}
	}
	fmt.Printf("sent %d datagrams in %v\n", sent, time.Since(start).Round(time.Millisecond))
	return nil
}
