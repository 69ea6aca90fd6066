// Package testvariant derives a fast variant of the shipped alert rules
// (alerts/proxyhealth.rules.yml) for the lab: every `for:` duration and every PromQL range and
// offset in an `expr:` is divided by a factor, so that with factor 60 an alert meant to hold
// for 5 minutes over a 5-minute rate holds for 5 seconds over a 5-second rate. Everything else
// (names, labels, annotations, thresholds) is left as it is: the lab runs the shipped rules,
// only faster.
package testvariant

import (
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/prometheus/common/model"
)

var (
	forRE    = regexp.MustCompile(`^(\s*for:\s*)(\S+)(\s*)$`)
	exprRE   = regexp.MustCompile(`^(\s*)(- )?expr:\s*(.*)$`)
	rangeRE  = regexp.MustCompile(`\[([0-9]+[smhdwy][0-9smhdwy]*)(:([0-9]+[smhdwy][0-9smhdwy]*)?)?\]`)
	offsetRE = regexp.MustCompile(`(offset\s+)([0-9]+[smhdwy][0-9smhdwy]*)`)
)

// Rewrite returns rules (a Prometheus rule file) with its `for:` durations and the ranges,
// subquery steps and offsets of its expressions divided by factor, rounded up to whole seconds
// and at least one second.
func Rewrite(rules []byte, factor int) ([]byte, error) {
	if factor < 1 {
		return nil, fmt.Errorf("factor %d: want at least 1", factor)
	}
	scale := func(s string) (string, error) {
		d, err := model.ParseDuration(s)
		if err != nil {
			return "", err
		}
		secs := (time.Duration(d) + time.Duration(factor)*time.Second - 1) / (time.Duration(factor) * time.Second)
		if secs < 1 {
			secs = 1
		}
		return fmt.Sprintf("%ds", secs), nil
	}
	var firstErr error
	scaleExpr := func(line string) string {
		line = rangeRE.ReplaceAllStringFunc(line, func(m string) string {
			sub := rangeRE.FindStringSubmatch(m)
			r, err := scale(sub[1])
			if err != nil && firstErr == nil {
				firstErr = fmt.Errorf("range %s: %w", m, err)
			}
			out := "[" + r
			if sub[2] != "" {
				out += ":"
				if sub[3] != "" {
					step, err := scale(sub[3])
					if err != nil && firstErr == nil {
						firstErr = fmt.Errorf("subquery step %s: %w", m, err)
					}
					out += step
				}
			}
			return out + "]"
		})
		return offsetRE.ReplaceAllStringFunc(line, func(m string) string {
			sub := offsetRE.FindStringSubmatch(m)
			o, err := scale(sub[2])
			if err != nil && firstErr == nil {
				firstErr = fmt.Errorf("offset %s: %w", m, err)
			}
			return sub[1] + o
		})
	}

	lines := strings.Split(string(rules), "\n")
	exprIndent := -1 // inside an expr's block scalar: the indentation of its key
	exprs := 0
	for i, line := range lines {
		trimmed := strings.TrimSpace(line)
		indent := len(line) - len(strings.TrimLeft(line, " "))
		if exprIndent >= 0 {
			if trimmed == "" || indent > exprIndent {
				lines[i] = scaleExpr(line)
				continue
			}
			exprIndent = -1
		}
		if strings.HasPrefix(trimmed, "#") {
			continue
		}
		if m := forRE.FindStringSubmatch(line); m != nil {
			d, err := scale(m[2])
			if err != nil {
				return nil, fmt.Errorf("line %d: for: %w", i+1, err)
			}
			lines[i] = m[1] + d + m[3]
			continue
		}
		if m := exprRE.FindStringSubmatch(line); m != nil {
			exprs++
			keyIndent := len(m[1])
			if m[2] != "" {
				keyIndent += 2
			}
			if v := strings.TrimSpace(m[3]); v == "|" || v == ">" || strings.HasPrefix(v, "|") || strings.HasPrefix(v, ">") {
				exprIndent = keyIndent
				continue
			}
			lines[i] = scaleExpr(line)
		}
	}
	if firstErr != nil {
		return nil, firstErr
	}
	if exprs == 0 {
		return nil, fmt.Errorf("no expr found: not a rule file")
	}
	return []byte(strings.Join(lines, "\n")), nil
}
