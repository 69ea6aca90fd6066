package hostrules

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/proxyhealth/proxyhealth/internal/iptlegacy"
	"github.com/proxyhealth/proxyhealth/internal/ipvs"
	"github.com/proxyhealth/proxyhealth/internal/nftnl"
	"github.com/proxyhealth/proxyhealth/internal/notify"
	"github.com/proxyhealth/proxyhealth/internal/ruleset"
)

// Config holds the Source's settings; AddFlags binds them to command-line flags.
type Config struct {
	// ProcPath is the procfs mountpoint: the legacy table lists are read there before a
	// legacy table is named (naming a missing one makes the kernel create it).
	ProcPath string
	// LegacyPollInterval is how often the legacy tables' size and entry count are compared
	// with the last read's (one cheap socket option call per table).
	LegacyPollInterval time.Duration
	// LegacyMinReadInterval is the least time between two whole reads of the legacy tables:
	// the kernel sends no notification for them and a read of a large nat table costs a
	// fraction of a second, so under churn they are re-read at most this often.
	LegacyMinReadInterval time.Duration
	// ResyncInterval is how often the legacy tables are read again whatever their size
	// summary says, to catch what it cannot tell (a legacy endpoint swapped in place).
	// nf_tables is not read whole on it: its notifications are reliable, and a lost one is
	// reported (a Resync change), which reads it whole.
	ResyncInterval time.Duration
	// Debounce is how long nf_tables must be quiet after a change before it is read: a
	// kube-proxy sync is one transaction, but several may follow each other closely.
	Debounce time.Duration
	// MaxDumpBytes is the most bytes one nf_tables reply may carry (0: nftnl's default); a
	// larger one fails the read of what it was for.
	MaxDumpBytes int64
	// LegacyMaxTableBytes is the largest iptables-legacy table read, as the kernel gives its
	// size (0: iptlegacy's default); a larger one is not read, and its read fails.
	LegacyMaxTableBytes int64
}

func (c *Config) validate() error {
	switch {
	case c.LegacyPollInterval <= 0:
		return errors.New("--netfilter.legacy-poll-interval must be positive")
	case c.LegacyMinReadInterval < 0:
		return errors.New("--netfilter.legacy-min-read-interval must not be negative")
	case c.ResyncInterval <= 0:
		return errors.New("--netfilter.resync-interval must be positive")
	case c.Debounce < 0:
		return errors.New("netfilter debounce must not be negative")
	case c.MaxDumpBytes < 0:
		return errors.New("--netfilter.max-dump-bytes must not be negative")
	case c.LegacyMaxTableBytes < 0:
		return errors.New("--netfilter.legacy-max-table-bytes must not be negative")
	}
	return nil
}

// backends is what the Source reads from; system.go has the kernel's, tests fakes.
type backends interface {
	// ipvsInUse reports whether kube-proxy's IPVS mode is in use (its kube-ipvs0 interface).
	ipvsInUse() bool
	// ipvs reads kube-proxy's IPVS mode's virtual servers and kube-ipvs0's addresses; prev is
	// the last read (nil for none), which ipvs.NewTable carries real servers' drain times
	// from. IPVS announces no change: like the legacy tables, it is read on kube-proxy's word
	// and at the resync interval.
	ipvs(prev *ipvs.Table) (*ipvs.Table, error)
	// legacy reads the iptables-legacy tables: kube-proxy's nat rules by family (absent:
	// no legacy nat table, or one without KUBE-SERVICES) and the filter table's forward path
	// (nil without a legacy filter table).
	legacy() (proxy map[bool]*ruleset.ProxyTable, filter *ruleset.Graph, proxyErr, filterErr error)
	// legacyFingerprint summarises the legacy tables' sizes; a change means a read is due.
	legacyFingerprint() (string, error)
	// nft reads nf_tables: kube-proxy's rules through iptables-nft's nat tables and its
	// nftables-mode tables, and the forward path of iptables-nft's filter table and of the
	// native tables. changes are the watch's changes since the last call, in order: only what
	// they name is read again. With nil (no watch, or the first read) everything is read if
	// the ruleset generation moved since the last call.
	nft(changes []nftChange) (nftRead, error)
	// watchNFT follows nf_tables' committed changes until ctx ends. Each value on the
	// channel is one change; resync is set when events may have been lost (a socket overrun
	// or a generation gap). The channel is closed when the watch ends.
	watchNFT(ctx context.Context) (<-chan nftChange, error)
}

// nftRead is one read of nf_tables.
type nftRead struct {
	iptablesNAT  map[bool]*ruleset.ProxyTable // iptables-nft's nat tables with KUBE-SERVICES
	kubeProxy    map[bool]*ruleset.ProxyTable // nftables mode's kube-proxy tables
	iptablesFwd  *ruleset.Graph               // iptables-nft's filter table, nil without one
	nativeFwd    []*ruleset.Graph             // native tables with a forward base chain
	proxyErr     error                        // kube-proxy's tables could not be read
	iptablesErr  error                        // iptables-nft's filter table could not be read
	nativeFwdErr error                        // the native tables could not be read
}

// nftChange is one change the watch reported; resync is set when events may have been lost.
type nftChange struct {
	resync bool
	change nftnl.Change
}

// Source reads the node's netfilter state and publishes it; see the package comment.
type Source struct {
	cfg    Config
	logger *slog.Logger
	b      backends
	now    func() time.Time

	state atomic.Pointer[State]
	// heartbeat is when Run last began its work or went round its poll (unix ns): a Run stuck
	// in a read (a kernel call that does not return) stops moving it.
	heartbeat atomic.Int64
	// lag is what the Source knows of the legacy tables that its State does not show yet.
	lag lag
	// catchUp asks for a legacy read at the next poll, however recent the last one.
	catchUp atomic.Bool

	changes notify.Changes // told after each newly published State
	// Owned by Run; published into each State.
	legacyPart legacyPart
	nftPart    nftPart
	ipvsPart   ipvsPart
	seq        uint64
	// tooLarge is set while the legacy reads fail on a table past the read limit.
	tooLarge bool

	stats stats
}

type legacyPart struct {
	proxy     map[bool]*ruleset.ProxyTable
	filter    *ruleset.Graph
	proxyErr  error
	filterErr error
	at        time.Time
}

// ipvsPart is the last read of IPVS, made while kube-proxy's IPVS mode is in use.
type ipvsPart struct {
	table *ipvs.Table
	err   error
	at    time.Time
}

type nftPart struct {
	read nftRead
	err  error
	at   time.Time
}

// New builds a Source reading this network namespace's tables; it reads nothing until Run.
func New(cfg Config, logger *slog.Logger) (*Source, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.ProcPath == "" {
		cfg.ProcPath = "/proc"
	}
	return newSource(cfg, logger, newSystemBackends(cfg)), nil
}

func newSource(cfg Config, logger *slog.Logger, b backends) *Source {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Source{cfg: cfg, logger: logger, b: b, now: time.Now}
}

// State returns the last published state, nil before the first read ends.
func (s *Source) State() *State { return s.state.Load() }

// Subscribe returns a channel that receives a value (without blocking the Source; values
// coalesce) after each newly published State.
func (s *Source) Subscribe() <-chan struct{} { return s.changes.Subscribe() }

// stallAfter is how long Run may go without a heartbeat before Stalled says so: several polls,
// and longer than the slowest whole read measured (a 3,000-service iptables-nft nat table, 30 s
// of wall time on a busy small node).
func (s *Source) stallAfter() time.Duration { return max(10*s.cfg.LegacyPollInterval, 2*time.Minute) }

// Stalled returns why the Source is stuck, nil while its loop goes round (or before it starts):
// the collectors that read it report themselves failing then, rather than serve an old read as
// current.
func (s *Source) Stalled() error {
	hb := s.heartbeat.Load()
	if hb == 0 {
		return nil
	}
	if since := s.now().Sub(time.Unix(0, hb)); since > s.stallAfter() {
		return fmt.Errorf("the netfilter reader is stuck: no progress for %v (a read of the rules that does not return)", since.Round(time.Second))
	}
	return nil
}

// Hint tells the Source that the rules may have changed where no notification reaches it (the
// legacy tables): kube-proxy reported a sync that may have changed its rules. The legacy tables
// are then read at the next poll, no sooner than LegacyMinReadInterval after the last read.
func (s *Source) Hint() {
	s.stats.hinted.Store(true)
	s.noteNews()
}

// lag tracks what the Source has learned of the legacy tables that its published State does
// not show yet.
type lag struct {
	mu sync.Mutex
	// behind is the first news the published State does not show (zero: none).
	behind time.Time
	// readStart is when the legacy read not yet published began (zero: none);
	// newsDuringRead is the first news since then, which that read may not show.
	readStart, newsDuringRead time.Time
}

// noteNews records that the legacy tables may have changed since the last published read.
func (s *Source) noteNews() {
	now := s.now()
	s.lag.mu.Lock()
	defer s.lag.mu.Unlock()
	if s.lag.behind.IsZero() {
		s.lag.behind = now
	}
	if !s.lag.readStart.IsZero() && s.lag.newsDuringRead.IsZero() {
		s.lag.newsDuringRead = now
	}
}

// Behind returns since when the published State may lag the node's legacy tables: kube-proxy
// reported a sync that may have changed them, or their size moved, and they have not been read
// since (a read waits for LegacyMinReadInterval). Zero when the Source knows of no such change.
// What the State says of the rules is current up to that time.
func (s *Source) Behind() time.Time {
	s.lag.mu.Lock()
	defer s.lag.mu.Unlock()
	return s.lag.behind
}

// CatchUp asks for the legacy read the Source is behind on at its next poll, without waiting
// for LegacyMinReadInterval: a consumer about to act on a difference that has lasted long
// enough asks first whether it is only the reader's lag.
func (s *Source) CatchUp() { s.catchUp.Store(true) }

// Run reads everything at once, then follows changes until ctx is done.
func (s *Source) Run(ctx context.Context) {
	events, err := s.b.watchNFT(ctx)
	if err != nil {
		// Without the watch, nf_tables is read at every legacy poll whose generation moved
		// (the system backends fall back to that) or at each resync.
		s.logger.Warn("cannot follow nf_tables changes; reading them on a timer instead", "err", err)
	}
	s.heartbeat.Store(s.now().UnixNano())
	s.readLegacy()
	s.readNFT(nil)
	s.publish()
	lastFP, _ := s.b.legacyFingerprint()

	poll := time.NewTicker(s.cfg.LegacyPollInterval)
	defer poll.Stop()
	resync := time.NewTicker(s.cfg.ResyncInterval)
	defer resync.Stop()
	var debounce *time.Timer
	var debounceC <-chan time.Time
	defer func() {
		if debounce != nil {
			debounce.Stop()
		}
	}()
	legacyDue := false
	// The changes since the last nf_tables read: all are applied at the debounced read.
	var pending []nftChange
	for {
		select {
		case <-ctx.Done():
			return
		case ch, ok := <-events:
			if !ok {
				events = nil
				if ctx.Err() == nil {
					s.logger.Warn("the nf_tables watch ended; reading nf_tables on a timer instead")
				}
				continue
			}
			if ch.resync {
				s.stats.resyncs.Add(1)
			}
			pending = append(pending, ch)
			if debounce == nil {
				debounce = time.NewTimer(s.cfg.Debounce)
			} else {
				debounce.Reset(s.cfg.Debounce)
			}
			debounceC = debounce.C
		case <-debounceC:
			debounceC = nil
			s.readNFT(pending)
			pending = nil
			s.publish()
		case <-poll.C:
			s.heartbeat.Store(s.now().UnixNano())
			if events == nil {
				// No watch: poll nf_tables too (its generation keeps the read cheap).
				s.readNFT(nil)
			}
			fp, err := s.b.legacyFingerprint()
			if err != nil || fp != lastFP {
				s.noteNews()
				legacyDue = true
			}
			if s.stats.hinted.Swap(false) {
				legacyDue = true
			}
			// kube-proxy's IPVS mode began or ended: read now, whatever the last read's age.
			ipvsChanged := s.b.ipvsInUse() != !s.ipvsPart.at.IsZero()
			if ipvsChanged {
				s.noteNews()
				legacyDue = true
			}
			lastFP = fp
			// Reads are held back only while they are costly: once kube-proxy's table was
			// found. Until then it is about to appear (kube-proxy starting after the
			// exporter), and the read that finds it should not wait.
			catchUp := s.catchUp.Swap(false)
			costly := len(s.legacyPart.proxy) > 0 || s.ipvsPart.table.Len() > 0
			if legacyDue && (catchUp || ipvsChanged || !costly || s.now().Sub(s.legacyPart.at) >= s.cfg.LegacyMinReadInterval) {
				legacyDue = false
				s.readLegacy()
			}
			if s.changedSincePublish() {
				s.publish()
			}
		case <-resync.C:
			s.readLegacy()
			s.publish()
		}
	}
}

func (s *Source) readLegacy() {
	start := s.now()
	s.lag.mu.Lock()
	s.lag.readStart, s.lag.newsDuringRead = start, time.Time{}
	s.lag.mu.Unlock()
	proxy, filter, proxyErr, filterErr := s.b.legacy()
	s.legacyPart = legacyPart{proxy: proxy, filter: filter, proxyErr: proxyErr, filterErr: filterErr, at: s.now()}
	// A table too large to read stays so for a while: said once, when it begins; the
	// collectors report the failure at each scrape.
	tooLarge := errors.Is(errors.Join(proxyErr, filterErr), iptlegacy.ErrTableTooLarge)
	if tooLarge && !s.tooLarge {
		s.logger.Warn("an iptables-legacy table is larger than the read limit and is not read; the collectors that need it fail until it fits (raise the memory limit or --netfilter.legacy-max-table-bytes)",
			"err", errors.Join(proxyErr, filterErr))
	}
	s.tooLarge = tooLarge
	s.stats.observe(BackendLegacy, s.now().Sub(start), errors.Join(proxyErr, filterErr))
	s.readIPVS()
}

// readIPVS reads IPVS while kube-proxy's IPVS mode is in use, and forgets it otherwise. It
// goes with each legacy read: neither announces its changes.
func (s *Source) readIPVS() {
	if !s.b.ipvsInUse() {
		s.ipvsPart = ipvsPart{}
		return
	}
	start := s.now()
	t, err := s.b.ipvs(s.ipvsPart.table)
	if err != nil && s.ipvsPart.err == nil {
		// Said once, when it begins: the rules collector reports it at each scrape.
		s.logger.Warn("cannot read IPVS; kube-proxy's rules are not compared until it can be read", "err", err)
	}
	s.ipvsPart = ipvsPart{table: t, err: err, at: s.now()}
	s.stats.observe(BackendIPVS, s.now().Sub(start), err)
}

func (s *Source) readNFT(changes []nftChange) {
	start := s.now()
	r, err := s.b.nft(changes)
	s.nftPart = nftPart{read: r, err: err, at: s.now()}
	s.stats.observe(BackendNFTables, s.now().Sub(start), errors.Join(err, r.proxyErr, r.iptablesErr, r.nativeFwdErr))
}

// changedSincePublish reports whether a part was read after the last published state.
func (s *Source) changedSincePublish() bool {
	st := s.state.Load()
	return st == nil || s.legacyPart.at.After(st.At) || s.nftPart.at.After(st.At) || s.ipvsPart.at.After(st.At)
}

// publish composes the parts into a new State and tells the subscribers.
func (s *Source) publish() {
	s.seq++
	st := compose(s.legacyPart, s.nftPart, s.ipvsPart)
	st.Seq = s.seq
	st.At = s.legacyPart.at
	for _, at := range []time.Time{s.nftPart.at, s.ipvsPart.at} {
		if at.After(st.At) {
			st.At = at
		}
	}
	s.state.Store(st)
	// A legacy read now published shows what was known before it began; news that came
	// during it still stands.
	s.lag.mu.Lock()
	if !s.lag.readStart.IsZero() {
		s.lag.behind, s.lag.readStart = s.lag.newsDuringRead, time.Time{}
	}
	s.lag.mu.Unlock()
	s.changes.Notify()
}

// compose decides kube-proxy's mode from what each backend holds. kube-proxy removes the other
// modes' rules when it starts (cmd/kube-proxy/app/server_linux.go: platformCleanup), so more
// than one is found only where that cleanup failed. IPVS mode, which also writes iptables rules
// of its own (a KUBE-SERVICES chain matching ip sets), is told by its kube-ipvs0 interface (a
// read of IPVS was made while it existed); then iptables mode is looked for.
func compose(l legacyPart, n nftPart, v ipvsPart) *State {
	st := &State{Proxy: map[bool]*ruleset.ProxyTable{}}
	nr := n.read
	st.Forward = []Forward{
		{Backend: BackendLegacy, Graphs: graphs(l.filter), Err: l.filterErr},
		{Backend: BackendIPTablesNFT, Graphs: graphs(nr.iptablesFwd), Err: errors.Join(n.err, nr.iptablesErr)},
		{Backend: BackendNFTables, Graphs: nr.nativeFwd, Err: errors.Join(n.err, nr.nativeFwdErr)},
	}
	st.ProxyErr = errors.Join(l.proxyErr, n.err, nr.proxyErr)
	if !v.at.IsZero() {
		// kube-proxy's rules are its virtual servers: the tables' errors are not about them.
		st.Mode, st.Backend = ModeIPVS, BackendIPVS
		st.Proxy, st.IPVS, st.ProxyErr = nil, v.table, v.err
		return st
	}
	for _, ipv6 := range []bool{false, true} {
		legacy, viaNFT := l.proxy[ipv6], nr.iptablesNAT[ipv6]
		switch {
		case legacy != nil && (viaNFT == nil || len(legacy.Chains) >= len(viaNFT.Chains)):
			st.Proxy[ipv6] = legacy
			if !ipv6 || st.Backend == "" {
				st.Backend = BackendLegacy
			}
		case viaNFT != nil:
			st.Proxy[ipv6] = viaNFT
			if !ipv6 || st.Backend == "" {
				st.Backend = BackendIPTablesNFT
			}
		}
	}
	if len(st.Proxy) > 0 {
		st.Mode = ModeIPTables
		return st
	}
	for _, ipv6 := range []bool{false, true} {
		if t := nr.kubeProxy[ipv6]; t != nil {
			st.Proxy[ipv6] = t
		}
	}
	if len(st.Proxy) > 0 {
		st.Mode, st.Backend = ModeNFTables, BackendNFTables
		return st
	}
	st.Mode = ModeNone
	return st
}

func graphs(g *ruleset.Graph) []*ruleset.Graph {
	if g == nil {
		return nil
	}
	return []*ruleset.Graph{g}
}
