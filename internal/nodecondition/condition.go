// Package nodecondition publishes a node's verdict on its Node object, the way
// node-problem-detector does: a ProxyHealthy condition that `kubectl describe node` shows, and
// Events on the Node (and on the Service, for stale rules) when a critical finding appears.
//
// The condition follows the verdict (verdict.Judge): False while a critical finding stands, with
// a reason named after its cause (StaleRules, BridgeNetfilterOff, ...) and its summary as the
// message; Unknown, reason NotChecked, while a cause could not be checked and nothing critical
// was found (the node is not known healthy, as a Node's Ready is Unknown when the kubelet stops
// reporting); True otherwise, warnings named in the message. It is patched when it changes and,
// as a heartbeat, at most every heartbeat interval otherwise.
package nodecondition

import (
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"

	"github.com/proxyhealth/proxyhealth/internal/verdict"
)

// ConditionType is the Node condition proxyhealth owns.
const ConditionType corev1.NodeConditionType = "ProxyHealthy"

// ReasonHealthy is the condition's reason while it is True.
const ReasonHealthy = "ProxyHealthy"

// ReasonNotChecked is the condition's reason while it is Unknown.
const ReasonNotChecked = "NotChecked"

// Reasons names each cause as a condition and Event reason (CamelCase, as Kubernetes reasons
// are). Like the causes, a reason is never renamed.
var Reasons = map[verdict.Cause]string{
	verdict.StaleRules:             "StaleRules",
	verdict.KubeProxyWatchFailing:  "KubeProxyWatchFailing",
	verdict.KubeProxyStuck:         "KubeProxyStuck",
	verdict.KubeProxyDown:          "KubeProxyDown",
	verdict.KubeProxySyncFailing:   "KubeProxySyncFailing",
	verdict.BridgeNetfilterOff:     "BridgeNetfilterOff",
	verdict.InvalidNotDropped:      "InvalidNotDropped",
	verdict.ConntrackTableFull:     "ConntrackTableFull",
	verdict.ConntrackInsertFailing: "ConntrackInsertFailing",
	verdict.APIViewStale:           "APIViewStale",
	verdict.UnrepliedFlows:         "UnrepliedFlows",
}

// Reason is cause's reason; a cause missing from Reasons (none is) gets a generic one rather
// than an invalid reason.
func Reason(cause verdict.Cause) string {
	if r, ok := Reasons[cause]; ok {
		return r
	}
	return "ProxyUnhealthy"
}

// maxMessage bounds a condition's or Event's message: the summary of one finding and a count
// of the others fit easily; the API server would take more, but `kubectl describe` would not
// be readable.
const maxMessage = 1024

// state is what the condition says, and which critical findings it stands for.
type state struct {
	status  corev1.ConditionStatus
	reason  string
	message string
	// critical are the keys of the critical findings, in the report's order.
	critical []findingKey
}

// findingKey tells findings apart across reports: the cause and the Service port.
type findingKey struct {
	cause   verdict.Cause
	service string // "" for a node-wide cause
}

func keyOf(f verdict.Finding) findingKey {
	k := findingKey{cause: f.Cause}
	if f.Service != nil {
		k.service = f.Service.String()
	}
	return k
}

// conditionOf is what rep's verdict makes the condition say: False with the worst critical
// finding's cause and summary (findings come worst first); Unknown, naming what could not be
// checked and why; or True, naming the warnings.
func conditionOf(rep verdict.Report) state {
	var crit []verdict.Finding
	var warnings []string
	for _, f := range rep.Findings {
		if f.Severity == verdict.Critical {
			crit = append(crit, f)
		} else if c := string(f.Cause); !slices.Contains(warnings, c) {
			warnings = append(warnings, c)
		}
	}
	warned := ""
	if len(warnings) > 0 {
		warned = " Warnings: " + strings.Join(warnings, ", ") + "."
	}
	switch verdict.Judge(rep.Findings, rep.NotChecked) {
	case verdict.CriticalFound:
		s := state{status: corev1.ConditionFalse, reason: Reason(crit[0].Cause)}
		msg := crit[0].Summary
		if len(crit) > 1 {
			var others []string
			for _, f := range crit[1:] {
				if c := string(f.Cause); !slices.Contains(others, c) {
					others = append(others, c)
				}
			}
			msg += fmt.Sprintf(" (%d more critical: %s)", len(crit)-1, strings.Join(others, ", "))
		}
		s.message = truncate(msg, maxMessage)
		for _, f := range crit {
			s.critical = append(s.critical, keyOf(f))
		}
		return s
	case verdict.Unknown:
		var why []string
		for _, n := range rep.NotChecked {
			if len(n.Causes) == 0 {
				continue
			}
			causes := make([]string, 0, len(n.Causes))
			for _, c := range n.Causes {
				causes = append(causes, string(c))
			}
			why = append(why, strings.Join(causes, ", ")+" ("+n.Reason+")")
		}
		msg := "Not known healthy: no critical finding, but could not check " + strings.Join(why, "; ") + "." + warned
		return state{status: corev1.ConditionUnknown, reason: ReasonNotChecked, message: truncate(msg, maxMessage)}
	}
	return state{status: corev1.ConditionTrue, reason: ReasonHealthy, message: "No critical finding." + warned}
}

// sameStory tells whether two states tell the same thing, wording aside: a message that only
// updates a count or a duration waits for the heartbeat.
func (s state) sameStory(o state) bool {
	return s.status == o.status && s.reason == o.reason && slices.Equal(s.critical, o.critical)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	// Cut on a rune boundary.
	cut := n - len("...")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}
