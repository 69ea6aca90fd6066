//go:build linux

package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/proxyhealth/proxyhealth/bench/internal/benchrun"
	"github.com/proxyhealth/proxyhealth/bench/internal/synthcluster"
)

func (r *ncReport) render() string {
	if r == nil {
		return "" // the run failed before it measured anything
	}
	var b strings.Builder
	b.WriteString("## node-cost\n\n")
	fmt.Fprintf(&b, "Run %s on kernel %s, %s (%d CPUs), commit %s; kube-apiserver and kube-proxy %s; %s; %s.  \n",
		r.Date, r.Kernel, r.CPU, r.Cores, r.Commit, r.KubeVersion, r.IPTablesVersion, r.NFTVersion)
	fmt.Fprintf(&b, "Command: `%s`  \n", r.Cmdline)
	size := "each mode's full size (iptables-legacy and nftables 10,000 services, iptables-nft 3,000)"
	if r.cfg.services > 0 {
		size = fmt.Sprintf("%d services", r.cfg.services)
	}
	fmt.Fprintf(&b, "Cluster: %s x %d endpoints, ClusterIP, one TCP port each. Phases: start-up, idle %s, churn %s at each of %s endpoint changes a second, then the drift scenario.\n\n",
		size, r.cfg.endpoints, r.cfg.idle, r.cfg.churn, joinInts(r.cfg.rates, ", "))
	if r.cfg.smoke {
		b.WriteString("**Smoke size**: the harness works; the figures mean nothing.\n\n")
	}

	b.WriteString("| mode | phase | s | exporter CPU % | exporter peak MiB | exporter children seen | kube-proxy CPU % | kube-proxy peak MiB | ratio exporter/kube-proxy CPU | max drifted during phase | endpoint changes | scrapes | load avg (1 min) | kube-proxy syncs (mean s) | kube-proxy children |\n")
	b.WriteString("|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---|---|---|\n")
	for _, m := range r.Modes {
		for _, ph := range m.Phases {
			name := ph.Name
			if ph.Name == "start-up" {
				name = fmt.Sprintf("start-up (kube-proxy synced %.0f s, exporter checked %.0f s, last read %.0f s)", m.KubeProxySynced.Seconds(), m.ExporterChecked.Seconds(), m.LastStartupRead.Seconds())
			}
			if ph.AllPhases {
				fmt.Fprintf(&b, "| %s | **%s** | %.0f | | **%.1f** | %s | | %.1f | | %s | | %d | | | %d |\n",
					m.Mode, name, ph.Wall.Seconds(), bytesMiB(ph.ExpPeak), children(ph.ExpChildren, "", ph.ExpPolled, r.ForkWatch == ""),
					bytesMiB(ph.KPPeak), num(ph.MaxDrifted, ph.Scrapes), ph.Scrapes, ph.KPChildren)
				continue
			}
			ratio := "-"
			if ph.KPCPU > 0 {
				ratio = fmt.Sprintf("%.0f%%", 100*ph.ExpCPU/ph.KPCPU)
			}
			changes := ""
			switch {
			case ph.Rate > 0:
				changes = fmt.Sprintf("%d of %d", ph.Changes, ph.Rate*int(r.cfg.churn/time.Second))
				if ph.ChangeErrors > 0 || ph.ChangesMissed > 0 {
					changes += fmt.Sprintf(" (%d failed, %d ticks missed)", ph.ChangeErrors, ph.ChangesMissed)
				}
			case ph.Changes > 0:
				changes = fmt.Sprint(ph.Changes)
			}
			syncs := fmt.Sprint(ph.KPSyncs)
			if ph.KPSyncs > 0 {
				syncs += fmt.Sprintf(" (%.2f)", ph.KPSyncSeconds/float64(ph.KPSyncs))
			}
			fmt.Fprintf(&b, "| %s | %s | %.0f | %.2f | %.1f | %s | %.2f | %.1f | %s | %s | %s | %d | %.1f → %.1f | %s | %s |\n",
				m.Mode, name, ph.Wall.Seconds(), ph.ExpCPU, bytesMiB(ph.ExpPeak),
				children(ph.ExpChildren, ph.ExpChildCmds, ph.ExpPolled, r.ForkWatch == ""),
				ph.KPCPU, bytesMiB(ph.KPPeak), ratio, num(ph.MaxDrifted, ph.Scrapes), changes, ph.Scrapes,
				ph.Load1[0], ph.Load1[1], syncs, children(ph.KPChildren, ph.KPChildCmds, -1, r.ForkWatch == ""))
		}
		if m.Err != "" && len(m.Phases) == 0 {
			fmt.Fprintf(&b, "| %s | failed before start-up | | | | | | | | | | | | | |\n", m.Mode)
		}
	}
	b.WriteString("\n")

	b.WriteString("Drift detection (kube-proxy's API connection black-holed by the fault proxy, then one endpoint of one Service replaced in the API; latency = that change to the first scrape showing `proxyhealth_service_drift_endpoints` for the Service, polled every 250 ms):\n\n")
	b.WriteString("| mode | service | drift series after s | minus grace s | grace s | target ≤ grace + 2 s | kube-proxy caught up before | drift cleared after heal |\n")
	b.WriteString("|---|---|---:|---:|---:|---|---|---|\n")
	for _, m := range r.Modes {
		l := m.Latency
		if l == nil {
			fmt.Fprintf(&b, "| %s | not run | | | | | | |\n", m.Mode)
			continue
		}
		after, minus, met := fmt.Sprintf("not within %.0f", l.Waited.Seconds()), "", "not met"
		if l.Seen {
			after = fmt.Sprintf("%.2f", l.Latency.Seconds())
			minus = fmt.Sprintf("%+.2f", (l.Latency - l.Grace).Seconds())
			if l.Latency <= l.Grace+2*time.Second {
				met = "met"
			}
		}
		cleared := "no, within " + r.cfg.healTimeout.String()
		if l.Cleared {
			cleared = fmt.Sprintf("%.1f s", l.ClearedAfter.Seconds())
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %.0f | %s | %s | %s |\n", m.Mode, l.Service, after, minus, l.Grace.Seconds(), met, yesNo(l.KubeProxyCaughtUp), cleared)
	}
	b.WriteString("\n")

	b.WriteString("Against the targets:\n\n")
	for _, m := range r.Modes {
		var startup, idle, all *ncPhase
		var churn []*ncPhase
		for _, ph := range m.Phases {
			switch {
			case ph.Name == "start-up":
				startup = ph
			case ph.Name == "idle":
				idle = ph
			case ph.Rate > 0:
				churn = append(churn, ph)
			case ph.AllPhases:
				all = ph
			}
		}
		var parts []string
		if idle != nil {
			parts = append(parts, fmt.Sprintf("idle %.2f%% of a core (≤ 1%%: %s) with %d children (none: %s)",
				idle.ExpCPU, metStr(idle.ExpCPU <= 1), idle.ExpChildren, metStr(idle.ExpChildren == 0)))
		}
		if all != nil {
			parts = append(parts, fmt.Sprintf("peak %.1f MiB start-up through churn (≤ 100 MiB: %s)", bytesMiB(all.ExpPeak), metStr(bytesMiB(all.ExpPeak) <= 100)))
		}
		falseDrift := 0.0
		for _, ph := range churn {
			if ph.KPCPU > 0 {
				parts = append(parts, fmt.Sprintf("churn %d/s %.0f%% of kube-proxy's CPU (≤ 10%%: %s)", ph.Rate, 100*ph.ExpCPU/ph.KPCPU, metStr(ph.ExpCPU <= 0.1*ph.KPCPU)))
			}
			falseDrift = max(falseDrift, ph.MaxDrifted)
		}
		if idle != nil {
			falseDrift = max(falseDrift, idle.MaxDrifted)
		}
		if len(churn) > 0 {
			parts = append(parts, fmt.Sprintf("false drift while healthy: max %.0f (none: %s)", falseDrift, metStr(falseDrift == 0)))
		}
		if startup != nil && startup.MaxDrifted > 0 {
			why := "kube-proxy's first sync was done only after the grace period, so that is real drift"
			if m.KubeProxySynced <= r.Grace {
				why = "with kube-proxy's first sync done within the grace period: false drift"
			}
			parts = append(parts, fmt.Sprintf("at start-up up to %.0f services drifted, kube-proxy's first sync taking %.0f s against a grace period of %.0f s (%s)",
				startup.MaxDrifted, m.KubeProxySynced.Seconds(), r.Grace.Seconds(), why))
		}
		if l := m.Latency; l != nil {
			if l.Seen {
				parts = append(parts, fmt.Sprintf("drift seen grace %+.1f s (≤ grace + 2 s: %s)", (l.Latency-l.Grace).Seconds(), metStr(l.Latency <= l.Grace+2*time.Second)))
			} else {
				parts = append(parts, "drift not seen (not met)")
			}
		}
		fmt.Fprintf(&b, "- %s (%d x %d, took %s): %s.\n", m.Mode, m.Services, m.Endpoints, m.Took.Round(time.Second), strings.Join(parts, "; "))
		if m.Err != "" {
			fmt.Fprintf(&b, "  - **failed**: %s\n", benchrun.Truncate(strings.ReplaceAll(m.Err, "\n", " "), 600))
		}
		for _, n := range m.Notes {
			fmt.Fprintf(&b, "  - note: %s\n", n)
		}
	}
	b.WriteString("\n")

	b.WriteString("How it was measured: kube-proxy and the exporter each run in a cgroup v1 pair of their own (cpuacct and memory, joined before `ip netns exec`), so every figure is a whole process tree's, children such as iptables-save and nft included. CPU % is the cpuacct.usage delta over the phase's wall time (100 = one core); peak MiB is memory.max_usage_in_bytes (anonymous memory, page cache and kernel memory charged to the cgroup), reset at each phase's start, so the start-up-through-churn row is the largest phase peak. ")
	if r.ForkWatch == "" {
		b.WriteString("Children are the processes each tree created during the phase, from the kernel's process events (proc connector), with the programs they ran; \"polled\" is how many of them a 100 ms poll of the exporter's cgroup.procs also caught alive. ")
	} else {
		fmt.Fprintf(&b, "Children are the distinct pids a 100 ms poll of each cgroup.procs saw besides the root (process events unavailable: %s), so short-lived ones can be missed. ", r.ForkWatch)
	}
	fmt.Fprintf(&b, "Both run in one network namespace (the node), the control plane (etcd, kube-apiserver) in another joined by a veth pair; kube-proxy reaches the apiserver through the benchmark's fault proxy, the exporter directly. The exporter is scraped over one kept-alive connection every %s while idle and every %s under churn (its scrape cost is in its figures); an endpoint change is a JSON patch replacing one address of one EndpointSlice, rotating over the Services. ",
		ncIdleScrape, r.cfg.churnScrape)
	b.WriteString("The machine's cores are shared with other work (the load average column): CPU figures are noisy, so compare the exporter with kube-proxy within one run and phase rather than across runs. Under churn kube-proxy batches every change that arrived during a sync into the next one, so when the machine is busy its syncs are fewer and longer (the syncs column, from its own sync duration histogram) and its CPU share lower than on a quiet machine: a busy machine flatters kube-proxy, not the exporter.\n\n")
	fmt.Fprintf(&b, "Exporter: %s, run as `XTABLES_LOCKFILE=<the node's> "+exporterGODEBUG+" proxyhealth %s` (defaults otherwise, and GODEBUG as the image sets; the node's own xtables lock file, shared with its kube-proxy only, since /run/xtables.lock is one for the whole machine).  \n", r.ExporterBuild, strings.Join(append([]string{"--kubeconfig=… --node-name=" + synthcluster.NodeName, "--web.listen-address=" + exporterAddr, "--kubeproxy.log-path=<kube-proxy's log>"}, r.ExporterArgs...), " "))
	for _, m := range r.Modes {
		if m.KubeProxyArgs != "" {
			fmt.Fprintf(&b, "kube-proxy (%s): `%s`.  \n", m.Mode, m.KubeProxyArgs)
		}
	}
	for _, m := range r.Modes {
		if m.Load > 0 {
			fmt.Fprintf(&b, "%s: control plane up in %.1f s; %d Services and %d EndpointSlices (%d endpoints) loaded in %.1f s (%d retried calls); kube-proxy's first sync: %d service chains.  \n",
				m.Mode, m.ControlPlaneUp.Seconds(), m.LoadStats.Services, m.LoadStats.Slices, m.LoadStats.Endpoints, m.Load.Seconds(), m.LoadStats.Retries, m.KubeProxyChains)
		}
	}
	return b.String()
}

func children(n int, cmds string, polled int, events bool) string {
	s := fmt.Sprint(n)
	if cmds != "" {
		s += " (" + cmds + ")"
	}
	if events && polled >= 0 && n > 0 {
		s += fmt.Sprintf("; polled %d", polled)
	}
	return s
}

func num(v float64, samples int) string {
	if samples == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f", v)
}

func joinInts(v []int, sep string) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = fmt.Sprint(n)
	}
	return strings.Join(s, sep)
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func metStr(ok bool) string {
	if ok {
		return "met"
	}
	return "not met"
}
