package nftnl

import (
	"bytes"
	"testing"

	"github.com/mdlayher/socket"
	"golang.org/x/sys/unix"
)

// A batch receives every queued datagram in one call, each whole or marked cut short.
func TestRecvBatch(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[0])
	c, err := socket.New(fds[1], "recv-test")
	if err != nil {
		unix.Close(fds[1])
		t.Fatal(err)
	}
	defer c.Close()
	sent := [][]byte{[]byte("one"), bytes.Repeat([]byte("x"), 64), []byte("three"), bytes.Repeat([]byte("y"), 65), {}}
	for _, d := range sent {
		if _, err := unix.Write(fds[0], d); err != nil {
			t.Fatal(err)
		}
	}
	b := newRecvBatch(8, 64)
	n, err := b.recv(c)
	if err != nil {
		t.Fatal(err)
	}
	if n != len(sent) {
		t.Fatalf("received %d datagrams in one call, want the %d queued", n, len(sent))
	}
	for i, want := range sent {
		got, truncated := b.datagram(i)
		if wantTrunc := len(want) > 64; truncated != wantTrunc || !bytes.Equal(got, want[:min(len(want), 64)]) {
			t.Errorf("datagram %d: %q (cut short %v), want %q (cut short %v)", i, got, truncated, want, wantTrunc)
		}
	}

	// Fewer queued than buffers, after a call that filled them: no leftover lengths or flags.
	if _, err := unix.Write(fds[0], []byte("again")); err != nil {
		t.Fatal(err)
	}
	if n, err = b.recv(c); err != nil || n != 1 {
		t.Fatalf("recv: %d, %v; want 1 datagram", n, err)
	}
	if got, truncated := b.datagram(0); string(got) != "again" || truncated {
		t.Errorf("datagram: %q (cut short %v), want \"again\"", got, truncated)
	}
}
