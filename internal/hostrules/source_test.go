package hostrules

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/proxyhealth/proxyhealth/internal/iptlegacy"
	"github.com/proxyhealth/proxyhealth/internal/ipvs"
	"github.com/proxyhealth/proxyhealth/internal/ruleset"
)

type fakeBackends struct {
	mu          sync.Mutex
	ipvsOn      bool
	ipvsServers []ipvs.VirtualServer
	ipvsErr     error
	ipvsReads   int
	legacyProxy map[bool]*ruleset.ProxyTable
	legacyErr   error
	fingerprint string
	nftRead     nftRead
	nftErr      error
	watchErr    error
	changes     chan nftChange
	legacyReads int
	nftReads    int
	nftChanges  [][]nftChange // what each nft call was given
}

func (f *fakeBackends) ipvsInUse() bool { f.mu.Lock(); defer f.mu.Unlock(); return f.ipvsOn }
func (f *fakeBackends) ipvs(prev *ipvs.Table) (*ipvs.Table, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ipvsReads++
	if f.ipvsErr != nil {
		return nil, f.ipvsErr
	}
	return ipvs.NewTable(prev, f.ipvsServers, nil, time.Now()), nil
}
func (f *fakeBackends) legacy() (map[bool]*ruleset.ProxyTable, *ruleset.Graph, error, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.legacyReads++
	return f.legacyProxy, nil, f.legacyErr, nil
}
func (f *fakeBackends) legacyFingerprint() (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.fingerprint, nil
}
func (f *fakeBackends) nft(changes []nftChange) (nftRead, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nftReads++
	f.nftChanges = append(f.nftChanges, changes)
	return f.nftRead, f.nftErr
}
func (f *fakeBackends) watchNFT(ctx context.Context) (<-chan nftChange, error) {
	if f.watchErr != nil {
		return nil, f.watchErr
	}
	return f.changes, nil
}

func (f *fakeBackends) counts() (legacy, nft int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.legacyReads, f.nftReads
}

// runUntilEnd runs s until the test ends.
func runUntilEnd(t *testing.T, s *Source) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

// startFake runs a Source of cfg on fb until the test ends.
func startFake(t *testing.T, cfg Config, fb *fakeBackends) *Source {
	s := newSource(cfg, nil, fb)
	runUntilEnd(t, s)
	return s
}

func table(chains int) *ruleset.ProxyTable {
	t := &ruleset.ProxyTable{Chains: map[string][]netip.AddrPort{}}
	for i := range chains {
		t.Chains["KUBE-SVC-"+string(rune('A'+i))] = nil
	}
	return t
}

func TestCompose(t *testing.T) {
	cases := []struct {
		name        string
		legacy      map[bool]*ruleset.ProxyTable
		nft         nftRead
		ipvs        bool
		wantMode    string
		wantBackend string
		wantIPv6    bool
	}{
		{name: "nothing", wantMode: ModeNone},
		{name: "ipvs wins", legacy: map[bool]*ruleset.ProxyTable{false: table(1)}, ipvs: true, wantMode: ModeIPVS, wantBackend: BackendIPVS},
		{name: "legacy", legacy: map[bool]*ruleset.ProxyTable{false: table(2)}, wantMode: ModeIPTables, wantBackend: BackendLegacy},
		{name: "iptables-nft", nft: nftRead{iptablesNAT: map[bool]*ruleset.ProxyTable{false: table(2), true: table(1)}}, wantMode: ModeIPTables, wantBackend: BackendIPTablesNFT, wantIPv6: true},
		{name: "both iptables backends: the fuller wins", legacy: map[bool]*ruleset.ProxyTable{false: table(1)}, nft: nftRead{iptablesNAT: map[bool]*ruleset.ProxyTable{false: table(3)}}, wantMode: ModeIPTables, wantBackend: BackendIPTablesNFT},
		{name: "iptables before nftables", legacy: map[bool]*ruleset.ProxyTable{false: table(1)}, nft: nftRead{kubeProxy: map[bool]*ruleset.ProxyTable{false: table(5)}}, wantMode: ModeIPTables, wantBackend: BackendLegacy},
		{name: "nftables", nft: nftRead{kubeProxy: map[bool]*ruleset.ProxyTable{false: table(5)}}, wantMode: ModeNFTables, wantBackend: BackendNFTables},
		{name: "nftables IPv6 only", nft: nftRead{kubeProxy: map[bool]*ruleset.ProxyTable{true: table(5)}}, wantMode: ModeNFTables, wantBackend: BackendNFTables, wantIPv6: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var v ipvsPart
			if tc.ipvs {
				v = ipvsPart{table: ipvs.NewTable(nil, nil, nil, time.Unix(1, 0)), at: time.Unix(1, 0)}
			}
			st := compose(legacyPart{proxy: tc.legacy}, nftPart{read: tc.nft}, v)
			if st.Mode != tc.wantMode || st.Backend != tc.wantBackend {
				t.Errorf("mode %q backend %q, want %q %q", st.Mode, st.Backend, tc.wantMode, tc.wantBackend)
			}
			if got := st.ProxyRules(true) != nil; got != tc.wantIPv6 {
				t.Errorf("IPv6 rules present = %v, want %v", got, tc.wantIPv6)
			}
			if len(st.Forward) != 3 {
				t.Errorf("forward backends = %d, want 3", len(st.Forward))
			}
		})
	}
}

func TestComposeErrors(t *testing.T) {
	legacyErr := errors.New("legacy: operation not permitted")
	st := compose(legacyPart{proxyErr: legacyErr, filterErr: legacyErr}, nftPart{read: nftRead{kubeProxy: map[bool]*ruleset.ProxyTable{false: table(1)}}}, ipvsPart{})
	if !errors.Is(st.ProxyErr, legacyErr) || st.Mode != ModeNFTables {
		t.Errorf("ProxyErr %v mode %q: want the legacy error kept beside the nftables rules", st.ProxyErr, st.Mode)
	}
	if !errors.Is(st.Forward[0].Err, legacyErr) || st.Forward[1].Err != nil {
		t.Errorf("forward errors %v, %v: want only the legacy backend failing", st.Forward[0].Err, st.Forward[1].Err)
	}
}

// waitFor polls cond for up to two seconds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for range 400 {
		if cond() {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
}

func TestSourceFollowsChanges(t *testing.T) {
	fb := &fakeBackends{
		changes:     make(chan nftChange),
		nftRead:     nftRead{kubeProxy: map[bool]*ruleset.ProxyTable{false: table(1)}},
		fingerprint: "a",
	}
	cfg := Config{LegacyPollInterval: 10 * time.Millisecond, LegacyMinReadInterval: 0, ResyncInterval: time.Hour, Debounce: 20 * time.Millisecond}
	s := newSource(cfg, nil, fb)
	sub := s.Subscribe()
	runUntilEnd(t, s)

	<-sub
	st := s.State()
	if st.Mode != ModeNFTables || st.Seq != 1 {
		t.Fatalf("first state: mode %q seq %d", st.Mode, st.Seq)
	}
	legacy0, nft0 := fb.counts()

	// A burst of nf_tables changes is read once, after the burst.
	fb.mu.Lock()
	fb.nftRead = nftRead{kubeProxy: map[bool]*ruleset.ProxyTable{false: table(2)}}
	fb.mu.Unlock()
	for range 5 {
		fb.changes <- nftChange{}
	}
	fb.changes <- nftChange{resync: true}
	<-sub
	if got := len(s.State().ProxyRules(false).Chains); got != 2 {
		t.Errorf("after the change: %d chains, want 2", got)
	}
	if _, n := fb.counts(); n != nft0+1 {
		t.Errorf("nf_tables read %d times for one burst, want 1", n-nft0)
	}
	fb.mu.Lock()
	if got := fb.nftChanges; len(got) != 2 || got[0] != nil || len(got[1]) != 6 || !got[1][5].resync {
		t.Errorf("changes given to the reads: %+v, want none at first, then the burst's 6", got)
	}
	fb.mu.Unlock()
	if got := s.stats.resyncs.Load(); got != 1 {
		t.Errorf("resyncs = %d, want 1", got)
	}

	// Legacy tables: read when their fingerprint moves.
	fb.mu.Lock()
	fb.fingerprint = "b"
	fb.legacyProxy = map[bool]*ruleset.ProxyTable{false: table(3)}
	fb.mu.Unlock()
	<-sub
	waitFor(t, "the legacy read", func() bool { return s.State().Backend == BackendLegacy })
	l1, _ := fb.counts()
	if l1 != legacy0+1 {
		t.Errorf("legacy read %d times after one fingerprint change, want 1", l1-legacy0)
	}
	// A hint (kube-proxy synced) forces a legacy read though the fingerprint stands.
	s.Hint()
	waitFor(t, "the hinted legacy read", func() bool { l, _ := fb.counts(); return l == l1+1 })
	// And nothing else reads while nothing changes.
	time.Sleep(50 * time.Millisecond)
	if l, n := fb.counts(); l != l1+1 || n != nft0+1 {
		t.Errorf("reads while idle: legacy %d nft %d, want none", l-l1-1, n-nft0-1)
	}
}

func TestSourceLegacyMinReadInterval(t *testing.T) {
	fb := &fakeBackends{changes: make(chan nftChange), fingerprint: "0", legacyProxy: map[bool]*ruleset.ProxyTable{false: table(3)}}
	cfg := Config{LegacyPollInterval: 5 * time.Millisecond, LegacyMinReadInterval: time.Hour, ResyncInterval: time.Hour}
	s := startFake(t, cfg, fb)
	waitFor(t, "the first read", func() bool { return s.State() != nil })
	for i := range 10 {
		fb.mu.Lock()
		fb.fingerprint = string(rune('a' + i))
		fb.mu.Unlock()
		time.Sleep(10 * time.Millisecond)
	}
	if l, _ := fb.counts(); l != 1 {
		t.Errorf("legacy read %d times within the minimum interval, want only the first", l)
	}
}

// Until kube-proxy's table is found, reads are cheap and not held back: the read that finds
// the table kube-proxy is writing does not wait for the minimum interval.
func TestSourceReadsAtOnceUntilKubeProxysTable(t *testing.T) {
	fb := &fakeBackends{changes: make(chan nftChange), fingerprint: "0"}
	cfg := Config{LegacyPollInterval: 5 * time.Millisecond, LegacyMinReadInterval: time.Hour, ResyncInterval: time.Hour}
	s := startFake(t, cfg, fb)
	waitFor(t, "the first read", func() bool { return s.State() != nil })
	fb.mu.Lock()
	fb.fingerprint, fb.legacyProxy = "1", map[bool]*ruleset.ProxyTable{false: table(3)}
	fb.mu.Unlock()
	waitFor(t, "the read that finds kube-proxy's table", func() bool { return s.State().Backend == BackendLegacy })
	fb.mu.Lock()
	fb.fingerprint = "2"
	fb.mu.Unlock()
	time.Sleep(30 * time.Millisecond)
	if l, _ := fb.counts(); l != 2 {
		t.Errorf("legacy read %d times, want 2: once the table is found, reads wait for the minimum interval", l)
	}
}

// A hint the minimum interval holds back leaves the State behind since the hint; CatchUp reads
// at the next poll, and the State published then is current again.
func TestSourceBehindAndCatchUp(t *testing.T) {
	fb := &fakeBackends{changes: make(chan nftChange), fingerprint: "0", legacyProxy: map[bool]*ruleset.ProxyTable{false: table(3)}}
	cfg := Config{LegacyPollInterval: 5 * time.Millisecond, LegacyMinReadInterval: time.Hour, ResyncInterval: time.Hour}
	s := startFake(t, cfg, fb)
	waitFor(t, "the first read", func() bool { return s.State() != nil })
	if b := s.Behind(); !b.IsZero() {
		t.Fatalf("Behind() = %v after the first read, want zero", b)
	}
	s.CatchUp() // nothing to catch up on: no read
	time.Sleep(30 * time.Millisecond)
	if l, _ := fb.counts(); l != 1 {
		t.Errorf("legacy read %d times after CatchUp with nothing behind, want only the first", l)
	}
	before := time.Now()
	s.Hint()
	time.Sleep(30 * time.Millisecond)
	if l, _ := fb.counts(); l != 1 {
		t.Errorf("legacy read %d times, want only the first: the hint waits for the minimum interval", l)
	}
	b := s.Behind()
	if b.IsZero() || b.Before(before) || b.After(time.Now()) {
		t.Errorf("Behind() = %v after a hint held back at %v, want the hint's time", b, before)
	}
	seq := s.State().Seq
	s.CatchUp()
	waitFor(t, "the read caught up", func() bool { l, _ := fb.counts(); return l == 2 && s.State().Seq > seq })
	if b := s.Behind(); !b.IsZero() {
		t.Errorf("Behind() = %v after catching up, want zero", b)
	}
}

// News during a legacy read is not served by that read: the State stays behind since then.
func TestSourceNewsDuringReadStands(t *testing.T) {
	s := newSource(Config{}, nil, &fakeBackends{})
	now := time.Unix(1000, 0)
	s.now = func() time.Time { return now }
	s.Hint()
	now = now.Add(time.Second)
	s.lag.mu.Lock()
	s.lag.readStart = now
	s.lag.mu.Unlock()
	now = now.Add(time.Second)
	s.Hint() // during the read
	s.publish()
	if got, want := s.Behind(), time.Unix(1002, 0); !got.Equal(want) {
		t.Errorf("Behind() = %v, want the news during the read, %v", got, want)
	}
}

// The periodic resync reads the legacy tables again, not nf_tables: its changes are followed.
func TestSourceResyncReadsLegacyOnly(t *testing.T) {
	fb := &fakeBackends{changes: make(chan nftChange), fingerprint: "0"}
	cfg := Config{LegacyPollInterval: time.Hour, ResyncInterval: 10 * time.Millisecond}
	startFake(t, cfg, fb)
	waitFor(t, "three resyncs", func() bool { l, _ := fb.counts(); return l >= 4 })
	if _, n := fb.counts(); n != 1 {
		t.Errorf("nf_tables read %d times, want only the first read", n)
	}
}

func TestSourceWithoutWatchPolls(t *testing.T) {
	fb := &fakeBackends{watchErr: errors.New("operation not permitted")}
	cfg := Config{LegacyPollInterval: 5 * time.Millisecond, ResyncInterval: time.Hour}
	startFake(t, cfg, fb)
	waitFor(t, "polled nf_tables reads", func() bool { _, n := fb.counts(); return n >= 3 })
}

func TestStalled(t *testing.T) {
	s := newSource(Config{LegacyPollInterval: time.Second}, nil, &fakeBackends{})
	now := time.Unix(1000, 0)
	s.now = func() time.Time { return now }
	if err := s.Stalled(); err != nil {
		t.Errorf("before Run: %v", err)
	}
	s.heartbeat.Store(now.UnixNano())
	now = now.Add(time.Minute)
	if err := s.Stalled(); err != nil {
		t.Errorf("a minute after a heartbeat: %v", err)
	}
	now = now.Add(2 * time.Minute)
	if err := s.Stalled(); err == nil || !strings.Contains(err.Error(), "stuck") {
		t.Errorf("three minutes after a heartbeat: %v, want stuck", err)
	}
}

// A legacy table past the read limit fails the reads of kube-proxy's rules with the reason, and
// is said in the log once while it lasts, again when it comes back.
func TestSourceLogsTableTooLargeOnce(t *testing.T) {
	var logs strings.Builder
	fb := &fakeBackends{}
	s := newSource(Config{}, slog.New(slog.NewTextHandler(&logs, nil)), fb)
	tooLarge := fmt.Errorf("iptables-legacy: %w: table nat is 300 bytes, the limit 200", iptlegacy.ErrTableTooLarge)
	for _, err := range []error{tooLarge, tooLarge, tooLarge, nil, tooLarge} {
		fb.mu.Lock()
		fb.legacyErr = err
		fb.mu.Unlock()
		s.readLegacy()
		s.publish()
		if got := s.State().ProxyErr; !errors.Is(got, err) || (err == nil) != (got == nil) {
			t.Errorf("ProxyErr %v, want %v", got, err)
		}
	}
	if got := strings.Count(logs.String(), "larger than the read limit and is not read"); got != 2 {
		t.Errorf("logged %d times, want 2 (at the first failure, and when it came back):\n%s", got, logs.String())
	}
	if !strings.Contains(logs.String(), "table nat is 300 bytes, the limit 200") {
		t.Errorf("the log does not give the table's size and the limit:\n%s", logs.String())
	}
}

// kube-proxy's IPVS mode: its virtual servers are read when kube-ipvs0 appears, again on
// kube-proxy's word (a hint), and the State says ipvs with the table; a read that fails says
// why in ProxyErr without rules of another mode taking its place.
func TestSourceIPVS(t *testing.T) {
	vs := func(eps int) []ipvs.VirtualServer {
		v := ipvs.VirtualServer{Key: ipvs.Key{Addr: netip.MustParseAddr("10.96.0.10"), Port: 53, Protocol: "UDP"}}
		for i := range eps {
			v.RealServers = append(v.RealServers, ipvs.RealServer{Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 77, 0, byte(i + 1)}), 53), Weight: 1})
		}
		return []ipvs.VirtualServer{v}
	}
	// kube-proxy in IPVS mode with the nft backend writes a KUBE-SERVICES chain of its own.
	fb := &fakeBackends{changes: make(chan nftChange), fingerprint: "0",
		nftRead: nftRead{iptablesNAT: map[bool]*ruleset.ProxyTable{false: table(0)}}}
	cfg := Config{LegacyPollInterval: 5 * time.Millisecond, LegacyMinReadInterval: time.Hour, ResyncInterval: time.Hour}
	s := startFake(t, cfg, fb)
	waitFor(t, "the first read", func() bool { return s.State() != nil })
	if st := s.State(); st.Mode != ModeIPTables || st.IPVS != nil {
		t.Fatalf("before kube-ipvs0: mode %q IPVS %v", st.Mode, st.IPVS)
	}
	fb.mu.Lock()
	fb.ipvsOn, fb.ipvsServers = true, vs(2)
	fb.mu.Unlock()
	waitFor(t, "IPVS mode", func() bool { return s.State().Mode == ModeIPVS })
	if st := s.State(); st.Backend != BackendIPVS || st.IPVS.Len() != 1 || len(st.IPVS.Serving(vs(0)[0].Key)) != 2 || st.ProxyErr != nil {
		t.Errorf("IPVS mode: backend %q, %d virtual servers, error %v", st.Backend, st.IPVS.Len(), st.ProxyErr)
	}
	// A change announces nothing; kube-proxy's sync does, through a hint. With the table
	// found, the read waits for the minimum interval, unless asked to catch up, as the drift
	// check does before it counts a difference.
	fb.mu.Lock()
	fb.ipvsServers = vs(3)
	reads := fb.ipvsReads
	fb.mu.Unlock()
	s.Hint()
	if s.Behind().IsZero() {
		t.Error("not behind after kube-proxy's sync")
	}
	s.CatchUp()
	waitFor(t, "the read on kube-proxy's word", func() bool {
		st := s.State()
		return st.IPVS != nil && len(st.IPVS.Serving(vs(0)[0].Key)) == 3
	})
	fb.mu.Lock()
	if fb.ipvsReads <= reads {
		t.Errorf("IPVS read %d times since, want more", fb.ipvsReads-reads)
	}
	fb.ipvsErr = errNoIPVS
	fb.mu.Unlock()
	s.Hint()
	s.CatchUp()
	waitFor(t, "the failed read", func() bool { return s.State().ProxyErr != nil })
	if st := s.State(); st.Mode != ModeIPVS || st.IPVS != nil || !errors.Is(st.ProxyErr, errNoIPVS) {
		t.Errorf("a failed IPVS read: mode %q IPVS %v error %v", st.Mode, st.IPVS, st.ProxyErr)
	}
}

var errNoIPVS = errors.New("the kernel has no IPVS (ip_vs is not loaded)")
