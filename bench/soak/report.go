//go:build linux

package main

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/proxyhealth/proxyhealth/bench/internal/benchrun"
)

// report is what one run measured.
type report struct {
	benchrun.Machine
	cfg             config
	smoke           bool
	kubeVersion     string
	kubeSkipped     string
	exporterArgs    string
	elapsed         time.Duration
	baseline, final sample
	faults          []*faultRun
	samples         []sample
	exporterLog     string
}

// clean: every fault was followed by a clean exporter.
func (r *report) clean() bool {
	for _, f := range r.faults {
		if f.reason != "" {
			return false
		}
	}
	return len(r.faults) > 0
}

func mib(kib int64) float64 { return float64(kib) / 1024 }

func (r *report) render() string {
	if r == nil {
		return "" // the run failed before it measured anything
	}
	var b strings.Builder
	fmt.Fprintf(&b, "## Soak: faults at random (%s)\n\n", r.Date[:len("2006-01-02")])
	fmt.Fprintf(&b, "`%s` on %s (%d cores), kernel %s, exporter at `%s`; seed %d.\n",
		r.Cmdline, r.CPU, r.Cores, r.Kernel, r.Commit, r.cfg.seed)
	fmt.Fprintf(&b, "Ran %s with faults (%d injected), %d Services x 5 endpoints in iptables-nft; exporter `%s`.\n",
		r.elapsed.Round(time.Second), len(r.faults), r.cfg.services, r.exporterArgs)
	if r.kubeVersion != "" {
		fmt.Fprintf(&b, "etcd and kube-apiserver %s in the namespace, the exporter's API connection through a fault proxy.\n", r.kubeVersion)
	} else {
		fmt.Fprintf(&b, "No apiserver (%s): no API black hole, rules collector off.\n", r.kubeSkipped)
	}
	fmt.Fprintf(&b, "Baseline: RSS %.1f MiB, %g goroutines, %d fds, %d threads.\n\n",
		mib(r.baseline.rssKiB), r.baseline.goroutines, r.baseline.fds, r.baseline.threads)

	b.WriteString("| fault | injected | came back clean | recovery median / max (s) | peak RSS (MiB) | peak goroutines | peak fds | slowest scrape (s) |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|\n")
	kinds := map[string][]*faultRun{}
	var order []string
	for _, f := range r.faults {
		if _, ok := kinds[f.kind]; !ok {
			order = append(order, f.kind)
		}
		kinds[f.kind] = append(kinds[f.kind], f)
	}
	slices.Sort(order)
	for _, k := range order {
		fs := kinds[k]
		var rec []float64
		var peak sample
		clean := 0
		for _, f := range fs {
			peak = maxSample(peak, f.peak)
			if f.reason == "" {
				clean++
				rec = append(rec, f.recovery().Seconds())
			}
		}
		slices.Sort(rec)
		recStr := "-"
		if len(rec) > 0 {
			recStr = fmt.Sprintf("%.1f / %.1f", rec[len(rec)/2], rec[len(rec)-1])
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %s | %.1f | %g | %d | %.2f |\n",
			k, len(fs), clean, recStr, mib(peak.rssKiB), peak.goroutines, peak.fds, peak.scrape.Seconds())
	}
	b.WriteString("\nRecovery is from the fault's end to the first clean look (looks every second): every collector\n" +
		"succeeding, kube-proxy up and healthy, the API view fresh (with an apiserver), kube-proxy's log\n" +
		"read line for line (lines and watch failures counted equal those written), goroutines within\n" +
		fmt.Sprintf("%d and fds within %d of the baseline, no child process.\n\n", goroutineSlack, fdSlack))

	samples := slices.Clone(r.samples)
	slices.SortFunc(samples, func(a, b sample) int { return a.at.Compare(b.at) })
	if len(samples) > 0 {
		b.WriteString("Over time (each row a slice of the run; min-max of the samples in it):\n\n")
		b.WriteString("| from (min) | RSS (MiB) | VmHWM (MiB) | goroutines | fds | threads | scrape p50 / max (ms) | failed scrapes |\n")
		b.WriteString("|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		t0 := samples[0].at
		span := samples[len(samples)-1].at.Sub(t0)
		rows := 12
		if span < 12*time.Minute {
			rows = max(1, int(span/time.Minute)+1)
		}
		step := span/time.Duration(rows) + time.Nanosecond
		for i := range rows {
			lo, hi := t0.Add(time.Duration(i)*step), t0.Add(time.Duration(i+1)*step)
			var row []sample
			for _, sm := range samples {
				if !sm.at.Before(lo) && sm.at.Before(hi) {
					row = append(row, sm)
				}
			}
			if len(row) == 0 {
				continue
			}
			fmt.Fprintf(&b, "| %.0f | %s | %s | %s | %s | %s | %s | %d |\n", lo.Sub(t0).Minutes(),
				span2(row, func(s sample) float64 { return mib(s.rssKiB) }, "%.1f"),
				span2(row, func(s sample) float64 { return mib(s.hwmKiB) }, "%.1f"),
				span2(row, func(s sample) float64 { return s.goroutines }, "%.0f"),
				span2(row, func(s sample) float64 { return float64(s.fds) }, "%.0f"),
				span2(row, func(s sample) float64 { return float64(s.threads) }, "%.0f"),
				scrapeTimes(row), failed(row))
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "At the end: RSS %.1f MiB (VmHWM %.1f MiB), %g goroutines, %d fds, %d threads, %d children.\n",
		mib(r.final.rssKiB), mib(r.final.hwmKiB), r.final.goroutines, r.final.fds, r.final.threads, r.final.children)
	var bad []string
	for _, f := range r.faults {
		if f.reason != "" {
			bad = append(bad, fmt.Sprintf("- %s at %s: %s", f.kind, f.start.UTC().Format("15:04:05"), f.reason))
		}
	}
	if len(bad) > 0 {
		b.WriteString("\nNot clean within " + r.cfg.settle.String() + ":\n\n" + strings.Join(bad, "\n") + "\n")
		b.WriteString("\nThe exporter's log, its end:\n\n```\n" + r.exporterLog + "\n```\n")
	} else if len(r.faults) > 0 {
		b.WriteString("Every fault was followed by a clean exporter.\n")
	}
	return b.String()
}

func span2(row []sample, f func(sample) float64, format string) string {
	lo, hi := f(row[0]), f(row[0])
	for _, s := range row[1:] {
		lo, hi = min(lo, f(s)), max(hi, f(s))
	}
	if fmt.Sprintf(format, lo) == fmt.Sprintf(format, hi) {
		return fmt.Sprintf(format, lo)
	}
	return fmt.Sprintf(format+"-"+format, lo, hi)
}

func scrapeTimes(row []sample) string {
	var ms []float64
	for _, s := range row {
		if s.scrapeErr == nil && !s.exporterGone {
			ms = append(ms, float64(s.scrape.Microseconds())/1000)
		}
	}
	if len(ms) == 0 {
		return "-"
	}
	slices.Sort(ms)
	return fmt.Sprintf("%.0f / %.0f", ms[len(ms)/2], ms[len(ms)-1])
}

func failed(row []sample) int {
	n := 0
	for _, s := range row {
		if s.scrapeErr != nil || s.exporterGone {
			n++
		}
	}
	return n
}
