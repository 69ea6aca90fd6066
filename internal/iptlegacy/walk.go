package iptlegacy

import "fmt"

// A table's blob is its chains one after the other. A builtin chain starts at its hook_entry
// offset; a user chain starts with an entry whose ERROR target carries the chain's name (the
// head, not a rule), and its first rule follows the head: that is the offset a jump to the
// chain names. Every chain ends with one entry that is not a rule either: a builtin chain's
// policy, a user chain's unconditional RETURN. The table ends with an ERROR entry of its own.
// This is how libiptc, and so iptables-save, splits the blob.

// visitor receives a table's chains and rules in blob order.
type visitor interface {
	// chain starts a chain; firstRule is the offset a jump into it names. name is valid only
	// during the call, as a rule's entry is: most chains of kube-proxy's nat table are
	// endpoint chains, whose names the nat decoder does not keep.
	chain(name []byte, builtin bool, firstRule int) error
	// rule is the chain's rule number num (1-based, as iptables numbers them). Its entry is
	// valid only during the call: the blob behind it may be released afterwards.
	rule(e entry, num int) error
}

// releaseEvery is how many bytes of blob walk lets pass before it offers them for release: few
// madvise calls, and at most this much of the blob resident behind the decoder. (A variable
// so that tests can release after every entry.)
var releaseEvery = 4 << 20

// walk splits blob into chains and rules and hands them to v. release, when not nil, is called
// with a blob offset below which walk and v no longer need the blob, so its pages can be given
// back while the rest is decoded. It checks the blob against info: entry count and that each
// builtin chain starts on an entry.
func walk(info *Info, blob []byte, v visitor, release func(upTo int)) error {
	c := cursor{blob: blob, l: layoutFor(info.IPv6)}
	var (
		pending    entry // the chain's latest entry: a rule unless it turns out to be its last
		hasPending bool
		inChain    bool
		num        int // rules of the current chain so far
		entries    int
		hooksSeen  uint32
		released   int
		ended      bool
	)
	for c.more() {
		e, err := c.next()
		if err != nil {
			return err
		}
		entries++
		name, isHead := e.target().errorName()
		hook := info.hookAt(e.off)
		if isHead || hook >= 0 {
			hasPending = false // the previous chain's policy or RETURN
			num = 0
		}
		switch {
		case isHead && !c.more():
			ended = true
			continue
		case isHead:
			if hook >= 0 {
				return fmt.Errorf("entry at offset %d: builtin chain %s starts on an ERROR entry", e.off, hookChain[hook])
			}
			inChain = true
			if err := v.chain(name, false, e.off+len(e.raw)); err != nil {
				return err
			}
			continue
		case hook >= 0:
			hooksSeen |= 1 << hook
			inChain = true
			if err := v.chain([]byte(hookChain[hook]), true, e.off); err != nil {
				return err
			}
		case !inChain:
			return fmt.Errorf("entry at offset %d belongs to no chain", e.off)
		}
		if hasPending {
			num++
			if err := v.rule(pending, num); err != nil {
				return err
			}
		}
		pending, hasPending = e, true
		if release != nil && pending.off-released >= releaseEvery {
			released = pending.off
			release(released)
		}
	}
	switch {
	case !ended:
		return fmt.Errorf("table %s does not end with its ERROR entry", info.Table)
	case entries != int(info.NumEntries):
		return fmt.Errorf("table %s has %d entries, its info says %d: it changed while read", info.Table, entries, info.NumEntries)
	case hooksSeen != info.ValidHooks&(1<<numHooks-1):
		return fmt.Errorf("table %s: builtin chains found for hooks %#x, its info says %#x: it changed while read", info.Table, hooksSeen, info.ValidHooks)
	}
	return nil
}
