package netnsdial

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/proxyhealth/proxyhealth/internal/testsupport/prereq"
)

// A listener on the loopback of a namespace of the test's own is reachable through Dialer and
// not from the test's namespace.
func TestDialerReachesTheNamespacesLoopback(t *testing.T) {
	if os.Geteuid() != 0 {
		prereq.Skip(t, "needs root to create a network namespace")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		prereq.Skip(t, "ip not installed")
	}
	ns := fmt.Sprintf("ph-netnsdial-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	if out, err := exec.Command("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("lo up: %v: %s", err, out)
	}
	// A server inside the namespace that answers one connection (python3 is on this machine kind;
	// without it the test skips). It says "ready" once it listens: on a loaded machine the
	// interpreter alone can take seconds to start, so the test waits for the word, not a time.
	srv := exec.Command("ip", "netns", "exec", ns, "sh", "-c", "exec python3 -u -c 'import socket;s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);s.bind((\"127.0.0.1\",19999));s.listen(1);print(\"ready\");c,_=s.accept();c.sendall(b\"hi\");c.close()'")
	out, err := srv.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		prereq.Skipf(t, "cannot start a server in the namespace: %v", err)
	}
	t.Cleanup(func() { _ = srv.Process.Kill(); _ = srv.Wait() })
	ready := make(chan error, 1)
	go func() {
		line, err := bufio.NewReader(out).ReadString('\n')
		if err == nil && line != "ready\n" {
			err = fmt.Errorf("server said %q", line)
		}
		ready <- err
	}()
	select {
	case err := <-ready:
		if err != nil {
			t.Fatalf("server in %s: %v", ns, err)
		}
	case <-time.After(2 * time.Minute): // a bound on a stuck server, not a measure of speed
		t.Fatalf("server in %s did not listen within 2m", ns)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := Dialer(ns)(ctx, "tcp", "127.0.0.1:19999")
	if err != nil {
		t.Fatalf("dial inside %s: %v", ns, err)
	}
	defer c.Close()
	buf := make([]byte, 2)
	if _, err := c.Read(buf); err != nil || string(buf) != "hi" {
		t.Errorf("read %q, %v; want hi", buf, err)
	}
}

// A listener opened through Listen is inside the namespace: Dialer reaches it there.
func TestListenInsideTheNamespace(t *testing.T) {
	if os.Geteuid() != 0 {
		prereq.Skip(t, "needs root to create a network namespace")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		prereq.Skip(t, "ip not installed")
	}
	ns := fmt.Sprintf("ph-netnslisten-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	if out, err := exec.Command("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("lo up: %v: %s", err, out)
	}
	ln, err := Listen(ns, "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			_, _ = c.Write([]byte("ok"))
			c.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := Dialer(ns)(ctx, "tcp", ln.Addr().String())
	if err != nil {
		t.Fatalf("dial the namespace's listener: %v", err)
	}
	defer c.Close()
	buf := make([]byte, 2)
	if _, err := c.Read(buf); err != nil || string(buf) != "ok" {
		t.Errorf("read %q, %v; want ok", buf, err)
	}
}
