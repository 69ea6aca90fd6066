package nftnl

import (
	"context"
	"errors"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/proxyhealth/proxyhealth/internal/nftnl/nftnltest"
)

// A reply larger than the read limit is abandoned with ErrDumpTooLarge once the limit is
// passed, whatever is left of it; the socket then serves the next read. The Limits given to
// the public readers, the Follower and the ForwardReader bound their own reads only: they
// report the error while readers with the default limits beside them read the table, and the
// Follower reads it again once its limit allows.
func TestKernelDumpLimit(t *testing.T) {
	needNetns(t)
	nftnltest.Flush(t)
	const services = 300
	nftnltest.LoadIPTablesSave(t, genIPTables(0, services, true), false)
	ctx := context.Background()
	rules := func(s *nlSocket) (int, error) {
		n := 0
		err := dumpRules(ctx, s, unix.NFPROTO_IPV4, "nat", "", func(*ruleMsg) error { n++; return nil })
		return n, err
	}

	s, err := dial(Limits{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	wantRules, err := rules(s)
	if err != nil {
		t.Fatal(err)
	}
	whole := s.received
	t.Logf("nat table of %d services x 10 endpoints (commented): %d rules, %d bytes of replies (%.0f bytes a service)",
		services, wantRules, whole, float64(whole)/services)

	limit := whole / 4
	s.limit = limit
	n, err := rules(s)
	if !errors.Is(err, ErrDumpTooLarge) {
		t.Fatalf("dump of %d bytes with a %d byte limit: %d rules, err %v; want ErrDumpTooLarge", whole, limit, n, err)
	}
	t.Logf("limited: %v", err)
	if s.received > limit+recvBufBytes {
		t.Errorf("read %d bytes before giving up, limit %d: more than one datagram past it", s.received, limit)
	}
	if n >= wantRules {
		t.Errorf("%d of %d rules handed on though the reply was abandoned", n, wantRules)
	}
	// The abandoned dump would make the kernel refuse a new one on this socket (EBUSY).
	s.limit = DefaultMaxDumpBytes
	if n, err := rules(s); err != nil || n != wantRules {
		t.Fatalf("after an abandoned reply: %d rules, %v; want %d", n, err, wantRules)
	}

	limited := Limits{MaxDumpBytes: limit}
	if _, err := ReadIPTablesNAT(ctx, false, limited); !errors.Is(err, ErrDumpTooLarge) {
		t.Errorf("ReadIPTablesNAT with a %d byte limit: %v, want ErrDumpTooLarge", limit, err)
	}
	if pt, err := ReadIPTablesNAT(ctx, false, Limits{}); err != nil || pt == nil || len(pt.Services) != services {
		t.Errorf("ReadIPTablesNAT under the default limit: %+v, %v; want %d services", pt, err, services)
	}
	f, err := NewFollower(limited)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Resync(ctx); !errors.Is(err, ErrDumpTooLarge) {
		t.Errorf("Follower.Resync with a %d byte limit: %v, want ErrDumpTooLarge", limit, err)
	}
	if pt, err := f.IPTablesNAT(false); !errors.Is(err, ErrDumpTooLarge) || pt != nil {
		t.Errorf("Follower.IPTablesNAT after the limited read: %v, %v; want no table and ErrDumpTooLarge", pt, err)
	}
	// The limit is the Follower's own: another one in the process reads under its defaults.
	unlimited, err := NewFollower(Limits{})
	if err != nil {
		t.Fatal(err)
	}
	defer unlimited.Close()
	if err := unlimited.Resync(ctx); err != nil {
		t.Fatalf("Follower.Resync under the default limit beside a limited one: %v", err)
	}
	if pt, err := unlimited.IPTablesNAT(false); err != nil || pt == nil || len(pt.Services) != services {
		t.Errorf("Follower.IPTablesNAT under the default limit: %+v, %v; want %d services", pt, err, services)
	}
	// Once its socket allows the reply, the limited Follower reads the table again.
	f.sock.limit = DefaultMaxDumpBytes
	if err := f.Resync(ctx); err != nil {
		t.Fatal(err)
	}
	pt, err := f.IPTablesNAT(false)
	if err != nil || pt == nil || len(pt.Services) != services {
		t.Fatalf("Follower.IPTablesNAT once the limit allows: %+v, %v; want %d services", pt, err, services)
	}

	// The chain listing the ForwardReader starts with is one reply of every table's chains,
	// over 3,000 here.
	fwd := &ForwardReader{Limits: Limits{MaxDumpBytes: 4 << 10}}
	defer fwd.Close()
	if _, err := fwd.Read(ctx, nil); !errors.Is(err, ErrDumpTooLarge) {
		t.Errorf("ForwardReader.Read with a 4 KiB limit: %v, want ErrDumpTooLarge", err)
	}
	fwd = &ForwardReader{}
	defer fwd.Close()
	if _, err := fwd.Read(ctx, nil); err != nil {
		t.Errorf("ForwardReader.Read under the default limit: %v", err)
	}
}
