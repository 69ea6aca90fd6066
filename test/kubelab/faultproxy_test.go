package kubelab

import (
	"errors"
	"io"
	"net"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"
)

// echoServer answers every connection by echoing what it reads; it runs on the loopback.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(c, c); c.Close() }()
		}
	}()
	return ln.Addr().String()
}

func startProxy(t *testing.T, upstream string) (*FaultProxy, string) {
	t.Helper()
	p := NewFaultProxy(upstream, nil)
	p.Logf = t.Logf
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.Serve(ln) }()
	t.Cleanup(func() {
		ln.Close()
		p.Reset()
		if err := <-done; !errors.Is(err, net.ErrClosed) {
			t.Errorf("Serve: %v", err)
		}
	})
	return p, ln.Addr().String()
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp4", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// roundTrip writes msg and reads len(msg) bytes back within wait.
func roundTrip(c net.Conn, msg string, wait time.Duration) (string, error) {
	if _, err := c.Write([]byte(msg)); err != nil {
		return "", err
	}
	return readN(c, len(msg), wait)
}

func readN(c net.Conn, n int, wait time.Duration) (string, error) {
	_ = c.SetReadDeadline(time.Now().Add(wait))
	buf := make([]byte, n)
	got, err := io.ReadFull(c, buf)
	return string(buf[:got]), err
}

func TestFaultProxyForwards(t *testing.T) {
	p, addr := startProxy(t, echoServer(t))
	c := dial(t, addr)
	if got, err := roundTrip(c, "ping", 2*time.Second); err != nil || got != "ping" {
		t.Fatalf("through the proxy: %q, %v", got, err)
	}
	if s := p.State(); s != "mode=forward open=1 accepted=1" {
		t.Errorf("State() = %q", s)
	}
}

// Black-holed, an open connection and a new one both carry nothing and stay open; healed, what
// was held arrives and both work again.
func TestFaultProxyBlackholeHoldsAndHealReleases(t *testing.T) {
	p, addr := startProxy(t, echoServer(t))
	old := dial(t, addr)
	if got, err := roundTrip(old, "a", 2*time.Second); err != nil || got != "a" {
		t.Fatalf("before the black-hole: %q, %v", got, err)
	}
	p.Blackhole()
	if got, err := roundTrip(old, "held", 300*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("black-holed, the open connection read %q, %v; want a timeout", got, err)
	}
	fresh := dial(t, addr)
	if got, err := roundTrip(fresh, "new", 300*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("black-holed, a new connection read %q, %v; want a timeout", got, err)
	}
	if s := p.State(); s != "mode=blackhole open=2 accepted=2" {
		t.Errorf("State() = %q", s)
	}
	p.Blackhole() // twice is once
	p.Heal()
	if got, err := readN(old, 4, 2*time.Second); err != nil || got != "held" {
		t.Errorf("healed, the held bytes: %q, %v", got, err)
	}
	if got, err := readN(fresh, 3, 2*time.Second); err != nil || got != "new" {
		t.Errorf("healed, the new connection's held bytes: %q, %v", got, err)
	}
	if got, err := roundTrip(old, "b", 2*time.Second); err != nil || got != "b" {
		t.Errorf("healed: %q, %v", got, err)
	}
}

// A close is held like data: the upstream's hang-up reaches the client only after the heal.
func TestFaultProxyHoldsAClose(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			accepted <- c
		}
	}()
	p, addr := startProxy(t, ln.Addr().String())
	c := dial(t, addr)
	var up net.Conn
	select {
	case up = <-accepted:
	case <-time.After(2 * time.Second):
		t.Fatal("the proxy did not dial the upstream")
	}
	p.Blackhole()
	up.Close()
	if _, err := readN(c, 1, 300*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("black-holed, the upstream's close reached the client: %v", err)
	}
	p.Heal()
	if _, err := readN(c, 1, 2*time.Second); !errors.Is(err, io.EOF) {
		t.Errorf("healed: %v, want EOF", err)
	}
}

func TestFaultProxyResetAndHandler(t *testing.T) {
	p, addr := startProxy(t, echoServer(t))
	c := dial(t, addr)
	if got, err := roundTrip(c, "x", 2*time.Second); err != nil || got != "x" {
		t.Fatalf("%q, %v", got, err)
	}
	srv := httptest.NewServer(p.Handler())
	defer srv.Close()
	get := func(path string) string {
		t.Helper()
		resp, err := srv.Client().Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return strings.TrimSpace(string(b))
	}
	if s := get("/blackhole"); s != "mode=blackhole open=1 accepted=1" {
		t.Errorf("/blackhole: %q", s)
	}
	if s := get("/heal"); s != "mode=forward open=1 accepted=1" {
		t.Errorf("/heal: %q", s)
	}
	get("/reset")
	if _, err := readN(c, 1, 2*time.Second); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("after /reset the connection reads %v, want it closed", err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for get("/state") != "mode=forward open=0 accepted=1" && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if s := get("/state"); s != "mode=forward open=0 accepted=1" {
		t.Errorf("/state after reset: %q", s)
	}
}
