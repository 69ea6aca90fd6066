package verdict

import (
	"fmt"
	"regexp"
	"strings"
)

// kube-proxy's failing rule syncs (kube_proxy_sync_failing): what failed, since when, the error
// it logged, and a remedy that fits. kube-proxy retries a failed sync every sync period and
// stays healthy throughout, and a restart writes the same rules again: when the node cannot
// take them (a kernel module it lacks, an iptables or nft that does not match its kernel) the
// error names the cause, and mending that is what applies the rules at the next retry.

func (e *evaluation) syncFailuresEvidence() *SyncFailuresEvidence {
	k := e.in.KubeProxy
	ev := &SyncFailuresEvidence{
		Failed:       k.SyncFailures,
		Total:        max(k.SyncFailuresTotal, k.SyncFailures),
		Since:        k.SyncFailingSince.UTC(),
		NeverApplied: k.SyncNeverApplied,
		IPFamilies:   k.SyncFailingFamilies,
		Tool:         k.SyncTool,
		Error:        k.SyncError,
	}
	if ev.Tool == "" {
		ev.Tool = "iptables-restore"
		if e.in.Rules.Mode == "nftables" {
			ev.Tool = "nft"
		}
	}
	if ev.Tool == "iptables-restore" && len(ev.IPFamilies) == 1 && ev.IPFamilies[0] == "IPv6" {
		ev.Tool = "ip6tables-restore" // what kube-proxy's IPv6 proxier runs
	}
	if !k.SyncErrorAt.IsZero() {
		ev.ErrorAt = k.SyncErrorAt.UTC()
	}
	if ev.Error == "" {
		switch {
		case k.LogErr != "":
			ev.ErrorNotRead = k.LogErr
		case len(k.LogFiles) == 0:
			ev.ErrorNotRead = "no kube-proxy log file found (see --kubeproxy.log-path)"
		default:
			ev.ErrorNotRead = "kube-proxy's log has no failed sync since it was first read"
		}
	}
	ev.Remedy = syncRemedy(ev.Tool, ev.Error)
	return ev
}

// syncFailureClause says what failed: "kube-proxy cannot apply its rules: 12 iptables-restore
// runs failed in a row since 2026-11-28T08:01:02Z (line 3: RULE_APPEND failed ...)". In IPVS
// mode (mode "ipvs") only its iptables rules fail: the clause says so.
func syncFailureClause(ev *SyncFailuresEvidence, mode string) string {
	what := plural(ev.Failed, ev.Tool+" run", ev.Tool+" runs")
	if ev.Tool == "nft" {
		what = plural(ev.Failed, "nftables transaction", "nftables transactions")
	}
	var when string
	switch {
	case ev.NeverApplied && !ev.Since.IsZero():
		when = fmt.Sprintf("every sync since it started at %s failed (%s)", formatTime(ev.Since), what)
	case ev.NeverApplied:
		when = fmt.Sprintf("every sync since it started failed (%s)", what)
	case ev.Failed == 1:
		when = fmt.Sprintf("its last sync failed (%s at %s)", what, formatTime(ev.Since))
	default:
		when = fmt.Sprintf("%s failed in a row since %s", what, formatTime(ev.Since))
	}
	rules := "rules"
	if mode == "ipvs" {
		rules = "iptables rules"
	}
	if len(ev.IPFamilies) > 0 {
		rules = strings.Join(ev.IPFamilies, " and ") + " " + rules
	}
	rules = "its " + rules
	clause := "kube-proxy cannot apply " + rules + ": " + when
	if ev.Error != "" {
		clause += fmt.Sprintf(", last error %q", ev.Error)
	}
	return clause
}

// syncFailureEffect is what failing syncs leave on the node in kube-proxy's mode, and how bad
// that is: from its start (neverApplied) or once the rules were programmed.
//
// In iptables and nftables mode a failed sync applies nothing: a new node has none of its
// Service rules, a node whose syncs fail later keeps its last ones while the API moves on. In
// IPVS mode the same sync programs the virtual servers, their real servers, the addresses on
// kube-ipvs0 and the ipsets before the iptables-restore that fails (pkg/proxy/ipvs/proxier.go,
// syncProxyRules, v1.34 to v1.37), so those follow the API whatever the restore does; what
// fails is the iptables rules (masquerade, KUBE-NODE-PORT, the filter chains), which kube-proxy
// writes mostly as matches on those ipsets, and the clean-up after the restore (the virtual
// servers of deleted Services). A new or rebooted node then has its chains, empty (kube-proxy
// creates them with iptables, not the restore): connections that need its masquerade fail. A
// kube-proxy restarted on a node keeps what the one before it wrote. A node whose restores fail later keeps rules that match the
// updated ipsets, so its Service traffic flows; what a first Service of a kind needs (the
// NodePort or external-IP rules written only while their ipset has entries, load-balancer
// source ranges) is not written.
func syncFailureEffect(mode string, neverApplied bool) (Severity, string) {
	switch {
	case mode == "ipvs" && neverApplied:
		return Critical, ": its IPVS virtual servers are programmed, but none of its iptables rules since it started; on a new or rebooted node its chains are empty " +
			"and connections that need its masquerade fail: from this node's own addresses (host-network Pods) to Services whose endpoints are on other nodes, " +
			"and NodePort traffic sent on to another node"
	case mode == "ipvs":
		return Warning, ": its IPVS virtual servers still follow Service and endpoint changes, but its iptables rules stay as they were " +
			"(what a first NodePort, external-IP or load-balancer Service needs is not written) and deleted Services keep their virtual servers"
	case neverApplied:
		return Critical, ", so this node has none of its Service rules"
	}
	return Warning, ": no Service or endpoint change reaches this node's rules"
}

// Errors that name their cause.
var (
	// iptables: "Warning: Extension ipvs revision 0 not supported, missing kernel module?",
	// "Couldn't load match `nfacct':No such file or directory".
	reExtensionMissing = regexp.MustCompile("Extension ([A-Za-z0-9_]+) revision [0-9]+ not supported|Couldn't load (?:match|target) `([A-Za-z0-9_]+)'")
	// Another program holds the iptables lock past kube-proxy's wait.
	reXtablesLock = regexp.MustCompile(`(?i)xtables lock|holding the xtables`)
	// The tool itself cannot be run.
	reNotFound = regexp.MustCompile(`executable file not found|exec: "[^"]*": `)
)

// syncRemedy is what to do about syncs that keep failing, from the error when it names the
// cause; never a restart, which writes the same rules again.
func syncRemedy(tool, errText string) string {
	const noRestart = "restarting kube-proxy does not help, it writes the same rules again"
	// kube-proxy retries a failed sync every sync period, except its first: that one is
	// tried again only at the next Service or endpoint change, or the hourly full sync.
	const afterFix = "once fixed, kube-proxy applies its rules at its next sync, or at once when restarted."
	if m := reExtensionMissing.FindStringSubmatch(errText); m != nil {
		ext := m[1] + m[2]
		return fmt.Sprintf("the %s extension %q is not supported by this node's kernel: load its kernel module (for a match, modprobe xt_%s) or run a kernel that has it (%s); %s",
			tool, ext, strings.ToLower(ext), noRestart, afterFix)
	}
	switch {
	case reXtablesLock.MatchString(errText):
		return fmt.Sprintf("another program holds the xtables lock (/run/xtables.lock) past kube-proxy's wait: find it (fuser -v /run/xtables.lock) and stop it (%s); %s", noRestart, afterFix)
	case reNotFound.MatchString(errText):
		return fmt.Sprintf("kube-proxy cannot run %s: its image or PATH lacks it; fix kube-proxy's image.", tool)
	case errText == "":
		return fmt.Sprintf("read the error in kube-proxy's log (\"%s\") and fix what it names: a kernel module or feature the node lacks, an %s that does not match the kernel, a rule another program wrote (%s); %s",
			syncFailureMessage(tool), tool, noRestart, afterFix)
	}
	return fmt.Sprintf("fix what the error names: a kernel module or feature the node lacks, an %s that does not match the kernel, a rule another program wrote (%s); %s", tool, noRestart, afterFix)
}

// syncFailureMessage is what kube-proxy logs when tool fails a sync.
func syncFailureMessage(tool string) string {
	if tool == "nft" {
		return "nftables sync failed"
	}
	return "Failed to execute iptables-restore"
}

// sentenceEnd ends s with a full stop.
func sentenceEnd(s string) string {
	if strings.HasSuffix(s, ".") {
		return s
	}
	return s + "."
}
