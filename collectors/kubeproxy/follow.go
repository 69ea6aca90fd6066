package kubeproxy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"
)

// fileID identifies a file across renames: rotation by rename keeps it, a new file gets another.
type fileID struct{ dev, ino uint64 }

func idOf(fi os.FileInfo) (fileID, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fileID{}, false
	}
	return fileID{dev: uint64(st.Dev), ino: st.Ino}, true //nolint:unconvert // Dev is not uint64 everywhere
}

// followedFile is one open log file and where reading it stopped.
type followedFile struct {
	path   string
	f      *os.File
	id     fileID
	offset int64
	// carry holds the start of a line whose end has not been read yet (at most maxLine bytes);
	// skipping is set while the rest of an over-long line is being discarded.
	carry    []byte
	skipping bool
	// cri holds the joined messages of CRI partial (P) records waiting for their final (F) one.
	cri        []byte
	criTS      []byte
	criSkipped bool
	// syncErrs joins the lines of kube-proxy's failed-sync errors.
	syncErrs syncErrorReader
	// head is the file's first bytes (up to fingerprintBytes) as they were first read: when
	// the file's first bytes differ from it, the file was truncated and written again.
	head []byte
}

// fingerprintBytes is how much of a file's start tells one content of it from the next. Log
// lines start with a time to the microsecond or finer, so a file truncated and written again
// starts with other bytes.
const fingerprintBytes = 256

// followStats is what the follower has counted; the collector publishes a copy.
type followStats struct {
	lines     uint64
	skipped   uint64
	errors    [numResources][numVerbs]uint64
	lastError time.Time
	files     []string // followed now, sorted
	err       error    // files that match but cannot be read
	// syncErrors counts the failed syncs kube-proxy logged; lastSyncError is the last one.
	syncErrors    uint64
	lastSyncError syncError
}

// follower reads kube-proxy's log files as they grow. It is not safe for concurrent use: one
// goroutine calls poll, and the collector reads the stats it publishes.
//
// It never counts a line twice and never counts lines older than itself: files that exist when
// it starts are read from their end (so a restarted exporter starts at the end again); files
// that appear later (a rotation's new file, a new kube-proxy pod) are read from their start.
// Files are told apart by device and inode: a file renamed away (rotation) is read to its end
// and closed. A file truncated in place (copytruncate) is read again from its start: it is
// told by its size dropping below what was read, or, when it has grown past that again before
// the next poll, by its first bytes no longer being those first read from it (its
// fingerprint). Memory is bounded: one shared read buffer, and per file a fingerprint of
// fingerprintBytes and at most maxLine bytes of an unfinished line and of joined CRI partial
// records. Longer lines are skipped and counted.
type follower struct {
	patterns    []string
	maxLine     int
	rescanEvery time.Duration
	logger      *slog.Logger
	now         func() time.Time

	files    map[fileID]*followedFile
	buf      []byte
	started  bool
	lastScan time.Time
	openErrs map[string]error
	noneLogged,
	foundLogged bool

	stats followStats
	// publish is called after each poll with the current stats (the slices are not reused).
	publish func(followStats)
}

const readBufferSize = 64 << 10

func newFollower(patterns []string, maxLine int, rescanEvery time.Duration, logger *slog.Logger) *follower {
	return &follower{
		patterns:    patterns,
		maxLine:     maxLine,
		rescanEvery: rescanEvery,
		logger:      logger,
		now:         time.Now,
		files:       make(map[fileID]*followedFile),
		buf:         make([]byte, readBufferSize),
		openErrs:    make(map[string]error),
	}
}

// poll reads what has been written since the last poll. It re-globs the patterns every
// rescanEvery, and at once when a followed path has been renamed, removed or replaced.
func (fl *follower) poll() {
	now := fl.now()
	rescan := !fl.started || now.Sub(fl.lastScan) >= fl.rescanEvery
	if rescan {
		clear(fl.openErrs) // what still fails fails again below
	}
	for _, ff := range fl.sorted() {
		fl.read(ff)
		if !rescan && fl.replaced(ff) {
			rescan = true
			clear(fl.openErrs)
		}
	}
	if rescan {
		fl.scan(!fl.started)
		fl.lastScan = now
		fl.started = true
		for _, ff := range fl.sorted() {
			fl.read(ff) // files found by this scan (the others were just read: a no-op)
		}
	}
	fl.stats.files = fl.stats.files[:0:0]
	for _, ff := range fl.files {
		fl.stats.files = append(fl.stats.files, ff.path)
	}
	sort.Strings(fl.stats.files)
	fl.stats.err = fl.openError()
	if fl.publish != nil {
		fl.publish(fl.stats)
	}
}

// sorted returns the followed files in path order, so that reading is deterministic.
func (fl *follower) sorted() []*followedFile {
	out := make([]*followedFile, 0, len(fl.files))
	for _, ff := range fl.files {
		out = append(out, ff)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].path < out[j].path })
	return out
}

// replaced tells whether ff's path no longer names ff's file.
func (fl *follower) replaced(ff *followedFile) bool {
	fi, err := os.Stat(ff.path)
	if err != nil {
		return true
	}
	id, ok := idOf(fi)
	return !ok || id != ff.id
}

// scan globs the patterns: new files are opened (at their end when atEnd), files no pattern
// matches any more (renamed away by rotation, removed) are read to their end and closed.
func (fl *follower) scan(atEnd bool) {
	matched := make(map[fileID]bool)
	for _, path := range fl.glob() {
		fi, err := os.Stat(path)
		if err != nil || !fi.Mode().IsRegular() {
			continue
		}
		id, ok := idOf(fi)
		if !ok || matched[id] {
			continue
		}
		matched[id] = true
		if ff, ok := fl.files[id]; ok {
			ff.path = path // renamed to another matching name: same file, same offset
			continue
		}
		fl.open(path, id, atEnd)
	}
	for id, ff := range fl.files {
		if !matched[id] {
			fl.read(ff) // what was written before the rename
			ff.f.Close()
			delete(fl.files, id)
			fl.logger.Debug("stopped following kube-proxy log", "path", ff.path)
		}
	}
	fl.noteFiles()
}

func (fl *follower) glob() []string {
	seen := make(map[string]bool)
	var paths []string
	for _, pattern := range fl.patterns {
		matches, err := filepath.Glob(pattern)
		if err != nil { // a bad pattern: flag validation rejects these
			continue
		}
		if len(matches) == 0 {
			// Glob hides unreadable directories; an unreadable log directory is a failure,
			// not "no kube-proxy here".
			if dir := staticDir(pattern); dir != "" {
				if _, err := os.ReadDir(dir); errors.Is(err, fs.ErrPermission) {
					fl.openErrs[dir] = fmt.Errorf("read kube-proxy log directory %s: %w", dir, err)
				} else {
					delete(fl.openErrs, dir)
				}
			}
		}
		for _, m := range matches {
			if !seen[m] {
				seen[m] = true
				paths = append(paths, m)
			}
		}
	}
	sort.Strings(paths)
	return paths
}

// staticDir is the deepest directory of pattern without glob characters.
func staticDir(pattern string) string {
	dir := filepath.Dir(pattern)
	for strings.ContainsAny(dir, `*?[\`) {
		next := filepath.Dir(dir)
		if next == dir {
			return ""
		}
		dir = next
	}
	return dir
}

func (fl *follower) open(path string, id fileID, atEnd bool) {
	f, err := os.Open(path)
	if err != nil {
		fl.openErrs[path] = fmt.Errorf("open kube-proxy log %s: %w", path, err)
		return
	}
	delete(fl.openErrs, path)
	// Identify what was opened, not what was stat'ed: the path may have been replaced between.
	fi, err := f.Stat()
	if err == nil {
		if got, ok := idOf(fi); ok {
			id = got
		}
	}
	if _, dup := fl.files[id]; dup {
		f.Close()
		return
	}
	ff := &followedFile{path: path, f: f, id: id, head: make([]byte, 0, fingerprintBytes)}
	ff.syncErrs.emit = fl.syncError
	if atEnd {
		end, err := f.Seek(0, io.SeekEnd)
		if err != nil {
			f.Close()
			fl.openErrs[path] = fmt.Errorf("seek to the end of kube-proxy log %s: %w", path, err)
			return
		}
		ff.offset = end
		// The lines before the end are not read, but the fingerprint is taken now.
		n, _ := f.ReadAt(ff.head[:min(end, fingerprintBytes)], 0)
		ff.head = ff.head[:n]
	}
	fl.files[id] = ff
	fl.logger.Debug("following kube-proxy log", "path", path, "offset", ff.offset)
}

// noteFiles logs once when no log file is found and once when files are found again.
func (fl *follower) noteFiles() {
	switch {
	case len(fl.files) == 0 && !fl.noneLogged && len(fl.openErrs) == 0:
		fl.logger.Info("no kube-proxy log file found: reflector errors are not counted until one appears (see --kubeproxy.log-path; in a container, mount the host's /var/log)", "patterns", strings.Join(fl.patterns, ","))
		fl.noneLogged, fl.foundLogged = true, false
	case len(fl.files) > 0 && !fl.foundLogged:
		paths := make([]string, 0, len(fl.files))
		for _, ff := range fl.files {
			paths = append(paths, ff.path)
		}
		sort.Strings(paths)
		fl.logger.Info("following kube-proxy log files", "paths", strings.Join(paths, ","))
		fl.foundLogged, fl.noneLogged = true, false
	}
}

func (fl *follower) openError() error {
	if len(fl.openErrs) == 0 {
		return nil
	}
	keys := make([]string, 0, len(fl.openErrs))
	for k := range fl.openErrs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	errs := make([]error, 0, len(keys))
	for _, k := range keys {
		errs = append(errs, fl.openErrs[k])
	}
	return fmt.Errorf("%w (the exporter needs read access to kube-proxy's log: run as root, or grant CAP_DAC_READ_SEARCH)", errors.Join(errs...))
}

// read reads ff from its offset to its current end.
func (fl *follower) read(ff *followedFile) {
	if fi, err := ff.f.Stat(); err == nil {
		// Truncated in place (copytruncate): what is there now was written after the
		// truncation, and is read from the start.
		switch {
		case fi.Size() < ff.offset:
			fl.logger.Debug("kube-proxy log truncated, reading it from the start", "path", ff.path)
			ff.restart()
		case !fl.sameHead(ff):
			fl.logger.Debug("kube-proxy log truncated and written past the old offset (its first bytes changed), reading it from the start", "path", ff.path)
			ff.restart()
		}
	}
	for {
		n, err := ff.f.ReadAt(fl.buf, ff.offset)
		if n > 0 {
			if ff.offset < fingerprintBytes && int64(len(ff.head)) == ff.offset {
				ff.head = append(ff.head, fl.buf[:min(n, fingerprintBytes-len(ff.head))]...)
			}
			ff.offset += int64(n)
			fl.consume(ff, fl.buf[:n])
		}
		if err != nil || n < len(fl.buf) {
			if err != nil && !errors.Is(err, io.EOF) {
				fl.openErrs[ff.path] = fmt.Errorf("read kube-proxy log %s: %w", ff.path, err)
			}
			return
		}
	}
}

// sameHead tells whether ff's first bytes are still its fingerprint. A file truncated and
// written again by a writer without O_APPEND starts with a hole of zeros up to where the
// writer was, which is not before where reading stopped: that file is read on from the old
// offset, as it was, with the zeros as its new fingerprint.
func (fl *follower) sameHead(ff *followedFile) bool {
	if len(ff.head) == 0 {
		return true
	}
	now := fl.buf[:len(ff.head)]
	if n, _ := ff.f.ReadAt(now, 0); n < len(now) {
		return false // it shrank since its size was taken
	}
	if bytes.Equal(now, ff.head) {
		return true
	}
	if bytes.Count(now, []byte{0}) == len(now) {
		ff.head = append(ff.head[:0], now...)
		return true
	}
	return false
}

// restart makes ff read from its start, as a new file.
func (ff *followedFile) restart() {
	ff.offset = 0
	ff.head = ff.head[:0]
	ff.carry, ff.skipping = ff.carry[:0], false
	ff.cri, ff.criTS, ff.criSkipped = ff.cri[:0], ff.criTS[:0], false
}

// consume splits data into lines, keeping an unfinished last line for the next read.
func (fl *follower) consume(ff *followedFile, data []byte) {
	for len(data) > 0 {
		nl := bytes.IndexByte(data, '\n')
		if nl < 0 {
			switch {
			case ff.skipping:
			case len(ff.carry)+len(data) > fl.maxLine:
				ff.carry, ff.skipping = ff.carry[:0], true
			default:
				ff.carry = append(ff.carry, data...)
			}
			return
		}
		chunk := data[:nl]
		data = data[nl+1:]
		switch {
		case ff.skipping:
			ff.skipping = false
			fl.stats.lines++
			fl.stats.skipped++
		case len(ff.carry) > 0:
			if len(ff.carry)+len(chunk) > fl.maxLine {
				fl.stats.lines++
				fl.stats.skipped++
			} else {
				ff.carry = append(ff.carry, chunk...)
				fl.line(ff, ff.carry)
			}
			ff.carry = ff.carry[:0]
		case len(chunk) > fl.maxLine:
			fl.stats.lines++
			fl.stats.skipped++
		default:
			fl.line(ff, chunk)
		}
	}
}

// line handles one complete line.
func (fl *follower) line(ff *followedFile, line []byte) {
	fl.stats.lines++
	line = bytes.TrimSuffix(line, []byte{'\r'})
	ts, msg, partial, isCRI := splitCRI(line)
	if !isCRI {
		fl.message(ff, line, nil)
		return
	}
	if partial {
		switch {
		case ff.criSkipped:
		case len(ff.cri)+len(msg) > fl.maxLine:
			ff.cri, ff.criSkipped = ff.cri[:0], true
		default:
			if len(ff.cri) == 0 {
				ff.criTS = append(ff.criTS[:0], ts...)
			}
			ff.cri = append(ff.cri, msg...)
		}
		return
	}
	switch {
	case ff.criSkipped:
		ff.criSkipped = false
		fl.stats.skipped++
	case len(ff.cri) > 0:
		if len(ff.cri)+len(msg) > fl.maxLine {
			fl.stats.skipped++
		} else {
			ff.cri = append(ff.cri, msg...)
			fl.message(ff, ff.cri, ff.criTS)
		}
	default:
		fl.message(ff, msg, ts)
	}
	ff.cri, ff.criTS = ff.cri[:0], ff.criTS[:0]
}

// message counts one complete kube-proxy log message of ff; criTS is the CRI record's time, if
// any.
func (fl *follower) message(ff *followedFile, msg, criTS []byte) {
	now := fl.now()
	ff.syncErrs.feed(msg, criTS, now)
	ev, ok := parseMessage(msg, now)
	if !ok {
		return
	}
	if len(criTS) > 0 {
		if t := parseCRITime(criTS); !t.IsZero() {
			ev.ts = t
		}
	}
	if ev.ts.IsZero() {
		ev.ts = now
	}
	fl.stats.errors[ev.resource][ev.verb]++
	if ev.ts.After(fl.stats.lastError) {
		fl.stats.lastError = ev.ts
	}
}

// syncError counts one failed sync read from the log.
func (fl *follower) syncError(se syncError) {
	if se.at.IsZero() {
		se.at = fl.now()
	}
	fl.stats.syncErrors++
	if !se.at.Before(fl.stats.lastSyncError.at) {
		fl.stats.lastSyncError = se
	}
}

// close closes every followed file.
func (fl *follower) close() {
	for id, ff := range fl.files {
		ff.f.Close()
		delete(fl.files, id)
	}
}
