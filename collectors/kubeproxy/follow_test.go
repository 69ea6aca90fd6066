package kubeproxy

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/promslog"
)

const (
	errLine  = `I1121 21:00:47.996819   10834 reflector.go:664] "Warning: watch ended with error" reflector="k8s.io/client-go@v0.36.3/tools/cache/reflector.go:343" type="*v1.Service" err="an error on the server (\"unable to decode an event from the watch stream: http2: client connection lost\") has prevented the request from succeeding"` + "\n"
	infoLine = `I1121 21:00:48.000000   10834 proxier.go:805] "Syncing iptables rules" ipFamily="IPv4"` + "\n"
)

// testFollower follows pattern with a clock the test moves.
type testFollower struct {
	*follower
	t     *testing.T
	clock time.Time
	last  followStats
}

func newTestFollower(t *testing.T, maxLine int, patterns ...string) *testFollower {
	t.Helper()
	tf := &testFollower{t: t, clock: testNow}
	tf.follower = newFollower(patterns, maxLine, 10*time.Second, promslog.NewNopLogger())
	tf.follower.now = func() time.Time { return tf.clock }
	tf.follower.publish = func(s followStats) { tf.last = s }
	t.Cleanup(tf.close)
	return tf
}

// poll polls once, advance later on the clock.
func (tf *testFollower) poll(advance time.Duration) followStats {
	tf.clock = tf.clock.Add(advance)
	tf.follower.poll()
	return tf.last
}

func (tf *testFollower) expect(s followStats, lines, serviceWatches uint64, files int) {
	tf.t.Helper()
	if s.lines != lines || s.errors[resServices][verbWatch] != serviceWatches || len(s.files) != files || s.err != nil {
		tf.t.Fatalf("got %d lines, %d service watch errors, files %v, err %v; want %d, %d, %d files",
			s.lines, s.errors[resServices][verbWatch], s.files, s.err, lines, serviceWatches, files)
	}
}

func appendFile(t *testing.T, path string, lines ...string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(strings.Join(lines, "")); err != nil {
		t.Fatal(err)
	}
}

func TestFollowStartsAtEndAndAgainAfterRestart(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "0.log")
	appendFile(t, log, errLine, errLine, infoLine) // before the exporter started: never counted
	tf := newTestFollower(t, 4096, filepath.Join(dir, "*.log"))
	tf.expect(tf.poll(0), 0, 0, 1)
	appendFile(t, log, errLine, infoLine)
	tf.expect(tf.poll(time.Second), 2, 1, 1)
	tf.expect(tf.poll(time.Second), 2, 1, 1)

	// A restarted exporter starts at the end again.
	restarted := newTestFollower(t, 4096, filepath.Join(dir, "*.log"))
	restarted.expect(restarted.poll(0), 0, 0, 1)
	appendFile(t, log, errLine)
	restarted.expect(restarted.poll(time.Second), 1, 1, 1)
	tf.expect(tf.poll(time.Second), 3, 2, 1)
}

func TestFollowRotationByRename(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "0.log")
	appendFile(t, log, infoLine)
	tf := newTestFollower(t, 4096, filepath.Join(dir, "*.log"))
	tf.expect(tf.poll(0), 0, 0, 1)
	appendFile(t, log, errLine, errLine)
	tf.expect(tf.poll(time.Second), 2, 2, 1)

	// The kubelet renames 0.log to 0.log.<date>; kube-proxy's runtime writes a last line to the
	// old file before it reopens, then the new 0.log gets lines.
	appendFile(t, log, errLine)
	rotated := log + ".20261121-210048"
	if err := os.Rename(log, rotated); err != nil {
		t.Fatal(err)
	}
	appendFile(t, rotated, errLine)
	appendFile(t, log, errLine, infoLine)
	tf.expect(tf.poll(time.Second), 6, 5, 1) // rotation is noticed at once, not at the next rescan
	tf.expect(tf.poll(time.Second), 6, 5, 1)
	appendFile(t, log, errLine)
	tf.expect(tf.poll(time.Second), 7, 6, 1)

	// A rename to a name the pattern still matches is the same file: nothing is read twice.
	if err := os.Rename(log, filepath.Join(dir, "1.log")); err != nil {
		t.Fatal(err)
	}
	tf.expect(tf.poll(time.Second), 7, 6, 1)
	appendFile(t, filepath.Join(dir, "1.log"), errLine)
	tf.expect(tf.poll(10*time.Second), 8, 7, 1)
}

func TestFollowTruncation(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "kube-proxy.log")
	appendFile(t, log, infoLine, infoLine, infoLine)
	tf := newTestFollower(t, 4096, log)
	tf.expect(tf.poll(0), 0, 0, 1)
	appendFile(t, log, errLine, errLine, errLine)
	tf.expect(tf.poll(time.Second), 3, 3, 1)

	// logrotate's copytruncate: the content is copied away and the file truncated in place.
	if err := os.Truncate(log, 0); err != nil {
		t.Fatal(err)
	}
	tf.expect(tf.poll(time.Second), 3, 3, 1)
	appendFile(t, log, errLine)
	tf.expect(tf.poll(time.Second), 4, 4, 1)
	tf.expect(tf.poll(time.Second), 4, 4, 1)

	// Truncated and written again before the next poll, to less than was read.
	appendFile(t, log, infoLine, infoLine)
	tf.expect(tf.poll(time.Second), 6, 4, 1)
	if err := os.Truncate(log, 0); err != nil {
		t.Fatal(err)
	}
	appendFile(t, log, errLine)
	tf.expect(tf.poll(time.Second), 7, 5, 1)
}

// copytruncate, and the file grows past where reading stopped before the next poll: its size
// alone cannot tell, its first bytes do. Every line written after the truncation is read.
func TestFollowTruncationRegrownWithinAPoll(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "kube-proxy.log")
	appendFile(t, log, infoLine)
	tf := newTestFollower(t, 4096, log)
	tf.expect(tf.poll(0), 0, 0, 1)
	var nine []string
	for range 9 {
		nine = append(nine, errLine)
	}
	appendFile(t, log, append(nine, infoLine)...)
	tf.expect(tf.poll(time.Second), 10, 9, 1)

	// logrotate's copytruncate, then kube-proxy writes 10 failures before the next poll: the
	// file ends past the old offset, inside the tenth line.
	if err := os.Truncate(log, 0); err != nil {
		t.Fatal(err)
	}
	appendFile(t, log, append(nine, errLine)...)
	if fi, err := os.Stat(log); err != nil || fi.Size() <= int64(2*len(infoLine)+9*len(errLine)) {
		t.Fatalf("the test needs the file past the old offset: %v, %v", fi, err)
	}
	tf.expect(tf.poll(time.Second), 20, 19, 1)
	appendFile(t, log, errLine)
	tf.expect(tf.poll(time.Second), 21, 20, 1)

	// Again, now that the fingerprint was taken from the rewritten file, with lines that start
	// alike: the new file's first bytes differ from the old one's only past the klog header.
	if err := os.Truncate(log, 0); err != nil {
		t.Fatal(err)
	}
	other := strings.Replace(errLine, "*v1.Service", "*v1.Node", 1)
	appendFile(t, log, append([]string{other}, append(nine, errLine, errLine)...)...)
	s := tf.poll(time.Second)
	tf.expect(s, 33, 31, 1)
	if s.errors[resNodes][verbWatch] != 1 {
		t.Errorf("%d node watch errors, want 1", s.errors[resNodes][verbWatch])
	}
}

// A file opened at its end (it existed when the exporter started) has its first bytes taken
// when opened: a copytruncate that regrows it past that end before the first poll is seen too.
func TestFollowTruncationRegrownBeforeFirstRead(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "kube-proxy.log")
	appendFile(t, log, infoLine, infoLine, infoLine)
	tf := newTestFollower(t, 4096, log)
	tf.expect(tf.poll(0), 0, 0, 1)
	if err := os.Truncate(log, 0); err != nil {
		t.Fatal(err)
	}
	appendFile(t, log, errLine, errLine)
	tf.expect(tf.poll(time.Second), 2, 2, 1)
}

// A file shorter than the fingerprint when first read: the fingerprint grows with it, and a
// copytruncate is still seen.
func TestFollowTruncationOfAShortFile(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "0.log")
	tf := newTestFollower(t, 4096, filepath.Join(dir, "*.log"))
	tf.expect(tf.poll(0), 0, 0, 0)
	appendFile(t, log, "a\n")
	tf.expect(tf.poll(10*time.Second), 1, 0, 1) // read from its start: a file that appeared later
	appendFile(t, log, infoLine)
	tf.expect(tf.poll(time.Second), 2, 0, 1)
	if err := os.Truncate(log, 0); err != nil {
		t.Fatal(err)
	}
	appendFile(t, log, errLine)
	tf.expect(tf.poll(time.Second), 3, 1, 1)
}

// A writer without O_APPEND goes on writing where it was after a copytruncate, leaving a hole of
// zeros before: the file is read on from where reading stopped, as before, so its next line is
// read whole and not joined to the zeros.
func TestFollowTruncationByAWriterWithoutAppend(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "kube-proxy.log")
	appendFile(t, log, infoLine)
	tf := newTestFollower(t, 4096, log)
	tf.expect(tf.poll(0), 0, 0, 1)
	appendFile(t, log, errLine, infoLine)
	tf.expect(tf.poll(time.Second), 2, 1, 1)
	f, err := os.OpenFile(log, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(0); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte(errLine+errLine), int64(2*len(infoLine)+len(errLine))); err != nil {
		t.Fatal(err)
	}
	tf.expect(tf.poll(time.Second), 4, 3, 1)
	if _, err := f.WriteAt([]byte(errLine), int64(2*len(infoLine)+3*len(errLine))); err != nil {
		t.Fatal(err)
	}
	tf.expect(tf.poll(time.Second), 5, 4, 1)
}

func TestFollowLateFileAndNoFile(t *testing.T) {
	dir := t.TempDir()
	pattern := filepath.Join(dir, "kube-system_kube-proxy-*", "kube-proxy", "*.log")
	tf := newTestFollower(t, 4096, pattern)
	tf.expect(tf.poll(0), 0, 0, 0) // no file: a quiet state, no error

	podDir := filepath.Join(dir, "kube-system_kube-proxy-abcde_0123", "kube-proxy")
	if err := os.MkdirAll(podDir, 0o755); err != nil {
		t.Fatal(err)
	}
	appendFile(t, filepath.Join(podDir, "0.log"), errLine, infoLine)
	tf.expect(tf.poll(time.Second), 0, 0, 0) // not yet re-globbed
	// A file that appears after start-up is read from its start.
	tf.expect(tf.poll(10*time.Second), 2, 1, 1)

	// The pod goes away with its directory.
	if err := os.RemoveAll(filepath.Join(dir, "kube-system_kube-proxy-abcde_0123")); err != nil {
		t.Fatal(err)
	}
	tf.expect(tf.poll(time.Second), 2, 1, 0)
}

func TestFollowUnfinishedAndLongLines(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "kube-proxy.log")
	appendFile(t, log)
	tf := newTestFollower(t, 512, log)
	tf.poll(0)

	// A line written in two pieces counts once it is complete.
	appendFile(t, log, errLine[:100])
	tf.expect(tf.poll(time.Second), 0, 0, 1)
	appendFile(t, log, errLine[100:])
	tf.expect(tf.poll(time.Second), 1, 1, 1)

	// Over-long lines are skipped and counted, whether they end in this read, a later read, or
	// a later poll, and the line after each is read.
	long := strings.Repeat("x", 600) + errLine
	appendFile(t, log, long, errLine)
	s := tf.poll(time.Second)
	tf.expect(s, 3, 2, 1)
	huge := strings.Repeat("y", 3*readBufferSize)
	appendFile(t, log, huge)
	tf.poll(time.Second)
	appendFile(t, log, huge+"\n", errLine)
	s = tf.poll(time.Second)
	tf.expect(s, 5, 3, 1)
	if s.skipped != 2 {
		t.Errorf("skipped %d lines, want 2", s.skipped)
	}
	appendFile(t, log, errLine[:300])
	tf.poll(time.Second)
	appendFile(t, log, strings.Repeat("z", 300)+"\n", errLine)
	s = tf.poll(time.Second)
	tf.expect(s, 7, 4, 1)
	if s.skipped != 3 {
		t.Errorf("skipped %d lines, want 3", s.skipped)
	}
}

func TestFollowCRIPartialRecords(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "0.log")
	appendFile(t, log)
	tf := newTestFollower(t, 4096, log)
	tf.poll(0)
	data, err := os.ReadFile(filepath.Join("testdata", "cri.log"))
	if err != nil {
		t.Fatal(err)
	}
	appendFile(t, log, string(data))
	s := tf.poll(time.Second)
	want := [numResources][numVerbs]uint64{}
	for _, r := range []int{resServices, resEndpointSlices, resServiceCIDRs, resNodes} {
		want[r][verbWatch] = 1
	}
	if s.errors != want || s.lines != 8 {
		t.Errorf("got %v in %d lines, want %v in 8", s.errors, s.lines, want)
	}
	// The CRI time of the last record, not the time read.
	if wantTS := time.Date(2026, 11, 21, 21, 0, 47, 996689300, time.UTC); !s.lastError.Equal(wantTS) {
		t.Errorf("last error at %v, want %v", s.lastError, wantTS)
	}

	// Partial records joining into a line longer than the limit are skipped, once.
	tf2 := newTestFollower(t, 512, log)
	tf2.poll(0)
	var recs []string
	for range 6 {
		recs = append(recs, "2026-11-21T21:00:49Z stderr P "+strings.Repeat("p", 100)+"\n")
	}
	recs = append(recs, "2026-11-21T21:00:49Z stderr F end\n", "2026-11-21T21:00:50Z stderr F "+errLine)
	appendFile(t, log, recs...)
	s = tf2.poll(time.Second)
	if s.skipped != 1 || s.lines != 8 || s.errors[resServices][verbWatch] != 1 {
		t.Errorf("got %d skipped, %d lines, %d errors; want 1, 8, 1", s.skipped, s.lines, s.errors[resServices][verbWatch])
	}
}

func TestFollowUnreadableFile(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("root reads any file")
	}
	dir := t.TempDir()
	log := filepath.Join(dir, "kube-proxy.log")
	appendFile(t, log, errLine)
	if err := os.Chmod(log, 0); err != nil {
		t.Fatal(err)
	}
	tf := newTestFollower(t, 4096, log)
	s := tf.poll(0)
	if s.err == nil || !strings.Contains(s.err.Error(), "permission denied") {
		t.Fatalf("err = %v, want permission denied", s.err)
	}
}

// writeLog appends n lines (one reflector failure in every hundred) to path.
func writeLog(tb testing.TB, path string, n int) int64 {
	tb.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	var sb strings.Builder
	var written int64
	for i := range n {
		if i%100 == 0 {
			sb.WriteString("2026-11-21T21:00:47.996689000Z stderr F " + errLine)
		} else {
			fmt.Fprintf(&sb, "2026-11-21T21:00:47.996689000Z stderr F I1121 21:00:48.000000   10834 proxier.go:805] \"Syncing iptables rules\" ipFamily=\"IPv4\" line=%d\n", i)
		}
		if sb.Len() > 1<<20 || i == n-1 {
			w, err := f.WriteString(sb.String())
			if err != nil {
				tb.Fatal(err)
			}
			written += int64(w)
			sb.Reset()
		}
	}
	return written
}
