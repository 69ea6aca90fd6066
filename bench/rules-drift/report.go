//go:build linux

package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/proxyhealth/proxyhealth/bench/internal/spread"
)

func secs(d time.Duration) float64 { return d.Seconds() }
func mib(kib int64) float64        { return float64(kib) / 1024 }

func (r *report) goBench(name string) []goBench {
	var out []goBench
	for _, g := range r.GoBench {
		if g.Name == name {
			out = append(out, g)
		}
	}
	return out
}

func field(gs []goBench, f func(goBench) float64) []float64 {
	var out []float64
	for _, g := range gs {
		out = append(out, f(g))
	}
	return out
}

func (r *report) render() string {
	if r == nil {
		return "" // the run failed before it measured anything
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Run %s on kernel %s, %s (%d CPUs), commit %s, %s.  \n", r.Date, r.Kernel, r.CPU, r.Cores, r.Commit, r.IPTablesVersion)
	fmt.Fprintf(&b, "Command: `%s`  \n", r.Cmdline)
	fmt.Fprintf(&b, "Rules: %d services x %d endpoints, kube-proxy v1.36 iptables-mode nat table with comments: %d lines, %.1f MB, %d chains (as generated). Median (min–max) of %d repetitions.\n\n",
		r.cfg.services, r.cfg.endpoints, r.GenLines, float64(r.GenBytes)/1e6, r.GenChains, r.cfg.reps)
	fmt.Fprintf(&b, "Each save and restore runs in its own network namespace (one per backend, so neither sees the other's rules), timed by a small launcher process; child max RSS is its rusage maxrss, whose floor here (the launcher's own, measured with `true`) is %.1f MiB.\n\n", mib(r.RSSFloorKiB))

	b.WriteString("| backend | restore s (CPU s), files | `-save -t nat` wall s | CPU s (user+sys) | of which sys | child max RSS MiB | saved lines | saved MB | chains (KUBE-SVC / KUBE-SEP) | `iptables.Parse` of that output s | parse MB allocated | parse allocs |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, s := range r.Saves {
		var wall, cpu, sys, rss, pw, pb, pa []float64
		for _, t := range s.Saves {
			wall = append(wall, secs(t.Wall))
			cpu = append(cpu, secs(t.User+t.Sys))
			sys = append(sys, secs(t.Sys))
			rss = append(rss, mib(t.MaxRSSKiB))
		}
		for _, p := range s.Parses {
			pw = append(pw, secs(p.Wall))
			pb = append(pb, float64(p.Bytes)/1e6)
			pa = append(pa, float64(p.Allocs))
		}
		fmt.Fprintf(&b, "| %s | %.2f (%.2f), %d | %s | %s | %s | %s | %d | %.1f | %d (%d / %d) | %s | %s | %s |\n",
			s.Backend.Name, secs(s.Restore.Wall), secs(s.Restore.User+s.Restore.Sys), s.RestoreFiles,
			spread.Format(wall, "%.3f"), spread.Format(cpu, "%.3f"), spread.Format(sys, "%.3f"), spread.Format(rss, "%.1f"),
			s.Lines, float64(s.Bytes)/1e6, s.Chains, s.SVCChains, s.SEPChain,
			spread.Format(pw, "%.3f"), spread.Format(pb, "%.0f"), spread.Format(pa, "%.0f"))
	}
	b.WriteString("\n")

	fmt.Fprintf(&b, "The rules package's benchmarks (its own generator, %s): `%s`\n\n", r.GoBenchScale, r.GoBenchCmd)
	b.WriteString("| benchmark | runs | ms/op | MB/op | allocs/op |\n|---|---:|---:|---:|---:|\n")
	for _, name := range []string{"ParseAndCompare", "CompareOnly"} {
		gs := r.goBench(name)
		if len(gs) == 0 {
			continue
		}
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s |\n", name, len(gs),
			spread.Format(field(gs, func(g goBench) float64 { return g.NsPerOp / 1e6 }), "%.3f"),
			spread.Format(field(gs, func(g goBench) float64 { return g.BytesPerOp / 1e6 }), "%.1f"),
			spread.Format(field(gs, func(g goBench) float64 { return g.AllocsPerOp }), "%.0f"))
	}
	b.WriteString("\n")

	pc := spread.Median(field(r.goBench("ParseAndCompare"), func(g goBench) float64 { return g.NsPerOp / 1e9 }))
	co := spread.Median(field(r.goBench("CompareOnly"), func(g goBench) float64 { return g.NsPerOp / 1e9 }))
	b.WriteString("Against the targets (medians):\n\n")
	for _, s := range r.Saves {
		var wall []float64
		for _, t := range s.Saves {
			wall = append(wall, secs(t.Wall))
		}
		sw := spread.Median(wall)
		if sw <= 0 {
			continue
		}
		fmt.Fprintf(&b, "- %s: parse + compare %.3f s = %.0f%% of `%s` (%.3f s; target ≤ 25%% for legacy); a no-change compare %.4f s = %.2f%% of a full save + parse + compare (%.3f s; target < 1%%)\n",
			s.Backend.Name, pc, 100*pc/sw, s.Backend.Save, sw, co, 100*co/(sw+pc), sw+pc)
	}
	b.WriteString("\n")

	switch {
	case r.Kube != nil:
		r.Kube.render(&b)
	case r.KubeSkipped != "":
		fmt.Fprintf(&b, "API part skipped: %s\n", r.KubeSkipped)
	}
	return b.String()
}
