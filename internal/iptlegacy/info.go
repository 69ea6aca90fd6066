package iptlegacy

import "fmt"

// Info is what IPT_SO_GET_INFO tells about a table without copying its rules: where each
// builtin chain starts and ends, how many entries the table has and their total size.
//
// Info is comparable, so a caller can poll it cheaply (one small getsockopt) and re-read the
// rules only when it changed. It is only a hint that nothing changed: kube-proxy replacing an
// endpoint by another swaps one KUBE-SEP chain for a new one of the same shape, which keeps the
// size, the entry count and the hook offsets, so such a swap leaves Info equal. Read Info before
// the rules it stands for: a change that lands in between then shows at the next poll.
type Info struct {
	Table      string
	IPv6       bool
	ValidHooks uint32           // bit n set: the table has hook n's builtin chain
	HookEntry  [numHooks]uint32 // offset of each builtin chain's first entry
	Underflow  [numHooks]uint32 // offset of each builtin chain's policy entry
	NumEntries uint32           // entries in the table, chain heads and policies included
	Size       uint32           // bytes of the entries blob
}

// decodeInfo reads a struct ipt_getinfo (ip6t_getinfo has the same layout).
func decodeInfo(b []byte, ipv6 bool) (Info, error) {
	if len(b) < getInfoSize {
		return Info{}, fmt.Errorf("get info: %d bytes, want %d", len(b), getInfoSize)
	}
	in := Info{Table: string(cString(b[:tableNameLen])), IPv6: ipv6}
	off := tableNameLen
	u32 := func() uint32 {
		v := ne.Uint32(b[off:])
		off += 4
		return v
	}
	in.ValidHooks = u32()
	for i := range in.HookEntry {
		in.HookEntry[i] = u32()
	}
	for i := range in.Underflow {
		in.Underflow[i] = u32()
	}
	in.NumEntries = u32()
	in.Size = u32()
	return in, nil
}

// hookAt returns the hook whose builtin chain starts at off, or -1.
func (in *Info) hookAt(off int) int {
	for h := range numHooks {
		if in.ValidHooks&(1<<h) != 0 && int(in.HookEntry[h]) == off {
			return h
		}
	}
	return -1
}
