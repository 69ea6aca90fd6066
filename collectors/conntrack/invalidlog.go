package conntrack

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/proxyhealth/proxyhealth/internal/sysctl"
)

// The settings that route conntrack's INVALID log to NFLOG group 0, relative to the procfs
// mountpoint, the values --conntrack.invalid-reasons gives them, and those that log nothing
// (the originals when they are unknown). Both are per network namespace: /proc/sys/net
// resolves to the namespace of the process that opens it. They are set in this order and put
// back in the reverse one: the backends are nfnetlink_log before log_invalid rises, and
// log_invalid is down before a syslog backend returns, so no INVALID packet is ever printed
// to the kernel log in between.
var invalidLogSettings = []struct{ path, value, quiet string }{
	// nf_log's backend per family (NFPROTO_IPV4, NFPROTO_IPV6): nfnetlink_log sends to NFLOG
	// group 0, where conntrack's log has no group of its own.
	{filepath.Join(sysctl.NetfilterDir, "nf_log", "2"), "nfnetlink_log", "NONE"},
	{filepath.Join(sysctl.NetfilterDir, "nf_log", "10"), "nfnetlink_log", "NONE"},
	// Log every protocol's INVALID packets (255: all; the value is a protocol number).
	{filepath.Join(sysctl.NetfilterDir, "nf_conntrack_log_invalid"), "255", "0"},
}

// savedSetting is a setting's value before the exporter changed it.
type savedSetting struct{ path, value string }

// invalidKey is one label set of proxyhealth_conntrack_invalid_reason_packets_total.
type invalidKey struct {
	reason          invalidReason
	namespace, name string
}

// invalidLog is the collector's --conntrack.invalid-reasons part: it points conntrack's
// INVALID log at NFLOG group 0, reads it, and counts packets by reason and Service. It
// changes the node's settings only while it reads, and puts them back when it stops (restore).
type invalidLog struct {
	// netfilterDir is where the settings are written: the netfilter sysctl directory
	// (--conntrack.invalid-reasons.netfilter-dir, else procfs's sys/net/netfilter).
	netfilterDir string
	state        invalidStateStore
	bufBytes     int
	maxSeries    int
	logger       *slog.Logger
	open         func(bufBytes int) (eventSource, error)
	view         func() *attributionView
	now          func() time.Time

	mu       sync.Mutex
	stopped  bool           // restore ran: nothing may be set again
	saved    []savedSetting // what the settings were before we set them; nil while not set
	sock     eventSource
	err      error // why the part is not running; nil while it is
	counts   map[invalidKey]*prunedSeries
	lastPass time.Time // the last prune pass
	unlisted [invalidReasonCount]uint64
	lost     uint64 // packets the kernel logged that never reached us (sequence gaps)
	// foreign counts the group's messages that are not conntrack's INVALID log
	// (conntrackInvalidText): counted apart, never as INVALID packets.
	foreign  uint64
	nextSeq  uint32
	seqKnown bool
	// bound keeps the reader's cost bounded under a flood (invalidFloodBound); listened is
	// the time the group was bound before boundSince, which is zero while it is not.
	bound      invalidFloodBound
	listened   time.Duration
	boundSince time.Time
}

func newInvalidLog(cfg *Config, logger *slog.Logger, view func() *attributionView) *invalidLog {
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	return &invalidLog{
		netfilterDir: cfg.invalidLogNetfilterDir(),
		state:        invalidStateStore{dir: cfg.InvalidReasonsStateDir},
		bufBytes:     cfg.SocketBufferBytes,
		maxSeries:    cfg.MaxServiceSeries,
		logger:       logger,
		open:         func(n int) (eventSource, error) { return openInvalidLog(n) },
		view:         view,
		now:          now,
		counts:       make(map[invalidKey]*prunedSeries),
		err:          ErrInvalidLogNotStarted,
		bound:        newInvalidFloodBound(float64(cfg.InvalidReasonsMaxRate)),
	}
}

// run binds the group, sets the settings and reads until ctx is done, then restores the
// settings. A bind or a setting that fails is retried with a growing pause, so a group another
// reader holds is taken once it is free; the error is what Update reports meanwhile.
func (l *invalidLog) run(ctx context.Context) {
	defer l.restore()
	const maxBackoff = time.Minute
	backoff := time.Second
	for ctx.Err() == nil {
		err := l.start()
		if err == nil {
			backoff = time.Second
			err = l.consume(ctx)
			if ctx.Err() != nil {
				return
			}
			if errors.Is(err, errInvalidFlood) {
				// Not a failure: the group stays unbound until the next sampled window.
				if !l.sleepUntil(ctx, l.resumeAt()) {
					return
				}
				continue
			}
			// The settings stay while the socket is replaced: with no reader, the kernel
			// drops what it logs.
			err = fmt.Errorf("reading NFLOG group 0: %w", err)
		}
		l.setErr(fmt.Errorf("conntrack INVALID log (--conntrack.invalid-reasons): %w", err))
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// resumeAt is when the reader binds the group again after a window that reached its budget.
func (l *invalidLog) resumeAt() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.bound.resumeAt()
}

// sleepUntil waits until t by l's clock, or until ctx is done (false).
func (l *invalidLog) sleepUntil(ctx context.Context, t time.Time) bool {
	timer := time.NewTimer(t.Sub(l.now()))
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-timer.C:
		return true
	}
}

func (l *invalidLog) setErr(err error) {
	l.mu.Lock()
	l.err = err
	l.mu.Unlock()
}

// start binds the group first (it loads nfnetlink_log, without which nf_log refuses the
// backend, and fails early when the group is taken), then sets the settings.
func (l *invalidLog) start() error {
	sock, err := l.open(l.bufBytes)
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped {
		sock.Close()
		return errors.New("stopped")
	}
	if l.saved == nil {
		saved, err := l.setLocked()
		if err != nil {
			sock.Close()
			return err
		}
		l.saved = saved
		l.logger.Info("conntrack's INVALID log is read from NFLOG group 0; the settings are put back on exit",
			"previous", fmt.Sprint(saved))
	}
	l.sock, l.seqKnown, l.err = sock, false, nil
	now := l.now()
	l.boundSince = now
	l.bound.listen(now)
	return nil
}

// setLocked saves and sets each setting; on a failure it puts back those already set. The
// values to put back are saved in the state file before any setting changes: those a previous
// exporter left there when it did not end cleanly (it had changed the settings, and they still
// have its values), else the ones found now. Found at this exporter's values with no state
// file, a setting's own value is lost: it is put back to the one that logs nothing.
func (l *invalidLog) setLocked() ([]savedSetting, error) {
	current := make([]string, len(invalidLogSettings))
	for i, s := range invalidLogSettings {
		path := l.settingPath(s.path)
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, settingError(path, err)
		}
		current[i] = strings.TrimSpace(string(b))
	}
	kept, err := l.state.load()
	if err != nil {
		return nil, err
	}
	originals := make(map[string]string, len(invalidLogSettings))
	var fromState, lost []string
	for i, s := range invalidLogSettings {
		v, ok := kept[s.path]
		switch {
		case current[i] != s.value:
			// Not ours (changed since, if a state file says otherwise): the node's.
			originals[s.path] = current[i]
		case ok:
			originals[s.path] = v
			fromState = append(fromState, s.path)
		default:
			originals[s.path] = s.quiet
			lost = append(lost, s.path)
		}
	}
	if len(fromState) > 0 {
		l.logger.Warn("an earlier exporter did not put conntrack's INVALID log settings back; the values it saved will be",
			"settings", strings.Join(fromState, ","), "state", l.state.path())
	}
	if len(lost) > 0 {
		l.logger.Warn("conntrack's INVALID log settings already have the exporter's values and no saved ones: they will be put back to log nothing",
			"settings", strings.Join(lost, ","), "state_dir", l.state.dir)
	}
	if err := l.state.save(originals); err != nil {
		return nil, err
	}
	var saved []savedSetting
	for _, s := range invalidLogSettings {
		path := l.settingPath(s.path)
		if err := os.WriteFile(path, []byte(s.value), 0); err != nil {
			err = settingError(path, err)
			if restoreErr := l.restoreLocked(saved); restoreErr != nil {
				err = errors.Join(err, restoreErr)
			}
			return nil, err
		}
		saved = append(saved, savedSetting{path, originals[s.path]})
	}
	// The ones not set yet need no putting back, and the state file holds all three: put
	// back, it is removed; otherwise the next start finds it.
	return saved, nil
}

// settingPath is where a setting (its path under procfs) is read and written.
func (l *invalidLog) settingPath(procfsPath string) string {
	rel, err := filepath.Rel(sysctl.NetfilterDir, procfsPath)
	if err != nil {
		panic(fmt.Sprintf("conntrack INVALID log setting %s is not under %s", procfsPath, sysctl.NetfilterDir))
	}
	return filepath.Join(l.netfilterDir, rel)
}

// settingError says what to do about a setting that cannot be read or written.
func settingError(path string, err error) error {
	switch {
	case errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("set %s: %w (is nf_conntrack loaded?)", path, err)
	case errors.Is(err, syscall.EROFS):
		// Container runtimes mount /proc/sys read-only.
		return fmt.Errorf("set %s: %w (in a container /proc/sys is read-only: mount the host's /proc/sys/net/netfilter writable and point --conntrack.invalid-reasons.netfilter-dir at it)", path, err)
	}
	return fmt.Errorf("set %s: %w", path, err)
}

// restoreLocked puts saved back and, when all of it is back, removes the state file: with it
// gone, the next start takes the settings as it finds them.
func (l *invalidLog) restoreLocked(saved []savedSetting) error {
	if err := restoreSettings(saved); err != nil {
		return err
	}
	return l.state.remove()
}

// restoreSettings writes the saved values back, last set first.
func restoreSettings(saved []savedSetting) error {
	var errs []error
	for i := len(saved) - 1; i >= 0; i-- {
		if err := os.WriteFile(saved[i].path, []byte(saved[i].value), 0); err != nil {
			errs = append(errs, fmt.Errorf("put back %s=%q: %w", saved[i].path, saved[i].value, err))
		}
	}
	return errors.Join(errs...)
}

// restore puts the settings back and closes the socket, once; nothing is set after it. The
// settings go first, so the kernel stops logging before the reader goes.
func (l *invalidLog) restore() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped {
		return
	}
	l.stopped = true
	if l.saved != nil {
		if err := l.restoreLocked(l.saved); err != nil {
			l.logger.Error("cannot put conntrack's INVALID log settings back", "err", err)
		} else {
			l.logger.Info("conntrack's INVALID log settings put back", "settings", fmt.Sprint(l.saved))
		}
		l.saved = nil
	}
	if l.sock != nil {
		l.sock.Close()
	}
	l.unboundLocked()
}

// unboundLocked adds the time since the group was bound to the time listened.
func (l *invalidLog) unboundLocked() {
	if !l.boundSince.IsZero() {
		l.listened += l.now().Sub(l.boundSince)
		l.boundSince = time.Time{}
	}
}

func (s savedSetting) String() string {
	return filepath.Base(filepath.Dir(s.path)) + "/" + filepath.Base(s.path) + "=" + s.value
}

// consume reads the socket until it fails or ctx is done, and closes it: the group stays
// bound to a socket until it is closed, and the next bind would fail with EPERM, as if another
// process read the group.
func (l *invalidLog) consume(ctx context.Context) error {
	l.mu.Lock()
	sock := l.sock
	l.mu.Unlock()
	stop := context.AfterFunc(ctx, func() { sock.Close() })
	defer stop()
	err := l.consumeFrom(sock)
	l.mu.Lock()
	if l.sock == sock {
		l.sock = nil
		l.unboundLocked()
	}
	if errors.Is(err, errInvalidFlood) && !l.bound.sampledBefore {
		l.bound.sampledBefore = true
		l.logger.Warn("conntrack's INVALID log runs above --conntrack.invalid-reasons.max-rate: it is read in windows from now on, and its counts are a sample (proxyhealth_conntrack_invalid_log_listened_seconds_total)",
			"max_rate", l.bound.maxRate)
	}
	l.mu.Unlock()
	if closeErr := sock.Close(); closeErr != nil {
		l.logger.Debug("closing the NFLOG socket after a receive error", "err", closeErr)
	}
	return err
}

// consumeFrom counts each packet of sock's messages until sock fails.
func (l *invalidLog) consumeFrom(sock eventSource) error {
	var (
		p  loggedPacket
		tp tuple
	)
	return sock.receiveBatches(func(msg []byte) error {
		var admitted bool
		if err := decodeLogMessage(msg, &p); err != nil {
			l.mu.Lock()
			if !errors.Is(err, errNotLogPacket) {
				l.lost++
			}
			admitted = l.bound.admit(l.now())
			l.mu.Unlock()
		} else if r, ok := invalidLogReason(p.prefix); !ok {
			admitted = l.countForeign(&p)
		} else {
			var svc Service
			if err := decodePacketTuple(p.payload, &tp); err == nil {
				svc = l.view().invalidPacketService(&tp)
			}
			admitted = l.count(&p, invalidKey{r, svc.Namespace, svc.Name})
		}
		if !admitted {
			return errInvalidFlood
		}
		return nil
	})
}

// count counts a packet of k, and reports whether the reader may read on (admit).
func (l *invalidLog) count(p *loggedPacket, k invalidKey) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.followSeqLocked(p)
	switch s, listed := l.counts[k]; {
	case listed:
		s.count++
	case k.name == "" && k.namespace == "" || len(l.counts) < l.maxSeries:
		// Packets of no Service carry no service labels: one series per reason, outside the cap.
		l.counts[k] = &prunedSeries{count: 1}
	default:
		l.unlisted[k.reason]++
	}
	return l.bound.admit(l.now())
}

// countForeign counts a message of the group that is not conntrack's INVALID log, and reports
// whether the reader may read on (admit): such messages cost the reader as much.
func (l *invalidLog) countForeign(p *loggedPacket) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.followSeqLocked(p)
	l.foreign++
	return l.bound.admit(l.now())
}

// followSeqLocked follows the group's sequence numbers: the kernel numbers the messages it
// sends to the group, whoever logged them, and a gap is messages dropped for our socket (its
// buffer was full) or lost before that.
func (l *invalidLog) followSeqLocked(p *loggedPacket) {
	if !p.hasSeq {
		return
	}
	if l.seqKnown && p.seq != l.nextSeq {
		if gap := p.seq - l.nextSeq; gap < 1<<31 {
			l.lost += uint64(gap)
		}
	}
	l.nextSeq, l.seqKnown = p.seq+1, true
}

// invalidSnapshot is what a scrape reads.
type invalidSnapshot struct {
	counts   map[invalidKey]uint64
	unlisted [invalidReasonCount]uint64
	lost     uint64
	foreign  uint64
	err      error
	// listened is the time the group has been bound since the reader started; sampling is
	// whether the reader is reading in windows now (the rate is above the bound).
	listened  time.Duration
	sampling  bool
	listening bool // the group is bound now
}

// snapshot copies the counts, first dropping the series of Services gone for a while (prune).
func (l *invalidLog) snapshot() invalidSnapshot {
	l.prune()
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	listened := l.listened
	if !l.boundSince.IsZero() {
		listened += now.Sub(l.boundSince)
		if l.bound.sampling && !now.Before(l.bound.windowEnd()) {
			// A sampled window that ended quiet, with no packet since to tell admit so.
			l.bound.windowEnded(now)
		}
	}
	s := invalidSnapshot{counts: make(map[invalidKey]uint64, len(l.counts)), unlisted: l.unlisted, lost: l.lost, foreign: l.foreign, err: l.err,
		listened: listened, sampling: l.bound.sampling, listening: !l.boundSince.IsZero()}
	for k, v := range l.counts {
		s.counts[k] = v.count
	}
	return s
}

// prune drops the series of Services gone from the view for a while (pruneServiceSeries).
func (l *invalidLog) prune() {
	pruneServiceSeries(&l.mu, &l.lastPass, l.now(), l.view, l.counts, func(k invalidKey) serviceName {
		return serviceName{k.namespace, k.name}
	})
}
