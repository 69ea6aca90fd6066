//go:build e2e

package e2e

import (
	"strings"
	"testing"
	"time"
)

// TestLabReproducesIncident1 proves the lab itself, without the exporter: with
// bridge-nf-call-iptables=0, connections from pod A to a ClusterIP whose endpoints are on A's
// bridge time out, and conntrack keeps them [UNREPLIED] with B as the reply source; with 1 they
// succeed.
func TestLabReproducesIncident1(t *testing.T) {
	l := newLab(t)
	l.ServeTCP(l.B, "0.0.0.0:"+podPort)

	if n := l.Connect(l.A, webVIP+":80", 3, 2*time.Second); n != 3 {
		t.Fatalf("bridge-nf-call-iptables=1: %d of 3 connections succeeded, want 3", n)
	}

	l.Sysctl("net.bridge.bridge-nf-call-iptables=0")
	if n := l.Connect(l.A, webVIP+":80", 3, 2*time.Second); n != 0 {
		t.Fatalf("bridge-nf-call-iptables=0: %d of 3 connections succeeded, want 0", n)
	}
	assertUnrepliedToB(t, l.UnrepliedTo(webVIP), 3)
	l.Sysctl("net.bridge.bridge-nf-call-iptables=1")
	if n := l.Connect(l.A, webVIP+":80", 3, 2*time.Second); n != 3 {
		t.Fatalf("bridge-nf-call-iptables back to 1: %d of 3 connections succeeded, want 3", n)
	}
}

// assertUnrepliedToB checks the reproduction itself: want SYN_SENT [UNREPLIED] flows to the web
// VIP, each with B (one of its two addresses) as the reply source.
func assertUnrepliedToB(t *testing.T, lines []string, want int) {
	t.Helper()
	for _, line := range lines {
		if !strings.Contains(line, "src="+podB+" ") && !strings.Contains(line, "src="+podB2+" ") {
			t.Errorf("unreplied flow whose reply source is not B: %s", line)
		}
	}
	if len(lines) != want {
		t.Fatalf("conntrack shows %d SYN_SENT [UNREPLIED] flows to %s, want %d:\n%s", len(lines), webVIP, want, strings.Join(lines, "\n"))
	}
	t.Logf("reproduced, conntrack in the node namespace:\n%s", strings.Join(lines, "\n"))
}

// TestLabInvalidPackets proves that every crafted SYN+FIN packet routed through the node
// namespace counts once in the kernel's conntrack invalid statistic, and nothing else does.
func TestLabInvalidPackets(t *testing.T) {
	l := newLab(t)
	before := l.ConntrackInvalid()
	const n = 50
	l.SendInvalid(l.A, podC+":"+blackPort, n)
	waitFor(t, 3*time.Second, "invalid count to rise by 50", func() (bool, string) {
		got := l.ConntrackInvalid() - before
		return got == n, "rose by " + itoa(got)
	})
	// And it stays there: nothing else in the lab is INVALID.
	time.Sleep(300 * time.Millisecond)
	if got := l.ConntrackInvalid() - before; got != n {
		t.Fatalf("invalid rose by %d, want exactly %d", got, n)
	}
}
