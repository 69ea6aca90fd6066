package iptlegacy

import (
	"strings"

	"github.com/proxyhealth/proxyhealth/internal/ruleset"
)

// Conntrack state matches, from include/uapi/linux/netfilter/xt_conntrack.h and xt_state.h.
// A packet conntrack calls INVALID has exactly the state bit 0 (XT_STATE_INVALID,
// XT_CONNTRACK_STATE_INVALID): the kernel sets the SNAT/DNAT bits only for packets that have a
// conntrack entry.
const (
	stateInvalid = 1 << 0

	ctFlagState      = 1 << 0  // XT_CONNTRACK_STATE: --ctstate given
	ctFlagStateAlias = 1 << 13 // XT_CONNTRACK_STATE_ALIAS: written as -m state --state
)

type stateName struct {
	bit  uint32
	name string
}

// ctStateNames are the conntrack match's state bits in the order iptables prints them:
// XT_CONNTRACK_STATE_BIT(ctinfo) is 1 << (ctinfo % IP_CT_IS_REPLY + 1), and SNAT, DNAT and
// UNTRACKED follow at 1 << (IP_CT_NUMBER + 1, 2, 3), IP_CT_NUMBER being 5.
var ctStateNames = []stateName{
	{stateInvalid, "INVALID"}, {1 << 3, "NEW"}, {1 << 2, "RELATED"}, {1 << 1, "ESTABLISHED"},
	{1 << 8, "UNTRACKED"}, {1 << 6, "SNAT"}, {1 << 7, "DNAT"},
}

// stateMatchNames are the state match's: the same, but XT_STATE_UNTRACKED is
// 1 << (IP_CT_NUMBER + 1), and there is no SNAT or DNAT.
var stateMatchNames = []stateName{
	{stateInvalid, "INVALID"}, {1 << 3, "NEW"}, {1 << 2, "RELATED"}, {1 << 1, "ESTABLISHED"},
	{1 << 6, "UNTRACKED"},
}

// ctState is what a conntrack or state match says about INVALID packets.
type ctState struct {
	ct        ruleset.CtMatch
	restricts bool // it tests something besides the state (--ctstatus, --ctorigsrc, ...)
	mask      uint32
	inverted  bool
	alias     bool // iptables writes it as -m state
	names     []stateName
}

// ctStateOf reads a conntrack (revisions 1 to 3) or state match; ok is false for any other
// match. A revision it does not know restricts, with no state.
//
// INVALID packets match a state test when the mask has the INVALID bit, or, inverted (! --ctstate),
// when it does not: `! --ctstate NEW,ESTABLISHED,RELATED,UNTRACKED -j DROP` drops INVALID
// packets. (internal/testsupport/iptables' text check counts only a positive list that names INVALID; the
// two agree on every rule that names INVALID.)
func ctStateOf(m ext) (st ctState, ok bool) {
	d := m.data
	switch string(m.name) {
	case "state":
		// struct xt_state_info { unsigned int statemask; }: no invert flag, iptables inverts
		// the mask itself.
		if len(d) < 4 {
			return ctState{restricts: true}, true
		}
		st.mask, st.alias, st.names = ne.Uint32(d), true, stateMatchNames
	case "conntrack":
		// struct xt_conntrack_mtinfo1 to 3: eight nf_inet_addr (128 bytes), expires_min and
		// _max, l4proto, four ports, then match_flags at 146, invert_flags at 148 and
		// state_mask at 150: a u8 in revision 1, a u16 from revision 2 on.
		if m.rev < 1 || m.rev > 3 || len(d) < 152 {
			return ctState{restricts: true}, true
		}
		flags, inv := ne.Uint16(d[146:]), ne.Uint16(d[148:])
		st.restricts = flags&^(ctFlagState|ctFlagStateAlias) != 0
		st.alias = flags&ctFlagStateAlias != 0
		st.names = ctStateNames
		if flags&ctFlagState == 0 {
			return st, true
		}
		st.mask = uint32(d[150])
		if m.rev >= 2 {
			st.mask = uint32(ne.Uint16(d[150:]))
		}
		st.inverted = inv&ctFlagState != 0
	default:
		return ctState{}, false
	}
	if (st.mask&stateInvalid != 0) != st.inverted {
		st.ct = ruleset.CtInvalid
	} else {
		st.ct = ruleset.CtExcludes
	}
	return st, true
}

// combineCt folds a rule's ct state matches: all must match, so one that excludes INVALID
// packets wins.
func combineCt(a, b ruleset.CtMatch) ruleset.CtMatch {
	if a == ruleset.CtExcludes || b == ruleset.CtExcludes {
		return ruleset.CtExcludes
	}
	return max(a, b)
}

// stateList prints the state mask as iptables does ("INVALID,NEW").
func (st *ctState) stateList() string {
	var parts []string
	for _, s := range st.names {
		if st.mask&s.bit != 0 {
			parts = append(parts, s.name)
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ",")
}
