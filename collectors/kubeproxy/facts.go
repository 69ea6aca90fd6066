package kubeproxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"time"
)

// ListErrors counts kube-proxy's reflector failures of one resource and verb.
type ListErrors struct {
	Resource string // services, endpoints, endpointslices, nodes, servicecidrs, other
	Verb     string // list or watch
	Count    uint64
}

// Status is what the collector last learned of kube-proxy: its last poll and what its log
// follower has counted (since the exporter started).
type Status struct {
	// Polled is false until kube-proxy's endpoints were asked once; At is when.
	Polled bool
	At     time.Time
	// Up: its metrics endpoint answered; UpReason says why not.
	Up       bool
	UpReason string
	// HealthChecked: a health URL is configured and was asked; Healthy is its answer.
	HealthChecked bool
	Healthy       bool
	// LastSync is its last applied sync (the oldest IP family's), zero when unknown;
	// PendingSince is its oldest queued change not yet applied, zero when none.
	LastSync     time.Time
	PendingSince time.Time
	// Version is the version kube-proxy reported at the last poll it answered ("" for none).
	Version string

	// LogsRead: the follower has looked for the log files once.
	LogsRead bool
	LogFiles []string
	LogErr   error
	// ListErrors are the failures counted, every resource and verb with at least one.
	ListErrors    []ListErrors
	LastListError time.Time

	// SyncFailures is kube-proxy's own count of rule syncs it failed to apply since it
	// started (iptables-restore in iptables and IPVS mode, nftables transactions in nftables
	// mode, all IP families); SyncTool names the tool of those failures ("iptables-restore"
	// or "nft", "" while there are none). 0 while it does not answer.
	SyncFailures uint64
	SyncTool     string
	// SyncFailing says its syncs are failing now: failures counted with no sync applied
	// since the first of them. FailingSyncs are those failures, FailingSince when the first
	// was seen, or kube-proxy's start when it has applied no sync since (SyncNeverApplied).
	SyncFailing      bool
	FailingSyncs     uint64
	FailingSince     time.Time
	SyncNeverApplied bool
	// FailingFamilies names the IP families whose syncs are failing while another family's
	// are not (a dual-stack kube-proxy runs one proxier per family); nil when all fail.
	FailingFamilies []string
	// Started is kube-proxy's start (its process_start_time_seconds); zero when unknown.
	Started time.Time
	// SyncErrors are the failed syncs its log reported since the follower started, and
	// LastSyncError the last one (zero when none).
	SyncErrors    uint64
	LastSyncError SyncError
}

// SyncError is a failed sync as kube-proxy logged it.
type SyncError struct {
	At   time.Time
	Tool string // "iptables-restore" or "nft"
	// Text is the tool's error on one line, sanitised and at most 512 bytes.
	Text string
}

// Status returns the last poll's and the follower's results; it waits on nothing.
func (c *Collector) Status() Status {
	c.mu.Lock()
	logs, logsRead, res, version := c.logs, c.logsRead, c.probe, c.version
	failingRuns, failing := c.failures.failing()
	failingFamilies := c.failures.failingFamilies()
	c.mu.Unlock()
	s := Status{
		Version:       version,
		LogsRead:      logsRead,
		LogFiles:      slices.Clone(logs.files),
		LogErr:        logs.err,
		ListErrors:    listErrors(&logs.errors),
		LastListError: logs.lastError,
		SyncErrors:    logs.syncErrors,
		LastSyncError: SyncError{At: logs.lastSyncError.at, Tool: logs.lastSyncError.tool, Text: logs.lastSyncError.text},
	}
	if res != nil {
		s.Polled, s.At = true, res.at
		s.Up, s.UpReason = res.up, res.upReason
		s.HealthChecked, s.Healthy = c.cfg.HealthURL != "", res.healthy
		if res.up && res.hasLastSync {
			s.LastSync = res.lastSync
		}
		if res.up {
			s.PendingSince = res.pendingSince
			s.SyncFailures = uint64(res.restoreFailures)
			s.SyncTool = res.syncTool()
			s.Started = res.started
			s.SyncFailing, s.FailingSyncs, s.FailingSince, s.SyncNeverApplied = failing, failingRuns.failures, failingRuns.since, failingRuns.neverApplied
			s.FailingFamilies = failingFamilies
		}
	}
	return s
}

// Poll asks kube-proxy's endpoints once now (as the background poller does) and publishes
// the answer, for a one-shot reader that does not Run the collector.
func (c *Collector) Poll(ctx context.Context) { c.pollOnce(ctx) }

func listErrors(counts *[numResources][numVerbs]uint64) []ListErrors {
	var out []ListErrors
	for r := range numResources {
		for v := range numVerbs {
			if n := counts[r][v]; n > 0 {
				out = append(out, ListErrors{Resource: resourceNames[r], Verb: verbNames[v], Count: n})
			}
		}
	}
	return out
}

// LogScan is what a one-shot read of the end of kube-proxy's log found.
type LogScan struct {
	// Files are the log files read.
	Files []string
	// Err is why some of them could not be read.
	Err error
	// ListErrors are the failures logged since the scan's start time (lines without a
	// readable time count too), and LastListError the last one's time.
	ListErrors    []ListErrors
	LastListError time.Time
	// SyncErrors are the failed syncs logged since the scan's start time, and LastSyncError
	// the last one.
	SyncErrors    uint64
	LastSyncError SyncError
}

// ScanLog reads the last maxBytes of each log file (--kubeproxy.log-path) once and counts the
// reflector failures logged at or after since: what a one-shot diagnosis needs, where the
// follower only counts lines written after it started.
func (c *Collector) ScanLog(since time.Time, maxBytes int64) LogScan {
	var scan LogScan
	var counts [numResources][numVerbs]uint64
	var errs []error
	seen := map[string]bool{}
	var paths []string
	for _, pattern := range c.cfg.LogPaths {
		matches, _ := filepath.Glob(pattern)
		for _, m := range matches {
			if !seen[m] {
				seen[m] = true
				paths = append(paths, m)
			}
		}
	}
	sort.Strings(paths)
	now := c.now()
	for _, path := range paths {
		f, err := os.Open(path)
		if err != nil {
			errs = append(errs, fmt.Errorf("open kube-proxy log %s: %w", path, err))
			continue
		}
		syncErrs := syncErrorReader{emit: func(se syncError) {
			if !se.at.IsZero() && se.at.Before(since) {
				return
			}
			scan.SyncErrors++
			if !se.at.Before(scan.LastSyncError.At) {
				scan.LastSyncError = SyncError{At: se.at, Tool: se.tool, Text: se.text}
			}
		}}
		err = scanTail(f, maxBytes, func(line []byte) {
			if ts, msg, _, ok := splitCRI(line); ok {
				syncErrs.feed(msg, ts, now)
			} else {
				syncErrs.feed(line, nil, now)
			}
			ev, ok := parseLine(line, now)
			if !ok || (!ev.ts.IsZero() && ev.ts.Before(since)) {
				return
			}
			counts[ev.resource][ev.verb]++
			if ev.ts.After(scan.LastListError) {
				scan.LastListError = ev.ts
			}
		})
		syncErrs.flush()
		f.Close()
		if err != nil {
			errs = append(errs, fmt.Errorf("read kube-proxy log %s: %w", path, err))
			continue
		}
		scan.Files = append(scan.Files, path)
	}
	scan.ListErrors = listErrors(&counts)
	scan.Err = errors.Join(errs...)
	return scan
}

// scanTail calls fn with each complete line of the last maxBytes of f.
func scanTail(f *os.File, maxBytes int64, fn func([]byte)) error {
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	start := max(0, fi.Size()-maxBytes)
	if _, err := f.Seek(start, io.SeekStart); err != nil {
		return err
	}
	r := bufio.NewReaderSize(io.LimitReader(f, fi.Size()-start), 64<<10)
	first := start > 0 // the first line is cut: skip it
	for {
		line, err := r.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			// A line longer than the buffer: skip the rest of it.
			for errors.Is(err, bufio.ErrBufferFull) {
				_, err = r.ReadSlice('\n')
			}
			first = false
			if err != nil {
				break
			}
			continue
		}
		if len(line) > 0 && !first && (err == nil) {
			fn(bytes.TrimSuffix(bytes.TrimSuffix(line, []byte{'\n'}), []byte{'\r'}))
		}
		first = false
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
	return nil
}
