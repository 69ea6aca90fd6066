//go:build linux

package main

import (
	"fmt"
	"strings"
)

func renderReport(h *header, rs []phaseResult) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Run %s on kernel %s, %s (%d CPUs).  \n", h.Date, h.Kernel, h.CPU, h.Cores)
	fmt.Fprintf(&b, "Namespace %s: nf_conntrack_events=%s, nf_conntrack_max=%s (global, read-only in a namespace), nf_conntrack_udp_timeout=%s.  \n",
		h.NS, h.Events, h.CTMax, h.UDPTimeout)
	fmt.Fprintf(&b, "Generator on CPU %d (%d sockets, new UDP flow per datagram, %d filler services in KUBE-SERVICES), consumers on CPU %d, %s per phase.  \n",
		h.GenCPU, h.Sockets, h.Filler, h.ConsCPU, h.StepDur)
	if h.ExporterInfo != "" {
		fmt.Fprintf(&b, "Exporter: %s.  \n", h.ExporterInfo)
	}
	if h.ConntrackVersion != "" {
		fmt.Fprintf(&b, "conntrack-tools: %s, `conntrack -E -e NEW,UPDATE,DESTROY` writing to a file in %s.  \n", h.ConntrackVersion, h.EventDir)
	}
	fmt.Fprintf(&b, "Command: `%s`\n\n", h.Cmdline)

	b.WriteString("| target flows/s | consumer | flows/s sent | events/s handled | events handled | lost (kernel Drops) | lost (exporter metric) | delivered | CPU µs/event | of which sys | CPU % of a core | peak RSS MiB | peak socket queue KiB | notes |\n")
	b.WriteString("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
	for _, r := range rs {
		target := r.Step.Label
		if r.Step.Rate > 0 {
			target = fmt.Sprintf("%.0f", r.Step.Rate)
		}
		if r.Err != nil {
			fmt.Fprintf(&b, "| %s | %s | | | | | | | | | | | | error: %s |\n", target, r.Consumer, oneLine(r.Err.Error()))
			continue
		}
		secs := r.Gen.Seconds
		flowsPerS, evPerS := 0.0, 0.0
		if secs > 0 {
			flowsPerS = float64(r.Gen.Sent) / secs
			evPerS = float64(r.Handled) / secs
		}
		delivered := "-"
		if r.Handled+r.Lost > 0 {
			delivered = fmt.Sprintf("%.2f%%", 100*float64(r.Handled)/float64(r.Handled+r.Lost))
		}
		expLost := "-"
		if r.Consumer == "exporter" || r.Consumer == "invalid" {
			expLost = "not served"
			if r.HaveExpCt {
				expLost = fmt.Sprintf("%.0f", r.ExpLost)
			}
		}
		cpuPct := 0.0
		if r.Wall > 0 {
			cpuPct = 100 * float64(r.Ticks) / clkTck / r.Wall.Seconds()
		}
		var notes []string
		if n := len(r.Gen.Errors); n > 0 {
			notes = append(notes, fmt.Sprintf("send errors %v", r.Gen.Errors))
		}
		if r.Table.Drop+r.Table.EarlyDrop+r.Table.InsertFailed > 0 {
			notes = append(notes, fmt.Sprintf("table drop %d early_drop %d insert_failed %d", r.Table.Drop, r.Table.EarlyDrop, r.Table.InsertFailed))
		}
		if r.Consumer == "invalid" {
			notes = append(notes, "INVALID packets (SYN+FIN) instead of flows: events are logged packets, one datagram each")
		} else if r.Gen.Sent > 0 {
			notes = append(notes, fmt.Sprintf("%.2f events/flow, peak %d entries", float64(r.Handled+r.Lost)/float64(r.Gen.Sent), r.MaxEnt))
		}
		sysShare := "-"
		if r.Ticks > 0 {
			sysShare = fmt.Sprintf("%.0f%%", 100*float64(r.SysTicks)/float64(r.Ticks))
		}
		fmt.Fprintf(&b, "| %s | %s | %.0f | %.0f | %d | %d | %s | %s | %.2f | %s | %.0f | %.1f | %.0f | %s |\n",
			target, r.Consumer, flowsPerS, evPerS, r.Handled, r.Lost, expLost, delivered,
			r.usPerEvent(), sysShare, cpuPct, float64(r.HWMKB)/1024, float64(r.QueuedMax)/1024, strings.Join(notes, "; "))
	}
	b.WriteString("\nevents/s handled = events handled / generator seconds; CPU µs/event = utime+stime delta of the consumer over the measured window (from just before the generator starts until the consumer's socket queue is empty and its count stable) / events handled; of which sys = stime share; delivered = handled / (handled + kernel Drops of the consumer's conntrack sockets); peak socket queue = the most bytes (skb truesize, the Rmem column of /proc/net/netlink) seen waiting in the consumer's conntrack sockets, sampled every 100 ms: what its receive buffer held.\n")
	return b.String()
}

func oneLine(s string) string {
	s = strings.ReplaceAll(s, "\n", " ")
	s = strings.ReplaceAll(s, "|", "/")
	if len(s) > 300 {
		s = s[:300] + "..."
	}
	return s
}
