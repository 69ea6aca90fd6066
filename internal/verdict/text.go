package verdict

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// Field is one line of evidence for people: a dotted key and its value.
type Field struct {
	Key, Value string
}

// EvidenceFields flattens a finding's evidence (any JSON object: a typed evidence, or one
// decoded from /status) into lines, in the order of its fields: nested objects become dotted
// keys, lists of values are joined with commas, lists of objects are written "k=v k=v; ...".
// Empty lists and strings are left out.
func EvidenceFields(evidence any) []Field {
	b, err := json.Marshal(evidence)
	if err != nil {
		return []Field{{Key: "error", Value: err.Error()}}
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	v, err := readJSON(dec)
	if err != nil {
		return []Field{{Key: "error", Value: err.Error()}}
	}
	var out []Field
	flatten("", v, &out)
	return out
}

// jsonObject keeps an object's keys in order.
type jsonObject struct {
	keys []string
	vals []any
}

func readJSON(dec *json.Decoder) (any, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			obj := &jsonObject{}
			for dec.More() {
				k, err := dec.Token()
				if err != nil {
					return nil, err
				}
				v, err := readJSON(dec)
				if err != nil {
					return nil, err
				}
				obj.keys = append(obj.keys, fmt.Sprint(k))
				obj.vals = append(obj.vals, v)
			}
			_, err := dec.Token() // '}'
			return obj, err
		case '[':
			arr := []any{}
			for dec.More() {
				v, err := readJSON(dec)
				if err != nil {
					return nil, err
				}
				arr = append(arr, v)
			}
			_, err := dec.Token() // ']'
			return arr, err
		}
		return nil, fmt.Errorf("unexpected %v", t)
	case nil:
		return "null", nil
	default:
		return fmt.Sprint(t), nil
	}
}

func flatten(prefix string, v any, out *[]Field) {
	switch t := v.(type) {
	case *jsonObject:
		for i, k := range t.keys {
			key := k
			if prefix != "" {
				key = prefix + "." + k
			}
			flatten(key, t.vals[i], out)
		}
	case []any:
		if len(t) == 0 {
			return
		}
		parts := make([]string, 0, len(t))
		sep := ", "
		for _, e := range t {
			if o, ok := e.(*jsonObject); ok {
				sep = "; "
				parts = append(parts, compact(o))
			} else {
				parts = append(parts, compactValue(e))
			}
		}
		*out = append(*out, Field{Key: prefix, Value: strings.Join(parts, sep)})
	case string:
		if t == "" {
			return
		}
		*out = append(*out, Field{Key: prefix, Value: t})
	}
}

func compact(o *jsonObject) string {
	parts := make([]string, 0, len(o.keys))
	for i, k := range o.keys {
		v := compactValue(o.vals[i])
		if v == "" {
			continue
		}
		parts = append(parts, k+"="+v)
	}
	return strings.Join(parts, " ")
}

func compactValue(v any) string {
	switch t := v.(type) {
	case *jsonObject:
		return "{" + compact(t) + "}"
	case []any:
		parts := make([]string, 0, len(t))
		for _, e := range t {
			parts = append(parts, compactValue(e))
		}
		return "[" + strings.Join(parts, ", ") + "]"
	case string:
		return t
	}
	return fmt.Sprint(v)
}

// WriteText writes r for people: the verdict, each finding with its evidence and runbook, what
// could not be checked, and the notes.
func WriteText(w io.Writer, r Report) error {
	var b strings.Builder
	var crit, warn int
	for _, f := range r.Findings {
		if f.Severity == Critical {
			crit++
		} else {
			warn++
		}
	}
	node := r.Node
	if node == "" {
		node = "(unnamed)"
	}
	fmt.Fprintf(&b, "node %s: %s", node, r.Verdict)
	var counts []string
	if crit > 0 {
		counts = append(counts, fmt.Sprintf("%d critical", crit))
	}
	if warn > 0 {
		counts = append(counts, fmt.Sprintf("%d warning", warn))
	}
	if n := len(r.UncheckedCauses()); n > 0 {
		counts = append(counts, fmt.Sprintf("%d not checked", n))
	}
	if len(counts) > 0 {
		fmt.Fprintf(&b, " (%s)", strings.Join(counts, ", "))
	}
	if r.WindowSeconds > 0 {
		fmt.Fprintf(&b, ", judged over %s", formatDurationSeconds(r.WindowSeconds))
	}
	b.WriteString("\n")
	for _, f := range r.Findings {
		b.WriteString("\n")
		fmt.Fprintf(&b, "%s %s", strings.ToUpper(string(f.Severity)), f.Cause)
		if f.Service != nil {
			fmt.Fprintf(&b, " %s", f.Service)
		}
		b.WriteString("\n")
		fmt.Fprintf(&b, "  %s\n", f.Summary)
		if fields := EvidenceFields(f.Evidence); len(fields) > 0 {
			b.WriteString("  evidence:\n")
			for _, fl := range fields {
				fmt.Fprintf(&b, "    %s: %s\n", fl.Key, fl.Value)
			}
		}
		fmt.Fprintf(&b, "  runbook: %s\n", f.Runbook)
	}
	if len(r.NotChecked) > 0 {
		b.WriteString("\nnot checked:\n")
		for _, n := range r.NotChecked {
			causes := make([]string, 0, len(n.Causes))
			for _, c := range n.Causes {
				causes = append(causes, string(c))
			}
			fmt.Fprintf(&b, "  %s: %s\n", strings.Join(causes, ", "), n.Reason)
		}
	}
	if len(r.Notes) > 0 {
		b.WriteString("\nnotes:\n")
		for _, n := range r.Notes {
			fmt.Fprintf(&b, "  %s\n", n)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func formatDurationSeconds(s float64) string {
	return formatDuration(secondsDuration(s))
}
