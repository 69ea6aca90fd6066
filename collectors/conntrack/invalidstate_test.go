package conntrack

import (
	"encoding/json"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/promslog"
)

// startedInvalidLog is an INVALID log reader on procfs keeping its state in stateDir, with its
// settings set (start), not yet put back.
func startedInvalidLog(t *testing.T, procfs, stateDir string) *invalidLog {
	t.Helper()
	l := newInvalidLog(&Config{ProcPath: procfs, MaxServiceSeries: 10, InvalidReasonsStateDir: stateDir}, promslog.NewNopLogger(), nil)
	var mu sync.Mutex
	var log []string
	l.open = func(int) (eventSource, error) {
		return &fakeSource{name: "nflog", log: &log, mu: &mu, closed: make(chan struct{})}, nil
	}
	if err := l.start(); err != nil {
		t.Fatal(err)
	}
	return l
}

// An exporter that ends without putting the settings back (SIGKILL, an OOM kill) leaves the
// node's own values in the state file; the next start puts those back on its exit, not the
// values the crash left, however many crashes come between.
func TestInvalidLogSettingsSurviveACrash(t *testing.T) {
	procfs := invalidProcfs(t, "0", "nf_log_ipv4", "nf_log_ipv6")
	stateDir := filepath.Join(t.TempDir(), "run", "proxyhealth")

	startedInvalidLog(t, procfs, stateDir) // then killed: never put back
	if got := readSettings(t, procfs); got != "255 nfnetlink_log nfnetlink_log" {
		t.Fatalf("settings while reading: %s", got)
	}
	state := filepath.Join(stateDir, invalidStateFile)
	for path, want := range map[string]os.FileMode{stateDir: 0o700 | os.ModeDir, state: 0o600} {
		if fi, err := os.Stat(path); err != nil || fi.Mode() != want {
			t.Errorf("%s: %v, %v; want mode %v", path, fi.Mode(), err, want)
		}
	}
	b, err := os.ReadFile(state)
	if err != nil {
		t.Fatal(err)
	}
	var st invalidState
	if err := json.Unmarshal(b, &st); err != nil || st.Settings["sys/net/netfilter/nf_log/2"] != "nf_log_ipv4" || st.BootID == "" || st.Netns == "" {
		t.Errorf("state file %s: %+v, %v", b, st, err)
	}

	startedInvalidLog(t, procfs, stateDir) // killed again
	last := startedInvalidLog(t, procfs, stateDir)
	last.restore() // SIGTERM
	if got := readSettings(t, procfs); got != "0 nf_log_ipv4 nf_log_ipv6" {
		t.Errorf("settings after the crashes and a clean exit: %s, want the node's own 0 nf_log_ipv4 nf_log_ipv6", got)
	}
	if _, err := os.Stat(state); !os.IsNotExist(err) {
		t.Errorf("the state file outlives the clean exit: %v", err)
	}

	// Next time the node's values are what is found.
	if err := os.WriteFile(filepath.Join(procfs, "sys/net/netfilter/nf_log/2"), []byte("NONE"), 0o644); err != nil {
		t.Fatal(err)
	}
	startedInvalidLog(t, procfs, stateDir).restore()
	if got := readSettings(t, procfs); got != "0 NONE nf_log_ipv6" {
		t.Errorf("settings after a clean run: %s, want 0 NONE nf_log_ipv6", got)
	}
}

// A setting changed by hand after a crash is the node's new value; the others come from the
// state file. Without a state file, the exporter's own values found at start are put back to
// log nothing.
func TestInvalidLogSettingsAfterACrashChangedByHand(t *testing.T) {
	procfs := invalidProcfs(t, "0", "nf_log_ipv4", "nf_log_ipv6")
	stateDir := t.TempDir()
	startedInvalidLog(t, procfs, stateDir)
	if err := os.WriteFile(filepath.Join(procfs, "sys/net/netfilter/nf_conntrack_log_invalid"), []byte("6"), 0o644); err != nil {
		t.Fatal(err)
	}
	startedInvalidLog(t, procfs, stateDir).restore()
	if got := readSettings(t, procfs); got != "6 nf_log_ipv4 nf_log_ipv6" {
		t.Errorf("settings: %s, want 6 nf_log_ipv4 nf_log_ipv6", got)
	}

	procfs = invalidProcfs(t, "255", "nfnetlink_log", "nf_log_ipv6")
	startedInvalidLog(t, procfs, t.TempDir()).restore()
	if got := readSettings(t, procfs); got != "0 NONE nf_log_ipv6" {
		t.Errorf("settings found at the exporter's values without a state file: put back to %s, want 0 NONE nf_log_ipv6", got)
	}
}

// A state file of another boot or network namespace describes no setting here.
func TestInvalidLogStateOfAnotherBoot(t *testing.T) {
	procfs := invalidProcfs(t, "255", "nfnetlink_log", "nfnetlink_log")
	stateDir := t.TempDir()
	b, err := json.Marshal(invalidState{BootID: "another-boot", Netns: "net:[4026531840]",
		Settings: map[string]string{"sys/net/netfilter/nf_log/2": "nf_log_ipv4", "sys/net/netfilter/nf_log/10": "nf_log_ipv6", "sys/net/netfilter/nf_conntrack_log_invalid": "6"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(stateDir, invalidStateFile), b, 0o600); err != nil {
		t.Fatal(err)
	}
	startedInvalidLog(t, procfs, stateDir).restore()
	if got := readSettings(t, procfs); got != "0 NONE NONE" {
		t.Errorf("settings: %s, want 0 NONE NONE (the state file is of another boot)", got)
	}
}

// Without a state file that can be written, no setting is changed: a crash could lose them.
func TestInvalidLogStateDirNotWritable(t *testing.T) {
	procfs := invalidProcfs(t, "0", "NONE", "NONE")
	notADir := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(notADir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	l := newInvalidLog(&Config{ProcPath: procfs, MaxServiceSeries: 10, InvalidReasonsStateDir: notADir}, promslog.NewNopLogger(), nil)
	var mu sync.Mutex
	var log []string
	l.open = func(int) (eventSource, error) {
		return &fakeSource{name: "nflog", log: &log, mu: &mu, closed: make(chan struct{})}, nil
	}
	if err := l.start(); err == nil {
		t.Fatal("started without a state file")
	}
	if got := readSettings(t, procfs); got != "0 NONE NONE" {
		t.Errorf("settings changed without a state file: %s", got)
	}
}

// The backends are set before log_invalid rises: when one cannot be set, log_invalid is never
// written, so no INVALID packet reaches a syslog backend in between.
func TestInvalidLogSetsBackendsFirst(t *testing.T) {
	// nf_log/10 reads but cannot be written.
	procfs := invalidProcfs(t, "0", "nf_log_ipv4", "")
	if err := os.Symlink("/proc/version", filepath.Join(procfs, "sys/net/netfilter/nf_log/10")); err != nil {
		t.Fatal(err)
	}
	logInvalid := filepath.Join(procfs, "sys/net/netfilter/nf_conntrack_log_invalid")
	old := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
	if err := os.Chtimes(logInvalid, old, old); err != nil {
		t.Fatal(err)
	}
	l := newInvalidLog(&Config{ProcPath: procfs, MaxServiceSeries: 10, InvalidReasonsStateDir: t.TempDir()}, promslog.NewNopLogger(), nil)
	var mu sync.Mutex
	var log []string
	l.open = func(int) (eventSource, error) {
		return &fakeSource{name: "nflog", log: &log, mu: &mu, closed: make(chan struct{})}, nil
	}
	if err := l.start(); err == nil {
		t.Fatal("started although nf_log/10 cannot be written")
	}
	if fi, err := os.Stat(logInvalid); err != nil || !fi.ModTime().Equal(old) {
		t.Errorf("nf_conntrack_log_invalid was written (%v, %v) although a backend could not be set", fi.ModTime(), err)
	}
	b, _ := os.ReadFile(filepath.Join(procfs, "sys/net/netfilter/nf_log/2"))
	if string(b) != "nf_log_ipv4" {
		t.Errorf("nf_log/2 = %q, want nf_log_ipv4 put back", b)
	}
}

// The settings are written in --conntrack.invalid-reasons.netfilter-dir when it is given (a
// mount of the host's /proc/sys/net/netfilter alone), not under --path.procfs.
func TestInvalidLogNetfilterDir(t *testing.T) {
	procfs := invalidProcfs(t, "0", "NONE", "NONE")
	mounted := invalidProcfs(t, "0", "nf_log_ipv4", "nf_log_ipv6")
	l := newInvalidLog(&Config{ProcPath: procfs, MaxServiceSeries: 10, InvalidReasonsStateDir: t.TempDir(),
		InvalidReasonsNetfilterDir: filepath.Join(mounted, "sys", "net", "netfilter")}, promslog.NewNopLogger(), nil)
	var mu sync.Mutex
	var log []string
	l.open = func(int) (eventSource, error) {
		return &fakeSource{name: "nflog", log: &log, mu: &mu, closed: make(chan struct{})}, nil
	}
	if err := l.start(); err != nil {
		t.Fatal(err)
	}
	if got := readSettings(t, mounted); got != "255 nfnetlink_log nfnetlink_log" {
		t.Errorf("settings in the netfilter dir: %s", got)
	}
	if got := readSettings(t, procfs); got != "0 NONE NONE" {
		t.Errorf("settings under --path.procfs changed: %s", got)
	}
	l.restore()
	if got := readSettings(t, mounted); got != "0 nf_log_ipv4 nf_log_ipv6" {
		t.Errorf("settings put back: %s", got)
	}
}
