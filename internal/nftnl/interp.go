package nftnl

import (
	"bytes"
	"encoding/binary"
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/proxyhealth/proxyhealth/internal/ruleset"
)

// A rule is a small program over registers: loads (payload, meta, ct, immediate, numgen, a map
// lookup) fill registers, cmp and lookup test them, a verdict or nat acts. ruleFacts is what
// interpreting one rule found, for the two readers: the kube-proxy table readers want the
// verdict, the dispatch match (protocol, destination address and port), the DNAT destination
// or the anonymous map it comes from; the INVALID-drop graph wants the verdict, how the rule
// matches conntrack state, and whether anything else restricts it.
type ruleFacts struct {
	verdict    ruleset.VerdictKind
	hasVerdict bool
	target     []byte // jump/goto chain, a view into the message

	proto    uint8
	hasProto bool
	daddr    netip.Addr
	dport    uint16
	hasDport bool

	ct ruleset.CtMatch
	// other is set by any match besides the dispatch fields and ct state, or one that is
	// negated or not understood: the rule is conditional.
	other bool
	// otherDispatch is set by a match the dispatch fields do not capture (a source address,
	// a negation of a dispatch field): such a KUBE-SERVICES rule is not a plain cluster IP
	// dispatch.
	otherDispatch bool

	comment []byte // from an xt comment match; the user data comment is read separately

	dnat    netip.AddrPort // a DNAT destination (xt DNAT target, or nat with immediates)
	hasDNAT bool
	// dnatMap names the anonymous map a nat expression takes its address and port from
	// (`dnat to numgen ... map { 0 : a . p }`); dnatPortOff is where the port starts in the
	// map's data.
	dnatMap     []byte
	dnatPortOff int

	// vmaps are verdict map lookups (`KEY vmap @m` / `vmap { ... }`); setLookups are plain
	// set membership tests of ct state, whose meaning depends on the set's elements.
	vmaps      []setRef
	setLookups []setRef
}

// setRef is a lookup of set (by name, a view) with a key that is ct state or something else.
type setRef struct {
	set        []byte
	keyCtState bool
	invert     bool
}

// Register file: NFT_REG_1..4 are 16 bytes each, aliasing the 4-byte NFT_REG32_00..15.
const regSlots = 16

type srcKind uint8

const (
	srcNone srcKind = iota
	srcPayload
	srcMeta
	srcCt
	srcImm
	srcMap // data of a map lookup
	srcOther
)

// regSrc is what a register holds: where it was loaded from, and a mask/xor applied since.
type regSrc struct {
	kind           srcKind
	base, off, len uint32 // payload
	key            uint32 // meta, ct
	data           []byte // immediate
	set            []byte // map lookup
	masked         bool
	mask, xor      []byte
}

// slot is one 4-byte register: the source it holds and at which byte of that source.
type slot struct {
	src int // index into interp.srcs; -1 for none
	off int
}

// interp interprets rules; it is reused across rules so a table read allocates per kept
// result, not per expression.
type interp struct {
	family uint8 // NFPROTO_IPV4, NFPROTO_IPV6, ... of the table
	srcs   []regSrc
	regs   [regSlots]slot
	f      ruleFacts
}

func regSlot(reg uint32) (int, bool) {
	switch {
	case reg >= unix.NFT_REG_1 && reg <= unix.NFT_REG_4:
		return int(reg-unix.NFT_REG_1) * 4, true
	case reg >= unix.NFT_REG32_00 && reg < unix.NFT_REG32_00+regSlots:
		return int(reg - unix.NFT_REG32_00), true
	}
	return 0, false
}

func (in *interp) reset() {
	in.srcs = in.srcs[:0]
	for i := range in.regs {
		in.regs[i] = slot{src: -1}
	}
	vm, sl := in.f.vmaps[:0], in.f.setLookups[:0]
	in.f = ruleFacts{vmaps: vm, setLookups: sl}
}

// load records that n bytes from s were written to register reg.
func (in *interp) load(reg uint32, n int, s regSrc) {
	first, ok := regSlot(reg)
	if !ok {
		in.f.other = true
		return
	}
	in.srcs = append(in.srcs, s)
	idx := len(in.srcs) - 1
	for i := 0; i*4 < max(n, 1) && first+i < regSlots; i++ {
		in.regs[first+i] = slot{src: idx, off: i * 4}
	}
}

// at returns the source register reg holds from its first byte, or nil.
func (in *interp) at(reg uint32) (*regSrc, int) {
	s, ok := regSlot(reg)
	if !ok || in.regs[s].src < 0 {
		return nil, 0
	}
	return &in.srcs[in.regs[s].src], in.regs[s].off
}

// clobber forgets every register: after an expression this reader does not decode, which may
// have written any of them.
func (in *interp) clobber() {
	for i := range in.regs {
		in.regs[i] = slot{src: -1}
	}
}

// rule interprets one rule's expression list.
func (in *interp) rule(exprs []byte) (*ruleFacts, error) {
	in.reset()
	err := eachExpr(exprs, in.expr)
	return &in.f, err
}

func (in *interp) expr(name, data []byte) {
	switch string(name) {
	case "immediate":
		in.immediate(data)
	case "payload":
		in.payload(data)
	case "meta":
		in.metaOrCt(data, srcMeta, unix.NFTA_META_DREG, unix.NFTA_META_KEY)
	case "ct":
		in.metaOrCt(data, srcCt, unix.NFTA_CT_DREG, unix.NFTA_CT_KEY)
	case "bitwise":
		in.bitwise(data)
	case "cmp":
		in.cmp(data)
	case "lookup":
		in.lookup(data)
	case "nat":
		in.nat(data)
	case "numgen":
		in.loadOther(data, nftaNumgenDreg)
	case "match":
		in.xtMatch(data)
	case "target":
		in.xtTarget(data)
	case "reject":
		in.setVerdict(ruleset.Reject, nil)
	case "counter", "log", "limit", "quota", "dynset", "objref", "connlimit", "notrack":
		// Count, log or rate-limit; `update @set` adds to a set. None decides which packets
		// reach the verdict (a limit does, but only in rate: a drop behind it still drops).
	default:
		in.f.other = true
		in.f.otherDispatch = true
		in.clobber()
	}
}

func (in *interp) setVerdict(k ruleset.VerdictKind, target []byte) {
	in.f.verdict, in.f.hasVerdict, in.f.target = k, true, target
}

func (in *interp) immediate(data []byte) {
	var dreg uint32
	var value, verdict []byte
	a := newAttrs(data)
	for a.next() {
		switch a.typ {
		case unix.NFTA_IMMEDIATE_DREG:
			dreg, _ = a.u32()
		case unix.NFTA_IMMEDIATE_DATA:
			d := newAttrs(a.val)
			for d.next() {
				switch d.typ {
				case unix.NFTA_DATA_VALUE:
					value = d.val
				case unix.NFTA_DATA_VERDICT:
					verdict = d.val
				}
			}
		}
	}
	if dreg != unix.NFT_REG_VERDICT {
		in.load(dreg, len(value), regSrc{kind: srcImm, data: value})
		return
	}
	if k, target, ok := decodeVerdict(verdict); ok {
		if k != ruleset.Continue {
			in.setVerdict(k, target)
		}
	}
}

// Netfilter's verdict codes (include/uapi/linux/netfilter.h).
const (
	nfDrop   = 0
	nfAccept = 1
)

// decodeVerdict reads NFTA_DATA_VERDICT's nest: a code (NF_DROP, NF_ACCEPT, NFT_JUMP, ...) and
// the chain of a jump or goto.
func decodeVerdict(b []byte) (ruleset.VerdictKind, []byte, bool) {
	var code int32
	var chain []byte
	hasCode := false
	a := newAttrs(b)
	for a.next() {
		switch a.typ {
		case unix.NFTA_VERDICT_CODE:
			c, ok := a.u32()
			code, hasCode = int32(c), ok
		case unix.NFTA_VERDICT_CHAIN:
			chain = a.str()
		}
	}
	if !hasCode {
		return 0, nil, false
	}
	switch code {
	case nfDrop:
		return ruleset.Drop, nil, true
	case nfAccept:
		return ruleset.Accept, nil, true
	case unix.NFT_JUMP:
		return ruleset.Jump, chain, true
	case unix.NFT_GOTO:
		return ruleset.Goto, chain, true
	case unix.NFT_RETURN:
		return ruleset.Return, nil, true
	case unix.NFT_CONTINUE, unix.NFT_BREAK:
		return ruleset.Continue, nil, true
	}
	// NF_QUEUE, NF_STOLEN, ...: the packet leaves this traversal like an accept.
	return ruleset.Accept, nil, true
}

func (in *interp) payload(data []byte) {
	var s regSrc
	var dreg uint32
	isLoad := false
	a := newAttrs(data)
	for a.next() {
		switch a.typ {
		case unix.NFTA_PAYLOAD_DREG:
			dreg, isLoad = must32(&a), true
		case unix.NFTA_PAYLOAD_BASE:
			s.base = must32(&a)
		case unix.NFTA_PAYLOAD_OFFSET:
			s.off = must32(&a)
		case unix.NFTA_PAYLOAD_LEN:
			s.len = must32(&a)
		}
	}
	if !isLoad {
		return // a payload write (mangle), not a match
	}
	s.kind = srcPayload
	in.load(dreg, int(s.len), s)
}

func must32(a *attrs) uint32 { v, _ := a.u32(); return v }

func (in *interp) metaOrCt(data []byte, kind srcKind, dregAttr, keyAttr uint16) {
	var dreg, key uint32
	isLoad := false
	a := newAttrs(data)
	for a.next() {
		switch a.typ {
		case dregAttr:
			dreg, isLoad = must32(&a), true
		case keyAttr:
			key = must32(&a)
		}
	}
	if isLoad {
		in.load(dreg, 4, regSrc{kind: kind, key: key})
	}
}

func (in *interp) loadOther(data []byte, dregAttr uint16) {
	a := newAttrs(data)
	for a.next() {
		if a.typ == dregAttr {
			in.load(must32(&a), 4, regSrc{kind: srcOther})
			return
		}
	}
}

const nftaNumgenDreg = 1 // NFTA_NUMGEN_DREG

const nftaBitwiseOp = 6 // NFTA_BITWISE_OP: absent or NFT_BITWISE_BOOL for mask and xor

func (in *interp) bitwise(data []byte) {
	var sreg, dreg uint32
	var mask, xor []byte
	boolean := true
	a := newAttrs(data)
	for a.next() {
		switch a.typ {
		case unix.NFTA_BITWISE_SREG:
			sreg = must32(&a)
		case unix.NFTA_BITWISE_DREG:
			dreg = must32(&a)
		case unix.NFTA_BITWISE_MASK:
			mask = dataValue(a.val)
		case unix.NFTA_BITWISE_XOR:
			xor = dataValue(a.val)
		case nftaBitwiseOp:
			boolean = must32(&a) == unix.NFT_BITWISE_BOOL
		}
	}
	src, off := in.at(sreg)
	if src == nil || off != 0 || src.masked || !boolean || len(mask) != len(xor) {
		in.load(dreg, len(mask), regSrc{kind: srcOther})
		return
	}
	s := *src
	s.masked, s.mask, s.xor = true, mask, xor
	in.load(dreg, len(mask), s)
}

// dataValue returns the NFTA_DATA_VALUE inside an NFTA_*_DATA-style nest.
func dataValue(b []byte) []byte {
	a := newAttrs(b)
	for a.next() {
		if a.typ == unix.NFTA_DATA_VALUE {
			return a.val
		}
	}
	return nil
}

func (in *interp) cmp(data []byte) {
	var sreg, op uint32
	var value []byte
	a := newAttrs(data)
	for a.next() {
		switch a.typ {
		case unix.NFTA_CMP_SREG:
			sreg = must32(&a)
		case unix.NFTA_CMP_OP:
			op = must32(&a)
		case unix.NFTA_CMP_DATA:
			value = dataValue(a.val)
		}
	}
	src, off := in.at(sreg)
	if src == nil || off != 0 {
		in.f.other, in.f.otherDispatch = true, true
		return
	}
	if src.kind == srcCt && src.key == unix.NFT_CT_STATE {
		in.ctStateCmp(src, op, value)
		return
	}
	in.f.other = true // every other match restricts which packets reach the verdict
	if op != unix.NFT_CMP_EQ || src.masked {
		in.f.otherDispatch = true
		return
	}
	switch {
	case src.kind == srcMeta && src.key == unix.NFT_META_L4PROTO && len(value) == 1:
		in.f.proto, in.f.hasProto = value[0], true
	case src.kind == srcPayload && src.base == unix.NFT_PAYLOAD_TRANSPORT_HEADER && src.off == 2 && len(value) == 2:
		in.f.dport, in.f.hasDport = binary.BigEndian.Uint16(value), true
	case src.kind == srcPayload && src.base == unix.NFT_PAYLOAD_NETWORK_HEADER && in.isDaddr(src.off, len(value)):
		addr, _ := netip.AddrFromSlice(value)
		in.f.daddr = addr.Unmap()
	default:
		in.f.otherDispatch = true
	}
}

// isDaddr: the IPv4 header's destination is at offset 16, IPv6's at 24.
func (in *interp) isDaddr(off uint32, n int) bool {
	switch in.family {
	case unix.NFPROTO_IPV4:
		return off == 16 && n == 4
	case unix.NFPROTO_IPV6:
		return off == 24 && n == 16
	}
	return false
}

// ctStateInvalid is conntrack's state bit for INVALID as `ct state` loads it (host order).
var ctStateInvalid = binary.NativeEndian.AppendUint32(nil, 1)

// ctStateCmp classifies a comparison of ct state (possibly masked) by evaluating it for an
// INVALID packet: if it passes, the rule matches INVALID packets; if not, it matches none.
func (in *interp) ctStateCmp(src *regSrc, op uint32, value []byte) {
	v := bytes.Clone(ctStateInvalid)
	if src.masked {
		if len(src.mask) != 4 {
			in.f.other = true
			return
		}
		for i := range v {
			v[i] = v[i]&src.mask[i] ^ src.xor[i]
		}
	}
	if len(value) != 4 || (op != unix.NFT_CMP_EQ && op != unix.NFT_CMP_NEQ) {
		in.f.other = true
		return
	}
	passes := bytes.Equal(v, value) == (op == unix.NFT_CMP_EQ)
	in.addCt(passes)
}

// addCt combines a ct state match with earlier ones: all must pass, so one that INVALID
// packets fail excludes them for the whole rule.
func (in *interp) addCt(matchesInvalid bool) {
	switch {
	case !matchesInvalid:
		in.f.ct = ruleset.CtExcludes
	case in.f.ct != ruleset.CtExcludes:
		in.f.ct = ruleset.CtInvalid
	}
}

func (in *interp) lookup(data []byte) {
	var sreg, dreg, flags uint32
	var set []byte
	hasDreg := false
	a := newAttrs(data)
	for a.next() {
		switch a.typ {
		case unix.NFTA_LOOKUP_SET:
			set = a.str()
		case unix.NFTA_LOOKUP_SREG:
			sreg = must32(&a)
		case unix.NFTA_LOOKUP_DREG:
			dreg, hasDreg = must32(&a), true
		case unix.NFTA_LOOKUP_FLAGS:
			flags = must32(&a)
		}
	}
	src, off := in.at(sreg)
	keyCt := src != nil && off == 0 && src.kind == srcCt && src.key == unix.NFT_CT_STATE && !src.masked
	ref := setRef{set: set, keyCtState: keyCt, invert: flags&unix.NFT_LOOKUP_F_INV != 0}
	switch {
	case hasDreg && dreg == unix.NFT_REG_VERDICT:
		in.f.vmaps = append(in.f.vmaps, ref)
	case hasDreg:
		// The data length is the map's; kube-proxy's address . port data is at most 20 bytes.
		in.load(dreg, 20, regSrc{kind: srcMap, set: set})
	case keyCt:
		in.f.setLookups = append(in.f.setLookups, ref)
	default:
		in.f.other, in.f.otherDispatch = true, true
	}
}

func (in *interp) nat(data []byte) {
	var typ, regAddr, regProto uint32
	hasAddr, hasProto := false, false
	a := newAttrs(data)
	for a.next() {
		switch a.typ {
		case unix.NFTA_NAT_TYPE:
			typ = must32(&a)
		case unix.NFTA_NAT_REG_ADDR_MIN:
			regAddr, hasAddr = must32(&a), true
		case unix.NFTA_NAT_REG_PROTO_MIN:
			regProto, hasProto = must32(&a), true
		}
	}
	in.setVerdict(ruleset.Accept, nil) // nat is a terminal statement
	if typ != unix.NFT_NAT_DNAT || !hasAddr {
		return
	}
	addrLen := 4
	if in.family == unix.NFPROTO_IPV6 {
		addrLen = 16
	}
	addr, aoff := in.at(regAddr)
	if addr == nil || aoff != 0 {
		return
	}
	var port *regSrc
	poff := 0
	if hasProto {
		port, poff = in.at(regProto)
	}
	switch addr.kind {
	case srcImm:
		ip, ok := netip.AddrFromSlice(addr.data)
		if !ok || len(addr.data) != addrLen || port == nil || port.kind != srcImm || poff != 0 || len(port.data) < 2 {
			return
		}
		in.f.dnat = netip.AddrPortFrom(ip.Unmap(), binary.BigEndian.Uint16(port.data))
		in.f.hasDNAT = true
	case srcMap:
		if port == nil || port != addr {
			return
		}
		in.f.dnatMap, in.f.dnatPortOff = addr.set, poff
	}
}
