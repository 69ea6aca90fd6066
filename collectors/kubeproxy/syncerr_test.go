package kubeproxy

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// kube-proxy's failed syncs as klog writes them: text with a multi-line error value, text with a
// one-line value, and JSON.
const (
	restoreFailedText = `E1121 09:00:01.500000   20001 proxier.go:1390] "Failed to execute iptables-restore" err=<` + "\n" +
		"\texit status 4: Warning: Extension ipvs revision 0 not supported, missing kernel module?\n" +
		"\tiptables-restore v1.8.9 (nf_tables): \n" +
		"\tline 31: RULE_APPEND failed (No such file or directory): rule in chain KUBE-SERVICES\n" +
		"\t\n" +
		` > ipFamily="IPv4"` + "\n"
	restoreFailedOneLine = `E1121 09:00:31.500000   20001 proxier.go:1390] "Failed to execute iptables-restore" err="exit status 1: iptables-restore: line 51 failed" ipFamily="IPv4"` + "\n"
	nftFailedJSON        = `{"ts":1764320462500.1,"caller":"nftables/proxier.go:1874","msg":"nftables sync failed","ipFamily":"IPv4","err":"/dev/stdin:40:1-63: Error: Could not process rule: No such file or directory\nadd rule ip kube-proxy services jump missing\n^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n"}` + "\n"
	syncFailedInfo       = `I1121 09:00:01.500100   20001 proxier.go:669] "Sync failed" ipFamily="IPv4" retryingTime="30s"` + "\n"
)

const restoreFailedWant = "exit status 4: Warning: Extension ipvs revision 0 not supported, missing kernel module? | iptables-restore v1.8.9 (nf_tables): | line 31: RULE_APPEND failed (No such file or directory): rule in chain KUBE-SERVICES"

// cri wraps each line of text as the container runtime writes it under /var/log/pods.
func cri(ts, text string) string {
	var b strings.Builder
	for _, l := range strings.SplitAfter(strings.TrimSuffix(text, "\n"), "\n") {
		b.WriteString(ts + " stderr F " + strings.TrimSuffix(l, "\n") + "\n")
	}
	return b.String()
}

func readSyncErrors(t *testing.T, text string) []syncError {
	t.Helper()
	var got []syncError
	r := syncErrorReader{emit: func(se syncError) { got = append(got, se) }}
	for _, line := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		if ts, msg, _, ok := splitCRI([]byte(line)); ok {
			r.feed(msg, ts, testNow)
		} else {
			r.feed([]byte(line), nil, testNow)
		}
	}
	r.flush()
	return got
}

func TestSyncErrors(t *testing.T) {
	local := func(s string) time.Time {
		// klog's header has no year: it is the reader's.
		ts, err := time.ParseInLocation("2006-01-02 15:04:05.000000", strconv.Itoa(testNow.Year())+s[4:], testNow.Location())
		if err != nil {
			t.Fatal(err)
		}
		return ts
	}
	for _, c := range []struct {
		name, log string
		want      []syncError
	}{
		{"klog text, multi-line", infoLine + restoreFailedText + syncFailedInfo,
			[]syncError{{at: local("2026-11-21 09:00:01.500000"), tool: toolIPTablesRestore, text: restoreFailedWant}}},
		{"klog text, one line", restoreFailedOneLine,
			[]syncError{{at: local("2026-11-21 09:00:31.500000"), tool: toolIPTablesRestore, text: "exit status 1: iptables-restore: line 51 failed"}}},
		{"klog JSON", nftFailedJSON,
			[]syncError{{at: time.UnixMilli(1764320462500), tool: toolNFT,
				text: "/dev/stdin:40:1-63: Error: Could not process rule: No such file or directory | add rule ip kube-proxy services jump missing"}}},
		{"CRI records", cri("2026-11-28T09:00:01.600000000Z", restoreFailedText+restoreFailedText),
			[]syncError{
				{at: time.Date(2026, 11, 28, 9, 0, 1, 600000000, time.UTC), tool: toolIPTablesRestore, text: restoreFailedWant},
				{at: time.Date(2026, 11, 28, 9, 0, 1, 600000000, time.UTC), tool: toolIPTablesRestore, text: restoreFailedWant},
			}},
		{"a value cut off by the end of the read", strings.Join(strings.SplitAfter(restoreFailedText, "\n")[:3], ""),
			[]syncError{{at: local("2026-11-21 09:00:01.500000"), tool: toolIPTablesRestore,
				text: "exit status 4: Warning: Extension ipvs revision 0 not supported, missing kernel module? | iptables-restore v1.8.9 (nf_tables):"}}},
		{"IPVS mode: the whole restore input follows as rules=<...>, never read",
			`E1121 09:01:01.500000   20001 proxier.go:1194] "Failed to execute iptables-restore" err="exit status 2: iptables-restore v1.8.9 (nf_tables): Couldn't load match ` + "`nfacct'" + `:No such file or directory" ipFamily="IPv4" rules=<` + "\n" +
				"\t*filter\n\t:KUBE-FORWARD - [0:0]\n\t-A KUBE-FORWARD -m nfacct --nfacct-name ct_state_invalid_dropped_pkts -j DROP\n\tCOMMIT\n >\n",
			[]syncError{{at: local("2026-11-21 09:01:01.500000"), tool: toolIPTablesRestore,
				text: "exit status 2: iptables-restore v1.8.9 (nf_tables): Couldn't load match `nfacct':No such file or directory"}}},
		{"other messages", infoLine + errLine + syncFailedInfo + `I1121 09:00:01.5 1 x.go:1] "Failed to execute iptables-restore was mentioned"` + "\n", nil},
	} {
		got := readSyncErrors(t, c.log)
		if len(got) != len(c.want) {
			t.Errorf("%s: got %+v, want %+v", c.name, got, c.want)
			continue
		}
		for i := range got {
			// JSON's milliseconds are a float: to the millisecond.
			if got[i].at.Truncate(time.Millisecond) != c.want[i].at.Truncate(time.Millisecond) || got[i].tool != c.want[i].tool || got[i].text != c.want[i].text {
				t.Errorf("%s: got %+v\nwant %+v", c.name, got[i], c.want[i])
			}
		}
	}
}

// kube-proxy v1.37.2's own lines, from the lab (TestSyncFailing): iptables mode with a restore
// that met a match whose kernel module the node lacks, nftables mode with a transaction the
// kernel refused.
func TestSyncErrorsOfKubeProxy(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "kube-proxy-v1.37.2-sync-failures.log"))
	if err != nil {
		t.Fatal(err)
	}
	got := readSyncErrors(t, string(data))
	want := []syncError{
		{tool: toolIPTablesRestore, text: "exit status 4: Warning: Extension ipvs revision 0 not supported, missing kernel module? | iptables-restore v1.8.9 (nf_tables): | line 313: RULE_APPEND failed (No such file or directory): rule in chain KUBE-SERVICES"},
		{tool: toolNFT, text: `/dev/stdin:104:47-63: Error: Could not process rule: No such file or directory | add rule ip kube-proxy services ct helper set "proxyhealth-lab"`},
	}
	if len(got) != len(want) {
		t.Fatalf("got %+v", got)
	}
	for i := range got {
		if got[i].tool != want[i].tool || got[i].text != want[i].text || got[i].at.IsZero() {
			t.Errorf("got %+v\nwant %+v", got[i], want[i])
		}
	}
}

// The follower counts failed syncs and keeps the last, joined across its lines.
func TestFollowSyncErrors(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "0.log")
	appendFile(t, log, restoreFailedText) // before the exporter started: never counted
	tf := newTestFollower(t, 4096, filepath.Join(dir, "*.log"))
	if s := tf.poll(0); s.syncErrors != 0 {
		t.Fatalf("counted %d failed syncs written before it started", s.syncErrors)
	}
	// A value split across two polls.
	lines := strings.SplitAfter(cri("2026-11-28T09:00:01.600000000Z", restoreFailedText), "\n")
	appendFile(t, log, lines[:3]...)
	if s := tf.poll(time.Second); s.syncErrors != 0 {
		t.Fatalf("counted a failed sync before its error was read: %+v", s.lastSyncError)
	}
	appendFile(t, log, lines[3:]...)
	appendFile(t, log, cri("2026-11-28T09:00:31.600000000Z", restoreFailedOneLine))
	s := tf.poll(time.Second)
	if s.syncErrors != 2 || s.lastSyncError.text != "exit status 1: iptables-restore: line 51 failed" ||
		!s.lastSyncError.at.Equal(time.Date(2026, 11, 28, 9, 0, 31, 600000000, time.UTC)) {
		t.Fatalf("%d failed syncs, last %+v", s.syncErrors, s.lastSyncError)
	}
}

func TestSanitizeSyncError(t *testing.T) {
	long := strings.Repeat("é", 400)
	for in, want := range map[string]string{
		"a\n\n  b  \nTry `iptables-restore -h' or 'iptables-restore --help' for more information.\n": "a | b",
		"bell\x07 and \xff":  "bell? and ?",
		"\x1b[31mred\x1b[0m": "?[31mred?[0m",
	} {
		if got := sanitizeSyncError(strings.Split(in, "\n")); got != want {
			t.Errorf("sanitizeSyncError(%q) = %q, want %q", in, got, want)
		}
	}
	got := sanitizeSyncError([]string{long})
	if len(got) > maxSyncErrorBytes || !utf8.ValidString(got) || !strings.HasSuffix(got, "…") {
		t.Errorf("a long error: %d bytes, valid %v, %q", len(got), utf8.ValidString(got), got[len(got)-10:])
	}
}

// FuzzSyncErrors: no input panics, and what is kept is bounded, valid UTF-8 and one line.
func FuzzSyncErrors(f *testing.F) {
	for _, s := range []string{restoreFailedText, restoreFailedOneLine, nftFailedJSON, cri("2026-11-28T09:00:01.6Z", restoreFailedText)} {
		f.Add(s)
	}
	if data, err := os.ReadFile(filepath.Join("testdata", "kube-proxy-v1.37.2-sync-failures.log")); err == nil {
		f.Add(string(data))
	}
	f.Add(`"Failed to execute iptables-restore" err=<`)
	f.Add(`{"msg":"nftables sync failed","err":{"x":[1,2]}}`)
	f.Fuzz(func(t *testing.T, text string) {
		var r syncErrorReader
		r.emit = func(se syncError) {
			if len(se.text) > maxSyncErrorBytes || !utf8.ValidString(se.text) || strings.ContainsAny(se.text, "\n\r\t") ||
				(se.tool != toolIPTablesRestore && se.tool != toolNFT) {
				t.Fatalf("%q: kept %+v", text, se)
			}
		}
		for _, line := range strings.Split(text, "\n") {
			r.feed([]byte(line), nil, testNow)
			if len(r.lines) > maxSyncErrorLines {
				t.Fatalf("%d lines kept", len(r.lines))
			}
		}
		r.flush()
	})
}
