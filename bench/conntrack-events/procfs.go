package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// netlinkNetfilter is NETLINK_NETFILTER, the Eth column of /proc/net/netlink for conntrack
// sockets.
const netlinkNetfilter = 12

// netlinkSock is one row of /proc/net/netlink.
type netlinkSock struct {
	Proto  int
	Groups uint64
	Rmem   uint64
	Drops  uint64
	Inode  uint64
}

// parseNetlink reads /proc/net/netlink (as seen from one network namespace, e.g.
// /proc/<pid>/net/netlink).
func parseNetlink(r io.Reader) ([]netlinkSock, error) {
	var out []netlinkSock
	sc := bufio.NewScanner(r)
	header := true
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if header {
			header = false
			if len(f) < 10 || f[1] != "Eth" || f[8] != "Drops" || f[9] != "Inode" {
				return nil, fmt.Errorf("unexpected /proc/net/netlink header %q", sc.Text())
			}
			continue
		}
		if len(f) < 10 {
			continue
		}
		var s netlinkSock
		var err error
		if s.Proto, err = strconv.Atoi(f[1]); err != nil {
			return nil, fmt.Errorf("netlink Eth %q: %w", f[1], err)
		}
		if s.Groups, err = strconv.ParseUint(f[3], 16, 64); err != nil {
			return nil, fmt.Errorf("netlink Groups %q: %w", f[3], err)
		}
		if s.Rmem, err = strconv.ParseUint(f[4], 10, 64); err != nil {
			return nil, fmt.Errorf("netlink Rmem %q: %w", f[4], err)
		}
		if s.Drops, err = strconv.ParseUint(f[8], 10, 64); err != nil {
			return nil, fmt.Errorf("netlink Drops %q: %w", f[8], err)
		}
		if s.Inode, err = strconv.ParseUint(f[9], 10, 64); err != nil {
			return nil, fmt.Errorf("netlink Inode %q: %w", f[9], err)
		}
		out = append(out, s)
	}
	return out, sc.Err()
}

// socketInodes returns the inodes of the sockets a process holds open.
func socketInodes(proc string, pid int) (map[uint64]bool, error) {
	dir := filepath.Join(proc, strconv.Itoa(pid), "fd")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	out := make(map[uint64]bool)
	for _, e := range ents {
		l, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err != nil {
			continue // closed meanwhile
		}
		if ino, ok := parseSocketLink(l); ok {
			out[ino] = true
		}
	}
	return out, nil
}

func parseSocketLink(l string) (uint64, bool) {
	s, ok := strings.CutPrefix(l, "socket:[")
	if !ok {
		return 0, false
	}
	s, ok = strings.CutSuffix(s, "]")
	if !ok {
		return 0, false
	}
	ino, err := strconv.ParseUint(s, 10, 64)
	return ino, err == nil
}

// cpuTicks returns utime and stime of a process (all its threads) in clock ticks from
// /proc/<pid>/stat.
func cpuTicks(proc string, pid int) (user, sys uint64, err error) {
	b, err := os.ReadFile(filepath.Join(proc, strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, 0, err
	}
	return parseStatCPU(string(b))
}

func parseStatCPU(s string) (user, sys uint64, err error) {
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("malformed stat %q", s)
	}
	// Fields after the command: state(3) ppid(4) ... utime(14) stime(15).
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, 0, fmt.Errorf("short stat %q", s)
	}
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, 0, fmt.Errorf("bad utime/stime in stat %q", s)
	}
	return ut, st, nil
}

// statusKB returns a "kB" field (VmHWM, VmRSS) of /proc/<pid>/status.
func statusKB(proc string, pid int, field string) (uint64, error) {
	b, err := os.ReadFile(filepath.Join(proc, strconv.Itoa(pid), "status"))
	if err != nil {
		return 0, err
	}
	return parseStatusKB(string(b), field)
}

func parseStatusKB(s, field string) (uint64, error) {
	for _, line := range strings.Split(s, "\n") {
		rest, ok := strings.CutPrefix(line, field+":")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			break
		}
		return strconv.ParseUint(f[0], 10, 64)
	}
	return 0, fmt.Errorf("no %s in status", field)
}

// ctStats is the namespace's conntrack table state from /proc/net/stat/nf_conntrack: the
// entry count (the same on every row) and per-CPU counters summed.
type ctStats struct {
	Entries      uint64
	Drop         uint64
	EarlyDrop    uint64
	InsertFailed uint64
}

func parseCTStats(r io.Reader) (ctStats, error) {
	var st ctStats
	sc := bufio.NewScanner(r)
	var cols []string
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if cols == nil {
			cols = f
			continue
		}
		if len(f) != len(cols) {
			continue
		}
		for i, c := range cols {
			v, err := strconv.ParseUint(f[i], 16, 64)
			if err != nil {
				return st, fmt.Errorf("nf_conntrack stat %s %q: %w", c, f[i], err)
			}
			switch c {
			case "entries":
				st.Entries = v
			case "drop":
				st.Drop += v
			case "early_drop":
				st.EarlyDrop += v
			case "insert_failed":
				st.InsertFailed += v
			}
		}
	}
	if cols == nil {
		return st, fmt.Errorf("empty nf_conntrack stat")
	}
	return st, sc.Err()
}

// exporterCounts are the exporter's event stream counters from one scrape.
type exporterCounts struct {
	Events     float64 // sum of proxyhealth_conntrack_events_total over event
	Lost       float64 // proxyhealth_conntrack_events_lost_total
	HaveEvents bool
	HaveLost   bool
	// With --conntrack.invalid-reasons: the sum of
	// proxyhealth_conntrack_invalid_reason_packets_total (and *_unlisted_total) over every
	// label set, and proxyhealth_conntrack_invalid_reason_packets_lost_total.
	Invalid         float64
	InvalidLost     float64
	HaveInvalidLost bool
}

// parseExporterMetrics picks the event stream counters out of a text exposition.
func parseExporterMetrics(r io.Reader) (exporterCounts, error) {
	var c exporterCounts
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 4*1024*1024)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		name, val, ok := splitSample(line)
		if !ok {
			continue
		}
		switch name {
		case "proxyhealth_conntrack_events_total":
			v, err := strconv.ParseFloat(val, 64)
			if err != nil {
				return c, fmt.Errorf("sample %q: %w", line, err)
			}
			c.Events += v
			c.HaveEvents = true
		case "proxyhealth_conntrack_events_lost_total":
			v, err := strconv.ParseFloat(val, 64)
			if err != nil {
				return c, fmt.Errorf("sample %q: %w", line, err)
			}
			c.Lost += v
			c.HaveLost = true
		case "proxyhealth_conntrack_invalid_reason_packets_total", "proxyhealth_conntrack_invalid_reason_packets_unlisted_total":
			v, err := strconv.ParseFloat(val, 64)
			if err != nil {
				return c, fmt.Errorf("sample %q: %w", line, err)
			}
			c.Invalid += v
		case "proxyhealth_conntrack_invalid_reason_packets_lost_total":
			v, err := strconv.ParseFloat(val, 64)
			if err != nil {
				return c, fmt.Errorf("sample %q: %w", line, err)
			}
			c.InvalidLost += v
			c.HaveInvalidLost = true
		}
	}
	return c, sc.Err()
}

// splitSample splits `name{labels} value [timestamp]` into name and value.
func splitSample(line string) (name, value string, ok bool) {
	rest := line
	if i := strings.IndexByte(line, '{'); i >= 0 {
		j := strings.LastIndexByte(line, '}')
		if j < i {
			return "", "", false
		}
		name, rest = line[:i], line[j+1:]
	} else {
		i := strings.IndexAny(line, " \t")
		if i < 0 {
			return "", "", false
		}
		name, rest = line[:i], line[i:]
	}
	f := strings.Fields(rest)
	if len(f) == 0 {
		return "", "", false
	}
	return name, f[0], true
}

// countLines counts newlines in a file.
func countLines(path string) (uint64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	var n uint64
	for {
		k, err := f.Read(buf)
		n += uint64(bytes.Count(buf[:k], []byte{'\n'}))
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}
