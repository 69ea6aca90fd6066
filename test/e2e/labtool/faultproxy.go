//go:build e2e

package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
)

// faultProxy forwards TCP connections from a listener to upstream and, on command, stops
// forwarding without closing anything: the shape of a dead connection (incident 3 of
// DESIGN.md) while both ends stay up. Commands arrive on a small HTTP control endpoint:
//
//	/blackhole  stop forwarding bytes in both directions; every socket stays open, new
//	            connections are accepted (and their upstream dialled) but carry nothing
//	/heal       forward again: bytes held during the black-hole flow on, new connections work
//	/reset      close every current connection on both sides (new ones follow the mode)
//	/state      "mode=forward|blackhole open=N accepted=N"
//
// Each command answers after it took effect. Nothing passes while black-holed, not even a
// close: a side that hangs up has its peer closed only once the proxy is healed.
type faultProxy struct {
	upstream string

	mu    sync.Mutex
	gate  chan struct{} // closed while forwarding
	conns map[*proxyConn]struct{}

	accepted atomic.Int64
}

type proxyConn struct {
	down, up net.Conn
	once     sync.Once
	closed   chan struct{}
}

func (c *proxyConn) close() {
	c.once.Do(func() {
		close(c.closed)
		c.down.Close()
		c.up.Close()
	})
}

func runFaultProxy(listen, upstream, control string) error {
	ln, err := net.Listen("tcp4", listen)
	if err != nil {
		return err
	}
	ctl, err := net.Listen("tcp4", control)
	if err != nil {
		return err
	}
	open := make(chan struct{})
	close(open)
	p := &faultProxy{upstream: upstream, gate: open, conns: map[*proxyConn]struct{}{}}

	mux := http.NewServeMux()
	mux.HandleFunc("/blackhole", func(w http.ResponseWriter, r *http.Request) {
		p.setForwarding(false)
		fmt.Fprintln(w, p.state())
	})
	mux.HandleFunc("/heal", func(w http.ResponseWriter, r *http.Request) {
		p.setForwarding(true)
		fmt.Fprintln(w, p.state())
	})
	mux.HandleFunc("/reset", func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		conns := make([]*proxyConn, 0, len(p.conns))
		for c := range p.conns {
			conns = append(conns, c)
		}
		p.mu.Unlock()
		for _, c := range conns {
			c.close()
		}
		fmt.Fprintln(w, p.state())
	})
	mux.HandleFunc("/state", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, p.state())
	})
	errc := make(chan error, 2)
	go func() { errc <- http.Serve(ctl, mux) }()
	go func() { errc <- p.serve(ln) }()
	fmt.Printf("ready %s -> %s, control on %s\n", listen, upstream, control)
	return <-errc
}

func (p *faultProxy) setForwarding(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.gate: // forwarding now
		if !on {
			p.gate = make(chan struct{})
			fmt.Println("blackhole")
		}
	default:
		if on {
			close(p.gate)
			fmt.Println("heal")
		}
	}
}

func (p *faultProxy) state() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	mode := "forward"
	select {
	case <-p.gate:
	default:
		mode = "blackhole"
	}
	return fmt.Sprintf("mode=%s open=%d accepted=%d", mode, len(p.conns), p.accepted.Load())
}

func (p *faultProxy) serve(ln net.Listener) error {
	for {
		down, err := ln.Accept()
		if err != nil {
			return err
		}
		p.accepted.Add(1)
		go p.handle(down)
	}
}

func (p *faultProxy) handle(down net.Conn) {
	up, err := net.Dial("tcp4", p.upstream)
	if err != nil {
		fmt.Printf("dial %s: %v\n", p.upstream, err)
		down.Close()
		return
	}
	c := &proxyConn{down: down, up: up, closed: make(chan struct{})}
	p.mu.Lock()
	p.conns[c] = struct{}{}
	p.mu.Unlock()
	done := make(chan struct{}, 2)
	go func() { p.pump(c, up, down); done <- struct{}{} }()
	go func() { p.pump(c, down, up); done <- struct{}{} }()
	<-done
	c.close()
	<-done
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// pump copies src to dst, holding every chunk (and the end of the stream) until the proxy
// forwards.
func (p *faultProxy) pump(c *proxyConn, dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if !p.wait(c) {
			return
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				fmt.Printf("read: %v\n", err)
			}
			return
		}
	}
}

// wait blocks while the proxy is black-holed; false when the connection was closed meanwhile.
func (p *faultProxy) wait(c *proxyConn) bool {
	for {
		p.mu.Lock()
		g := p.gate
		p.mu.Unlock()
		select {
		case <-c.closed:
			return false
		case <-g:
			// A black-hole may have begun between reading the gate and now; take the
			// current one again so a chunk never slips through a fresh black-hole.
			p.mu.Lock()
			same := g == p.gate
			p.mu.Unlock()
			if same {
				return true
			}
		}
	}
}
