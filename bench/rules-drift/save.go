//go:build linux

package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/proxyhealth/proxyhealth/bench/internal/benchns"
	"github.com/proxyhealth/proxyhealth/bench/internal/benchrun"
	"github.com/proxyhealth/proxyhealth/internal/testsupport/iptables"
)

// backend is one iptables backend: its restore and save binaries.
type backend struct {
	Name, Restore, Save string
}

var backends = []backend{
	{"nft", "iptables-nft-restore", "iptables-nft-save"},
	{"legacy", "iptables-legacy-restore", "iptables-legacy-save"},
}

// saveResult is part 1 for one backend.
type saveResult struct {
	Backend             backend
	NS                  string
	Restore             timed // summed over RestoreFiles runs
	RestoreFiles        int
	Saves               []timed
	Lines, Chains       int
	Bytes               int
	Parses              []parseRun // internal/testsupport/iptables.Parse of the saved output, in process
	SVCChains, SEPChain int
}

// parseRun is one in-process parse of a saved table.
type parseRun struct {
	Wall           time.Duration
	Bytes, Allocs  uint64
	Chains, NRules int
}

// measureSave loads rules into a fresh namespace with b's restore, then times b's save reps
// times, and parses the last output in process reps times.
func measureSave(ctx context.Context, b backend, chunks [][]byte, reps int) (res saveResult, err error) {
	res.Backend = b
	res.NS = newNSName(b.Name)
	if err := benchns.Add(ctx, res.NS); err != nil {
		return res, err
	}
	defer func() {
		if derr := benchns.Delete(nsPrefix, res.NS); derr != nil && err == nil {
			err = derr
		}
	}()
	for _, chunk := range chunks {
		t, err := runTimed(ctx, res.NS, chunk, b.Restore, "-w", "--noflush", "--counters")
		if err != nil {
			return res, err
		}
		res.Restore.Wall += t.Wall
		res.Restore.User += t.User
		res.Restore.Sys += t.Sys
		res.Restore.MaxRSSKiB = max(res.Restore.MaxRSSKiB, t.MaxRSSKiB)
		res.RestoreFiles++
	}
	for range reps {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		t, err := runTimed(ctx, res.NS, nil, b.Save, "-t", "nat")
		if err != nil {
			return res, err
		}
		res.Saves = append(res.Saves, t)
	}
	out := res.Saves[len(res.Saves)-1].Out
	res.Bytes = len(out)
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		res.Lines++
		if len(line) > 0 && line[0] == ':' {
			res.Chains++
			if bytes.HasPrefix(line, []byte(":KUBE-SVC-")) {
				res.SVCChains++
			} else if bytes.HasPrefix(line, []byte(":KUBE-SEP-")) {
				res.SEPChain++
			}
		}
	}
	for i := range res.Saves {
		res.Saves[i].Out = nil
	}
	for range reps {
		p, err := parseSaved(out)
		if err != nil {
			return res, fmt.Errorf("parsing %s output: %w", b.Save, err)
		}
		res.Parses = append(res.Parses, p)
	}
	return res, nil
}

// parseSaved times internal/testsupport/iptables.Parse, the text parser, on one saved table.
func parseSaved(out []byte) (parseRun, error) {
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	start := time.Now()
	rs, err := iptables.Parse(bytes.NewReader(out))
	wall := time.Since(start)
	runtime.ReadMemStats(&after)
	if err != nil {
		return parseRun{}, err
	}
	p := parseRun{Wall: wall, Bytes: after.TotalAlloc - before.TotalAlloc, Allocs: after.Mallocs - before.Mallocs}
	if nat := rs.Table("nat"); nat != nil {
		p.Chains = len(nat.Chains)
		for _, c := range nat.Chains {
			p.NRules += len(c.Rules)
		}
	}
	return p, nil
}

// goBench is one line of `go test -bench` output.
type goBench struct {
	Name                    string
	N                       int
	NsPerOp, MBPerS         float64
	BytesPerOp, AllocsPerOp float64
}

var benchLine = regexp.MustCompile(`^(Benchmark\S+?)(?:-\d+)?\s+(\d+)\s+(.*)$`)

// runGoBench runs the rules package's own benchmarks (BenchmarkParseAndCompare,
// BenchmarkCompareOnly) and returns every result line.
func runGoBench(ctx context.Context, repo string, smoke bool, count int, extra []string) ([]goBench, string, error) {
	args := []string{"test", "-run", "XXX", "-bench", "ParseAndCompare|CompareOnly", "-benchmem", "-count", strconv.Itoa(count)}
	if smoke {
		args = append(args, "-short", "-benchtime", "1x")
	} else {
		args = append(args, "-benchtime", "5x")
	}
	args = append(args, extra...)
	args = append(args, "./collectors/rules")
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = repo
	cmd.Env = os.Environ()
	out, err := cmd.CombinedOutput()
	cmdline := "go " + strings.Join(args, " ")
	if err != nil {
		return nil, cmdline, fmt.Errorf("%s: %w: %s", cmdline, err, benchrun.Truncate(string(out), 4000))
	}
	var res []goBench
	for _, line := range strings.Split(string(out), "\n") {
		m := benchLine.FindStringSubmatch(strings.TrimSpace(line))
		if m == nil {
			continue
		}
		g := goBench{Name: strings.TrimPrefix(m[1], "Benchmark")}
		g.N, _ = strconv.Atoi(m[2])
		f := strings.Fields(m[3])
		for i := 0; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				continue
			}
			switch f[i+1] {
			case "ns/op":
				g.NsPerOp = v
			case "MB/s":
				g.MBPerS = v
			case "B/op":
				g.BytesPerOp = v
			case "allocs/op":
				g.AllocsPerOp = v
			}
		}
		res = append(res, g)
	}
	if len(res) == 0 {
		return nil, cmdline, fmt.Errorf("%s printed no benchmark result: %s", cmdline, benchrun.Truncate(string(out), 4000))
	}
	return res, cmdline, nil
}
