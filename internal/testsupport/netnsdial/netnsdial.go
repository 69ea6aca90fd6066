// Package netnsdial opens network connections from inside a named network namespace, so that
// a process in one namespace (a test, a benchmark) can reach services bound to another's
// loopback, such as a lab's apiserver or an exporter's metrics.
package netnsdial

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// Dialer returns a DialContext whose sockets are opened inside the namespace named ns (as
// `ip netns add` names it, under /run/netns).
func Dialer(ns string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := inNamespace(ns, func() (err error) {
			var d net.Dialer
			c, err = d.DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
}

// Listen opens a listening socket inside the namespace named ns; it is then served from any
// goroutine.
func Listen(ns, network, addr string) (net.Listener, error) {
	var ln net.Listener
	err := inNamespace(ns, func() (err error) {
		ln, err = net.Listen(network, addr)
		return err
	})
	return ln, err
}

// inNamespace runs open, which creates a socket, on a thread inside namespace ns. A socket
// belongs to the namespace of the thread that creates it, for life, and is then usable from
// any goroutine. open runs on a fresh goroutine locked to its OS thread, which enters ns with
// setns(2); the goroutine ends still locked, so the runtime discards its thread instead of
// reusing it in the wrong namespace.
func inNamespace(ns string, open func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: see above
		f, err := os.Open(filepath.Join("/run/netns", ns))
		if err != nil {
			done <- err
			return
		}
		err = unix.Setns(int(f.Fd()), unix.CLONE_NEWNET)
		f.Close()
		if err != nil {
			done <- fmt.Errorf("setns %s: %w", ns, err)
			return
		}
		done <- open()
	}()
	return <-done
}

// HTTPClient is an HTTP client whose connections are opened inside namespace ns.
func HTTPClient(ns string, timeout time.Duration) *http.Client {
	return &http.Client{
		Timeout:   timeout,
		Transport: &http.Transport{DialContext: Dialer(ns), DisableKeepAlives: true},
	}
}
