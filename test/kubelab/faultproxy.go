package kubelab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
)

// FaultProxy forwards TCP connections from a listener to an upstream address and, on command,
// stops forwarding without closing anything: the shape of a dead connection (incident 3 of
// docs/design.md) while both ends stay up. The lab runs it as `labtool fault-proxy` between
// kube-proxy and the apiserver; the node-cost benchmark runs it in its own process.
//
//	Blackhole  stop forwarding bytes in both directions; every socket stays open, new
//	           connections are accepted (and their upstream dialled) but carry nothing
//	Heal       forward again: bytes held during the black-hole flow on, new connections work
//	Reset      close every current connection on both sides (new ones follow the mode)
//	State      "mode=forward|blackhole open=N accepted=N"
//
// Each command returns after it took effect. Nothing passes while black-holed, not even a
// close: a side that hangs up has its peer closed only once the proxy is healed.
type FaultProxy struct {
	upstream string
	dial     func(ctx context.Context, network, addr string) (net.Conn, error)

	// Logf, when set before Serve, receives one line per mode change and per failure to dial
	// the upstream or read a connection.
	Logf func(format string, args ...any)

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

// NewFaultProxy returns a proxy, forwarding, to upstream (host:port, dialled as tcp4). dial
// opens the upstream connections (for instance netnsdial.Dialer, to reach an apiserver in
// another network namespace); nil is a plain net.Dialer.
func NewFaultProxy(upstream string, dial func(ctx context.Context, network, addr string) (net.Conn, error)) *FaultProxy {
	if dial == nil {
		var d net.Dialer
		dial = d.DialContext
	}
	open := make(chan struct{})
	close(open)
	return &FaultProxy{upstream: upstream, dial: dial, gate: open, conns: map[*proxyConn]struct{}{}}
}

func (p *FaultProxy) logf(format string, args ...any) {
	if p.Logf != nil {
		p.Logf(format, args...)
	}
}

// Serve accepts connections on ln and proxies each, until ln is closed (its error is returned).
// Connections already open stay open: Reset closes them.
func (p *FaultProxy) Serve(ln net.Listener) error {
	for {
		down, err := ln.Accept()
		if err != nil {
			return err
		}
		p.accepted.Add(1)
		go p.handle(down)
	}
}

// Blackhole stops forwarding; see FaultProxy.
func (p *FaultProxy) Blackhole() { p.setForwarding(false) }

// Heal forwards again; see FaultProxy.
func (p *FaultProxy) Heal() { p.setForwarding(true) }

// Reset closes every current connection on both sides.
func (p *FaultProxy) Reset() {
	p.mu.Lock()
	conns := make([]*proxyConn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	for _, c := range conns {
		c.close()
	}
}

// State is "mode=forward|blackhole open=N accepted=N": the mode, the connections open now and
// those accepted since the start.
func (p *FaultProxy) State() string {
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

// Handler is the HTTP control endpoint: /blackhole, /heal, /reset and /state each answer with
// the state line after the command took effect.
func (p *FaultProxy) Handler() http.Handler {
	mux := http.NewServeMux()
	for path, f := range map[string]func(){
		"/blackhole": p.Blackhole,
		"/heal":      p.Heal,
		"/reset":     p.Reset,
		"/state":     func() {},
	} {
		mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
			f()
			fmt.Fprintln(w, p.State())
		})
	}
	return mux
}

func (p *FaultProxy) setForwarding(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.gate: // forwarding now
		if !on {
			p.gate = make(chan struct{})
			p.logf("blackhole")
		}
	default:
		if on {
			close(p.gate)
			p.logf("heal")
		}
	}
}

func (p *FaultProxy) handle(down net.Conn) {
	up, err := p.dial(context.Background(), "tcp4", p.upstream)
	if err != nil {
		p.logf("dial %s: %v", p.upstream, err)
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
func (p *FaultProxy) pump(c *proxyConn, dst, src net.Conn) {
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
				p.logf("read: %v", err)
			}
			return
		}
	}
}

// wait blocks while the proxy is black-holed; false when the connection was closed meanwhile.
func (p *FaultProxy) wait(c *proxyConn) bool {
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
