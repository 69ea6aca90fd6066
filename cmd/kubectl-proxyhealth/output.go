package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/proxyhealth/proxyhealth/internal/verdict"
)

// fleetJSON is -o json without --service.
type fleetJSON struct {
	Nodes []nodeJSON `json:"nodes"`
}

type nodeJSON struct {
	Node string `json:"node"`
	// Pod is the node's exporter pod, Report its report ConfigMap (namespace/name each; ""
	// when not found).
	Pod    string `json:"pod"`
	Object string `json:"report"`
	// Verdict is unknown for a node without a report to believe (Err says why).
	Verdict      verdict.Verdict  `json:"verdict"`
	Causes       []string         `json:"causes"`
	WorstService *verdict.Service `json:"worst_service"`
	Err          string           `json:"error,omitempty"`
	// Status is the node's whole report, in the /status schema.
	Status *verdict.Report `json:"status,omitempty"`
}

// serviceJSON is -o json with --service.
type serviceJSON struct {
	Service string        `json:"service"`
	Nodes   []serviceNode `json:"nodes"`
}

func writeJSON(w io.Writer, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	_, err = w.Write(append(escapeJSON(b), '\n'))
	return err
}

// escapeJSON writes as \uXXXX escapes the non-printable runes encoding/json leaves as they are
// (DEL, C1 controls, format characters such as U+202E): the same JSON, safe on a terminal.
// Outside its strings, JSON from encoding/json holds only printable ASCII and newlines.
func escapeJSON(b []byte) []byte {
	if isPrintable(strings.ReplaceAll(string(b), "\n", "")) {
		return b
	}
	out := make([]byte, 0, len(b)+64)
	for _, r := range string(b) {
		if r == '\n' || unicode.IsPrint(r) {
			out = utf8.AppendRune(out, r)
			continue
		}
		if r1, r2 := utf16.EncodeRune(r); r1 != utf8.RuneError {
			out = fmt.Appendf(out, `\u%04x\u%04x`, r1, r2)
			continue
		}
		out = fmt.Appendf(out, `\u%04x`, r)
	}
	return out
}

func writeFleetJSON(w io.Writer, nodes []nodeStatus) error {
	out := fleetJSON{Nodes: make([]nodeJSON, 0, len(nodes))}
	for _, n := range nodes {
		out.Nodes = append(out.Nodes, nodeJSONOf(n))
	}
	return writeJSON(w, out)
}

func nodeJSONOf(n nodeStatus) nodeJSON {
	j := nodeJSON{Node: n.Node, Pod: n.Pod, Object: n.Object, Verdict: n.verdict(), Causes: []string{}, Err: n.Err, Status: n.Report}
	if n.Report != nil {
		if c := causes(n.Report); c != nil {
			j.Causes = c
		}
		j.WorstService = worstService(n.Report)
	}
	return j
}

// writeNodeText prints one node's report as `proxyhealth diagnose` prints its own (each
// finding with its evidence and runbook, what was not checked, the notes), under a line
// saying where it was read and when it was judged; or why there is none to believe.
func writeNodeText(w io.Writer, n nodeStatus) error {
	if n.Report == nil {
		_, err := fmt.Fprintf(w, "node %s: unknown\n  error: %s\n", orDash(n.Node), oneLine(n.Err))
		return err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "report %s, judged at %s\n", n.Object, n.Report.Time.UTC().Format(time.RFC3339))
	if err := verdict.WriteText(&b, *n.Report); err != nil {
		return err
	}
	// Line by line: every string in it is the exporter's.
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	for i, l := range lines {
		lines[i] = printable(l)
	}
	_, err := io.WriteString(w, strings.Join(lines, "\n")+"\n")
	return err
}

// writeFleetText prints one line per node (node, verdict, causes, worst service), problems
// first, then a count per verdict, then the nodes' notes. A node unknown because something was
// not checked names what in its causes column.
func writeFleetText(w io.Writer, nodes []nodeStatus) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tVERDICT\tCAUSES\tWORST SERVICE")
	counts := map[verdict.Verdict]int{}
	unread := 0
	for _, n := range nodes {
		counts[n.verdict()]++
		if n.Report == nil {
			unread++
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", orDash(n.Node), n.verdict(), "-", "error: "+oneLine(n.Err))
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", orDash(n.Node), printable(string(n.Report.Verdict)), orDash(causesColumn(n.Report)), worstServiceColumn(n.Report))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if _, err := fmt.Fprintf(w, "\n%s: %d critical, %d unknown (%d not read), %d warning, %d healthy\n", plural(len(nodes), "node"),
		counts[verdict.CriticalFound], counts[verdict.Unknown], unread, counts[verdict.WarningsOnly], counts[verdict.Healthy]); err != nil {
		return err
	}
	return writeNotes(w, nodes)
}

// writeNotes prints each note of the nodes' reports once, as `proxyhealth diagnose` does for
// one node, after the nodes that have it: a fleet's nodes mostly share theirs (kube-proxy's
// version). Nothing when no node has a note.
func writeNotes(w io.Writer, nodes []nodeStatus) error {
	var notes []string
	having := map[string][]string{}
	for _, n := range nodes {
		if n.Report == nil {
			continue
		}
		for _, note := range n.Report.Notes {
			if _, ok := having[note]; !ok {
				notes = append(notes, note)
			}
			having[note] = append(having[note], orDash(n.Node))
		}
	}
	if len(notes) == 0 {
		return nil
	}
	var b strings.Builder
	b.WriteString("\nnotes:\n")
	for _, note := range notes {
		fmt.Fprintf(&b, "  %s: %s\n", nodeList(having[note]), printable(note))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// nodeList names the first few nodes: "worker-1, worker-2, worker-3 and 7 more".
func nodeList(names []string) string {
	const show = 3
	if len(names) <= show {
		return strings.Join(names, ", ")
	}
	return strings.Join(names[:show], ", ") + fmt.Sprintf(" and %d more", len(names)-show)
}

// worstServiceColumn is the worst finding's Service port; on a node where no finding concerns
// one, the Service of the most INVALID packets nothing drops and its top reasons, when the
// exporter reads conntrack's INVALID log: "lab/web: 1163 INVALID (seq_over_window,
// invalid_new)".
func worstServiceColumn(r *verdict.Report) string {
	if s := worstService(r); s != nil {
		return printable(s.String())
	}
	for _, f := range r.Findings {
		if f.Cause != verdict.InvalidNotDropped {
			continue
		}
		// Decoded from /status, the evidence is a JSON object: read it as its type.
		var ev verdict.InvalidEvidence
		if b, err := json.Marshal(f.Evidence); err != nil || json.Unmarshal(b, &ev) != nil {
			continue
		}
		// The listed counts come most first: the first of each Service is its top reason.
		var top string
		total := map[string]uint64{}
		reasons := map[string][]string{}
		for _, c := range ev.ByServiceReason {
			if c.Name == "" {
				continue
			}
			svc := c.Namespace + "/" + c.Name
			total[svc] += c.Packets
			if len(reasons[svc]) < 2 {
				reasons[svc] = append(reasons[svc], c.Reason)
			}
			if top == "" || total[svc] > total[top] {
				top = svc
			}
		}
		if top != "" {
			return printable(fmt.Sprintf("%s: %d INVALID (%s)", top, total[top], strings.Join(reasons[top], ", ")))
		}
	}
	return "-"
}

// causesColumn is the findings' causes, then what could not be checked:
// "invalid_not_dropped,not checked: stale_rules".
func causesColumn(r *verdict.Report) string {
	col := printable(strings.Join(causes(r), ","))
	unchecked := r.UncheckedCauses()
	if len(unchecked) == 0 {
		return col
	}
	names := make([]string, 0, len(unchecked))
	for _, c := range unchecked {
		names = append(names, string(c))
	}
	if col != "" {
		col += ","
	}
	return col + "not checked: " + printable(strings.Join(names, ","))
}

// writeServiceText prints which nodes have stale rules for the Service, per port, then the
// nodes where it could not be judged, then how many are fine.
func writeServiceText(w io.Writer, service string, nodes []serviceNode) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	stale, fine := 0, 0
	fmt.Fprintln(tw, "NODE\tSERVICE PORT\tPROGRAMMED\tIN API\tMISSING\tSTALE\tSINCE")
	for _, n := range nodes {
		switch {
		case len(n.StaleRules) > 0:
			stale++
			for _, s := range n.StaleRules {
				fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t%s\n", orDash(n.Node), printable(s.Service.String()), s.Programmed, s.Expected,
					addrs(s.MissingCount, s.Missing), addrs(s.StaleCount, s.Stale), s.Since.UTC().Format("2006-01-02T15:04:05Z"))
			}
		case n.Err != "":
			fmt.Fprintf(tw, "%s\t%s\n", orDash(n.Node), "unknown: "+oneLine(n.Err))
		case n.NotChecked != "":
			fmt.Fprintf(tw, "%s\t%s\n", orDash(n.Node), "not checked: "+oneLine(n.NotChecked))
		default:
			fine++
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "\n%s: stale rules on %s, in step on %s, %d unknown\n",
		printable(service), plural(stale, "node"), plural(fine, "node"), len(nodes)-stale-fine)
	return err
}

// addrs is a count with the addresses that fit: "3 (10.244.3.11:8080, ...)".
func addrs(count int, list []string) string {
	if count == 0 {
		return "0"
	}
	const show = 3
	shown := list[:min(len(list), show)]
	s := strconv.Itoa(count) + " (" + printable(strings.Join(shown, ", "))
	if count > len(shown) {
		s += ", ..."
	}
	return s + ")"
}

func plural(n int, one string) string {
	if n == 1 {
		return "1 " + one
	}
	return strconv.Itoa(n) + " " + one + "s"
}

// orDash is s as printable, or "-" for nothing.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return printable(s)
}

// oneLine keeps an error on its table row, printable: an API server's error may carry the
// response body.
func oneLine(s string) string {
	s = printable(strings.Join(strings.Fields(s), " "))
	if len(s) > 300 {
		s = strings.ToValidUTF8(s[:297], "") + "..."
	}
	return s
}
