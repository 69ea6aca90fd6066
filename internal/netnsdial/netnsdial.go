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
//
// A socket belongs to the namespace of the thread that creates it, for life. Each dial runs on
// a fresh goroutine locked to its OS thread, which enters ns with setns(2) and creates the
// socket there; the connection is then used from any goroutine. The goroutine ends still
// locked, so the runtime discards its thread instead of reusing it in the wrong namespace.
func Dialer(ns string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	path := filepath.Join("/run/netns", ns)
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		type result struct {
			c   net.Conn
			err error
		}
		ch := make(chan result, 1)
		go func() {
			runtime.LockOSThread() // never unlocked: see above
			f, err := os.Open(path)
			if err != nil {
				ch <- result{nil, err}
				return
			}
			err = unix.Setns(int(f.Fd()), unix.CLONE_NEWNET)
			f.Close()
			if err != nil {
				ch <- result{nil, fmt.Errorf("setns %s: %w", ns, err)}
				return
			}
			var d net.Dialer
			c, err := d.DialContext(ctx, network, addr)
			ch <- result{c, err}
		}()
		r := <-ch
		return r.c, r.err
	}
}

// HTTPClient is an HTTP client whose connections are opened inside namespace ns.
func HTTPClient(ns string, timeout time.Duration) *http.Client {
	return &http.Client{
		Timeout:   timeout,
		Transport: &http.Transport{DialContext: Dialer(ns), DisableKeepAlives: true},
	}
}
