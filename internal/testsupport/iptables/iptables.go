// Package iptables parses the output of iptables-save (legacy and nft backends print the same
// format) into tables, chains and rules, and answers of that text the questions the exporter
// asks of the kernel's own tables: is a conntrack INVALID drop reachable from the forward path,
// and which service ports has kube-proxy programmed. The exporter does not link it (it reads
// the kernel through internal/iptlegacy and internal/nftnl); tests, fixtures and benchmarks use
// it to build and check kube-proxy-shaped tables from text.
//
// The parser is built for kube-proxy's largest tables (hundreds of thousands of rules): the
// whole input is kept as one string, every rule keeps its line as a substring of it and its
// arguments as offsets into that line, so parsing allocates per rule, not per token.
package iptables

import (
	"fmt"
	"io"
	"iter"
	"strings"
)

// Ruleset is the parsed output of one iptables-save run.
type Ruleset struct {
	Tables []*Table

	tables map[string]*Table
}

// Table returns the table with the given name ("filter", "nat", ...) or nil.
func (rs *Ruleset) Table(name string) *Table {
	if rs == nil {
		return nil
	}
	return rs.tables[name]
}

// Table is one `*name` ... `COMMIT` block.
type Table struct {
	Name   string
	Line   int // line of the `*name` header
	Chains []*Chain

	chains map[string]*Chain
}

// Chain returns the chain with the given name or nil.
func (t *Table) Chain(name string) *Chain {
	if t == nil {
		return nil
	}
	return t.chains[name]
}

// Chain is one chain declared by a `:NAME POLICY [packets:bytes]` line, with its rules in order.
type Chain struct {
	Name string
	// Policy is the built-in chain's policy (ACCEPT, DROP); empty for a user-defined chain,
	// which iptables-save declares with "-".
	Policy string
	Line   int
	Rules  []Rule
}

// Builtin reports whether the chain is a built-in chain (it has a policy).
func (c *Chain) Builtin() bool { return c.Policy != "" }

// Rule is one `-A CHAIN args...` line.
type Rule struct {
	// Line is the 1-based line number in the input.
	Line int
	// Raw is the line as written, without a leading `[packets:bytes]` counter.
	Raw string

	toks []token // the arguments after "-A <chain>"
}

// token is one argument as offsets into Rule.Raw. For a quoted argument the offsets exclude the
// quotes; escaped marks one that contains backslash escapes and must be unescaped on access.
type token struct {
	off, end uint32
	quoted   bool
	escaped  bool
}

// ParseError is a malformed line in iptables-save output.
type ParseError struct {
	Line int
	Msg  string
}

func (e *ParseError) Error() string { return fmt.Sprintf("iptables-save line %d: %s", e.Line, e.Msg) }

// maxLine bounds a single line so that token offsets fit in uint32 with room to spare.
const maxLine = 1 << 30

// Parse reads iptables-save output. It fails on the first malformed line with a *ParseError
// naming the line: a rule or chain outside a table, a rule for an undeclared chain, a table left
// without COMMIT, an unterminated quote.
func Parse(r io.Reader) (*Ruleset, error) {
	var sb strings.Builder
	if _, err := io.Copy(&sb, r); err != nil {
		return nil, fmt.Errorf("reading iptables-save output: %w", err)
	}
	return ParseString(sb.String())
}

// ParseString is Parse for output already in memory. The returned rules share memory with s.
func ParseString(s string) (*Ruleset, error) {
	p := parser{rs: &Ruleset{tables: make(map[string]*Table)}}
	lineNo := 0
	for len(s) > 0 {
		lineNo++
		var line string
		if i := strings.IndexByte(s, '\n'); i >= 0 {
			line, s = s[:i], s[i+1:]
		} else {
			line, s = s, ""
		}
		if err := p.line(lineNo, strings.TrimSuffix(line, "\r")); err != nil {
			return nil, err
		}
	}
	if p.cur != nil {
		return nil, &ParseError{Line: lineNo, Msg: fmt.Sprintf("table %q (line %d) has no COMMIT", p.cur.Name, p.cur.Line)}
	}
	return p.rs, nil
}

type parser struct {
	rs    *Ruleset
	cur   *Table
	last  *Chain
	arena []token // tokens for rules are carved out of this to avoid one allocation per rule
}

func (p *parser) errf(line int, format string, args ...any) error {
	return &ParseError{Line: line, Msg: fmt.Sprintf(format, args...)}
}

func (p *parser) line(n int, line string) error {
	if len(line) > maxLine {
		return p.errf(n, "line too long (%d bytes)", len(line))
	}
	trimmed := strings.TrimLeft(line, " \t")
	if trimmed == "" || trimmed[0] == '#' {
		return nil
	}
	switch trimmed[0] {
	case '*':
		if p.cur != nil {
			return p.errf(n, "table %q starts before table %q (line %d) is committed", trimmed[1:], p.cur.Name, p.cur.Line)
		}
		name := strings.TrimSpace(trimmed[1:])
		if name == "" || strings.ContainsAny(name, " \t") {
			return p.errf(n, "bad table header %q", line)
		}
		if _, dup := p.rs.tables[name]; dup {
			return p.errf(n, "table %q declared twice", name)
		}
		t := &Table{Name: name, Line: n, chains: make(map[string]*Chain)}
		p.rs.Tables = append(p.rs.Tables, t)
		p.rs.tables[name] = t
		p.cur, p.last = t, nil
		return nil
	case ':':
		if p.cur == nil {
			return p.errf(n, "chain declaration outside a table")
		}
		fields := strings.Fields(trimmed[1:])
		if len(fields) < 2 || len(fields) > 3 {
			return p.errf(n, "bad chain declaration %q", line)
		}
		name, policy := fields[0], fields[1]
		if policy == "-" {
			policy = ""
		}
		if _, dup := p.cur.chains[name]; dup {
			return p.errf(n, "chain %q declared twice in table %q", name, p.cur.Name)
		}
		c := &Chain{Name: name, Policy: policy, Line: n}
		p.cur.Chains = append(p.cur.Chains, c)
		p.cur.chains[name] = c
		return nil
	case '[':
		// iptables-save -c: "[packets:bytes] -A CHAIN ...".
		end := strings.IndexByte(trimmed, ']')
		if end < 0 {
			return p.errf(n, "unterminated counter %q", line)
		}
		return p.rule(n, strings.TrimLeft(trimmed[end+1:], " \t"))
	case '-':
		return p.rule(n, trimmed)
	}
	if trimmed == "COMMIT" || strings.HasPrefix(trimmed, "COMMIT ") {
		if p.cur == nil {
			return p.errf(n, "COMMIT outside a table")
		}
		p.cur, p.last = nil, nil
		return nil
	}
	return p.errf(n, "unexpected line %q", truncate(line))
}

func (p *parser) rule(n int, line string) error {
	if p.cur == nil {
		return p.errf(n, "rule outside a table")
	}
	if !strings.HasPrefix(line, "-A ") && !strings.HasPrefix(line, "--append ") {
		return p.errf(n, "expected -A, got %q", truncate(line))
	}
	toks, err := tokenize(line, &p.arena)
	if err != nil {
		return p.errf(n, "%v", err)
	}
	if len(toks) < 2 {
		return p.errf(n, "rule without a chain name")
	}
	chainName := tokString(line, toks[1])
	c := p.last
	if c == nil || c.Name != chainName {
		c = p.cur.chains[chainName]
		if c == nil {
			return p.errf(n, "rule for undeclared chain %q in table %q", chainName, p.cur.Name)
		}
		p.last = c
	}
	c.Rules = append(c.Rules, Rule{Line: n, Raw: line, toks: toks[2:]})
	return nil
}

// arenaChunk is how many tokens are allocated at a time for all rules together.
const arenaChunk = 1 << 16

// tokenize appends the tokens of line to *arena and returns them, starting a fresh chunk when
// the current one runs out (earlier rules keep their slices of the old chunk). On error the
// arena is left as it was.
func tokenize(line string, arena *[]token) ([]token, error) {
	if cap(*arena)-len(*arena) < 64 {
		*arena = make([]token, 0, arenaChunk)
	}
	start := len(*arena)
	i := 0
	for {
		for i < len(line) && (line[i] == ' ' || line[i] == '\t') {
			i++
		}
		if i >= len(line) {
			break
		}
		if len(*arena) == cap(*arena) {
			// A very long rule: move what this line has so far to a bigger chunk.
			grown := make([]token, len(*arena)-start, 2*(len(*arena)-start)+arenaChunk)
			copy(grown, (*arena)[start:])
			*arena, start = grown, 0
		}
		if line[i] == '"' {
			j := i + 1
			escaped := false
			for j < len(line) && line[j] != '"' {
				if line[j] == '\\' {
					escaped = true
					j++
				}
				j++
			}
			if j >= len(line) {
				*arena = (*arena)[:start]
				return nil, fmt.Errorf("unterminated quote at column %d", i+1)
			}
			if j+1 < len(line) && line[j+1] != ' ' && line[j+1] != '\t' {
				*arena = (*arena)[:start]
				return nil, fmt.Errorf("unexpected %q after closing quote at column %d", line[j+1], j+2)
			}
			*arena = append(*arena, token{off: uint32(i + 1), end: uint32(j), quoted: true, escaped: escaped})
			i = j + 1
			continue
		}
		j := i
		for j < len(line) && line[j] != ' ' && line[j] != '\t' {
			j++
		}
		*arena = append(*arena, token{off: uint32(i), end: uint32(j)})
		i = j
	}
	return (*arena)[start:len(*arena):len(*arena)], nil
}

func tokString(line string, t token) string {
	s := line[t.off:t.end]
	if !t.escaped {
		return s
	}
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+1 < len(s) {
			i++
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func truncate(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

// Len is the number of arguments after "-A <chain>".
func (r *Rule) Len() int { return len(r.toks) }

// Arg returns argument i (0-based, after "-A <chain>") with quotes removed and escapes resolved.
func (r *Rule) Arg(i int) string { return tokString(r.Raw, r.toks[i]) }

// Args returns all arguments after "-A <chain>". It allocates; prefer Options or Arg.
func (r *Rule) Args() []string {
	out := make([]string, len(r.toks))
	for i := range r.toks {
		out[i] = r.Arg(i)
	}
	return out
}

// isFlag reports whether argument i is an unquoted option name such as -s or --ctstate.
func (r *Rule) isFlag(i int) bool {
	t := r.toks[i]
	if t.quoted || t.end-t.off < 2 || r.Raw[t.off] != '-' {
		return false
	}
	c := r.Raw[t.off+1]
	return c < '0' || c > '9'
}

func (r *Rule) isBang(i int) bool {
	t := r.toks[i]
	return !t.quoted && t.end-t.off == 1 && r.Raw[t.off] == '!'
}

func (r *Rule) isArg(i int, names ...string) bool {
	t := r.toks[i]
	if t.quoted {
		return false
	}
	s := r.Raw[t.off:t.end]
	for _, n := range names {
		if s == n {
			return true
		}
	}
	return false
}

// Target returns the rule's -j (or -g) target, "" when it has none (a rule that only counts).
func (r *Rule) Target() string {
	t, _, _ := r.target()
	return t
}

// Goto reports whether the target is a -g (goto) rather than a -j (jump).
func (r *Rule) Goto() bool {
	_, g, _ := r.target()
	return g
}

func (r *Rule) target() (name string, isGoto bool, idx int) {
	for i := 0; i+1 < len(r.toks); i++ {
		switch {
		case r.isArg(i, "-j", "--jump"):
			return r.Arg(i + 1), false, i + 1
		case r.isArg(i, "-g", "--goto"):
			return r.Arg(i + 1), true, i + 1
		case r.isArg(i, "-m", "--match"):
			i++ // a module named "-j" is not a target
		}
	}
	return "", false, -1
}

// Option is one option of a rule: a core match (-s, -d, -p, -i, -o), a match module's option
// (--ctstate of -m conntrack, --comment of -m comment, --dport of -m tcp) or a target's option
// (--to-destination of -j DNAT).
type Option struct {
	// Module is the -m module the option belongs to, "" for core matches, or the target name
	// when Target is set.
	Module string
	// Name is the option as written, e.g. "-d" or "--ctstate".
	Name string
	// Negated is set for `! --opt value` (and the old `--opt ! value` spelling).
	Negated bool
	// Target marks an option of the -j/-g target.
	Target bool

	rule     *Rule
	vfrom, n int
}

// Value is the option's first value ("" for a flag without values, such as --random-fully).
func (o Option) Value() string {
	if o.n == 0 {
		return ""
	}
	return o.rule.Arg(o.vfrom)
}

// Values returns every value of the option (e.g. two for --match-set NAME dst,dst).
func (o Option) Values() []string {
	out := make([]string, 0, o.n)
	for i := o.vfrom; i < len(o.rule.toks) && len(out) < o.n; i++ {
		if r := o.rule; !r.isBang(i) {
			out = append(out, r.Arg(i))
		}
	}
	return out
}

// Options iterates over the rule's options in order. -m and -j/-g themselves are not options:
// see Modules and Target.
func (r *Rule) Options() iter.Seq[Option] {
	return func(yield func(Option) bool) {
		module, inTarget := "", false
		neg := false
		for i := 0; i < len(r.toks); {
			switch {
			case r.isBang(i):
				neg = true
				i++
				continue
			case r.isArg(i, "-m", "--match"):
				if i+1 < len(r.toks) {
					module = r.Arg(i + 1)
				}
				neg = false
				i += 2
				continue
			case r.isArg(i, "-j", "--jump", "-g", "--goto"):
				if i+1 < len(r.toks) {
					module = r.Arg(i + 1)
				}
				inTarget, neg = true, false
				i += 2
				continue
			case !r.isFlag(i):
				i++ // a stray value; iptables-save does not write these
				neg = false
				continue
			}
			o := Option{Module: module, Name: r.Arg(i), Negated: neg, Target: inTarget, rule: r, vfrom: i + 1}
			if !inTarget && isCoreOption(o.Name) {
				o.Module = ""
			}
			neg = false
			j := i + 1
			for ; j < len(r.toks); j++ {
				if r.isBang(j) {
					if j+1 < len(r.toks) && r.isFlag(j+1) {
						break // "!" of the next option
					}
					o.Negated = true
					continue
				}
				if r.isFlag(j) || r.isArg(j, "-m", "--match", "-j", "--jump", "-g", "--goto") {
					break
				}
				o.n++
			}
			if !yield(o) {
				return
			}
			i = j
		}
	}
}

func isCoreOption(name string) bool {
	switch name {
	case "-s", "--source", "--src", "-d", "--destination", "--dst", "-p", "--protocol",
		"-i", "--in-interface", "-o", "--out-interface", "-f", "--fragment":
		return true
	}
	return false
}

// Option returns the first option with the given name in the given module ("" for core
// matches such as -d; module is ignored when it is "*").
func (r *Rule) Option(module, name string) (Option, bool) {
	for o := range r.Options() {
		if o.Name == name && (module == "*" || o.Module == module) {
			return o, true
		}
	}
	return Option{}, false
}

// Modules iterates over the rule's -m modules in order.
func (r *Rule) Modules() iter.Seq[string] {
	return func(yield func(string) bool) {
		for i := 0; i+1 < len(r.toks); i++ {
			if r.isArg(i, "-j", "--jump", "-g", "--goto") {
				return
			}
			if r.isArg(i, "-m", "--match") {
				if !yield(r.Arg(i + 1)) {
					return
				}
				i++
			}
		}
	}
}

// Comment returns the rule's -m comment --comment text, "" when it has none.
func (r *Rule) Comment() string {
	if o, ok := r.Option("comment", "--comment"); ok {
		return o.Value()
	}
	return ""
}

// Unconditional reports whether the rule matches every packet: it has no match other than
// those that never restrict (comment, nfacct).
func (r *Rule) Unconditional() bool {
	for o := range r.Options() {
		if o.Target {
			continue
		}
		switch o.Module {
		case "comment", "nfacct":
			continue
		}
		return false
	}
	return true
}
