package nftnl

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/mdlayher/socket"
	"golang.org/x/sys/unix"
)

// Table names one nf_tables table.
type Table struct {
	Family uint8 // NFPROTO_IPV4, NFPROTO_IPV6, NFPROTO_INET, ...
	Name   string
}

func (t Table) String() string { return familyName(t.Family) + " " + t.Name }

// Change is one committed ruleset generation that touched a table of interest, or a loss of
// events after which everything must be re-read.
type Change struct {
	// Generation is the generation the commit produced (0 for a Resync after an overrun,
	// where it is not known).
	Generation uint32
	// Tables are the tables of interest the commit added, changed or deleted something in.
	Tables []Table
	// Resync is set when events were lost: the socket overran (ENOBUFS) or a generation was
	// skipped. The caller must re-read every table it follows.
	Resync bool
	Reason string // "overrun", "truncated datagram" or "generation gap" with Resync
	// Details says, per table of Tables (same order), what the commit touched inside it.
	Details []TableChange
}

// TableChange is what one commit touched inside one table: the names the event messages
// carry, nothing of the objects' contents.
type TableChange struct {
	Table Table
	// TableEvent: the table itself was created, deleted or updated (NEWTABLE, DELTABLE).
	TableEvent bool
	// Chains whose rules were added or deleted (NEWRULE, DELRULE), or that were created or
	// deleted (NEWCHAIN, DELCHAIN); each once, in the order first seen.
	Chains []string
	// ChainEvents are the chains of Chains that were created, deleted or updated themselves.
	ChainEvents []string
	// DeletedChains are the chains of ChainEvents whose last event in the commit deleted
	// them: gone, nothing of them is left to read.
	DeletedChains []string
	// Sets (and maps, anonymous ones too) whose elements were added or deleted (NEWSETELEM,
	// DELSETELEM), or that were created or deleted (NEWSET, DELSET).
	Sets []string
	// Overflow: the commit touched more than maxDetailNames chains and sets of the table;
	// the lists stop there and the table should be read whole.
	Overflow bool
	// BaseChainEvent: a base chain (one on a netfilter hook) was created, deleted or updated;
	// set whatever Overflow says.
	BaseChainEvent bool
	// Other: objects other than chains, rules, sets and elements changed (objects,
	// flowtables).
	Other bool
	// Rules are the rule messages, in commit order, of the chains the watch decodes
	// (FollowNATRules): a Follower applies them instead of dumping a chain a commit rewrote.
	Rules []RuleEvent
	// KeptChains are the chains of Chains whose rule messages Rules holds, all of them
	// unless RulesDropped.
	KeptChains []string
	// RulesDropped: the commit's kept rule messages were dropped (more than maxKeptRules, or
	// one the watch could not decode); Rules is then empty and the chains must be read.
	RulesDropped bool

	// anonSets are, by name, the anonymous sets the commit created, with their elements, or
	// deleted or not followed (nil), in kube-proxy's nftables tables (FollowNFTMaps).
	// mapsDropped: the commit created too many elements to keep, or was too large to follow:
	// its maps are to be dumped, and what earlier commits said of any name forgotten.
	anonSets    map[string]*anonSet
	mapsDropped bool
}

// RuleEvent is one rule a commit added or deleted in a chain the watch decodes.
type RuleEvent struct {
	Chain   string
	Handle  uint64
	Deleted bool
	// rule is what an added rule means, nil when it is deleted. Shared between events and
	// never modified.
	rule *natRule
}

// maxKeptRules bounds the rule messages one commit's TableChange keeps: a commit that
// rewrites a chain of hundreds of thousands of rules is better dumped than held.
// It is a variable so the tests can reach it with a few messages.
var maxKeptRules = 1 << 19

// maxDetailNames bounds the names a TableChange lists: a commit that rewrites a whole table
// (kube-proxy's full sync) is better re-read whole than chain by chain.
const maxDetailNames = 4096

// Touched returns the detail of table t, nil when the change does not name it.
func (c *Change) Touched(t Table) *TableChange {
	for i := range c.Details {
		if c.Details[i].Table == t {
			return &c.Details[i]
		}
	}
	return nil
}

// Watcher follows the nftables multicast group (NFNLGRP_NFTABLES). The kernel sends every
// object a commit added or deleted, then NFT_MSG_NEWGEN with the new generation; Watch keeps
// only each message's table and family and the name of the chain or set it is about, so a
// commit that rewrites kube-proxy's whole nat table (hundreds of thousands of rule messages)
// costs no decoding of rules. Its own socket rather than
// google/nftables' Monitor: that one decodes every rule of every event, leaves the table of an
// element change unknown, and its goroutine blocks on an unbuffered send once nobody reads.
type Watcher struct {
	// C delivers changes; it is closed when the watch ends (ctx cancelled, or a socket error
	// other than an overrun, see Err).
	C <-chan Change

	overruns, gaps atomic.Uint64
	done           chan struct{}
	err            error
}

// Overruns counts receive buffer overruns (ENOBUFS) and datagrams cut short: events lost.
func (w *Watcher) Overruns() uint64 { return w.overruns.Load() }

// Gaps counts generations that arrived out of sequence: a commit whose events were lost.
func (w *Watcher) Gaps() uint64 { return w.gaps.Load() }

// Done is closed once the watch's goroutine has returned and its socket is closed.
func (w *Watcher) Done() <-chan struct{} { return w.done }

// Err is why the watch ended, after Done is closed: nil when ctx was cancelled.
func (w *Watcher) Err() error {
	<-w.done
	return w.err
}

// watchRecvBuffer is the socket's receive buffer: large enough that kube-proxy's usual partial
// syncs fit between two reads, not so large that a full resync of a big table is held in
// kernel memory (that overruns, and the caller re-reads once).
// It is a variable so the tests can provoke an overrun.
var watchRecvBuffer = 8 << 20

// watchBatch datagrams of up to watchDatagramBytes each are received per system call. The
// kernel fills a notification datagram up to a page (NLMSG_GOODSIZE), or sends one larger
// message alone; a longer one is cut short, and the watch asks for a resync.
// watchDatagramBytes is a variable so the tests can cut datagrams short.
const watchBatch = 16

var watchDatagramBytes = 16 << 10

// watchBeforeReceive, when set, runs before each receive: the overrun test holds the reader
// back with it while a burst of events fills the buffer, so the overrun is certain however
// fast the reader would have been.
var watchBeforeReceive func()

// WatchOption changes what a watch reports.
type WatchOption func(*changeAccumulator)

// FollowNATRules makes the watch decode, for a Follower, the rule messages of kube-proxy's
// iptables-nft chains into TableChange.Rules: KUBE-SERVICES, which kube-proxy rewrites whole
// at every sync, and the service and endpoint chains it rewrites whole when their service
// changed. The decoded messages spare the Follower a dump of each chain a sync wrote.
func FollowNATRules() WatchOption {
	return func(a *changeAccumulator) { a.rules = newNATRuleDecoder() }
}

// ruleDecoder decodes the rule messages of the chains a watch keeps. It runs on the watch's
// goroutine, so it may keep what it learnt between messages without locks.
type ruleDecoder interface {
	keeps(t Table, chain []byte) bool
	decode(t Table, attrs []byte) (*natRule, error)
	// commitEnd is called at each commit's end.
	commitEnd()
}

// Watch subscribes to nf_tables change events of this network namespace. interest selects the
// tables whose changes are reported (nil: all). Commits that touch no table of interest are
// not reported. The watch stops, closing C and then Done, when ctx is cancelled.
func Watch(ctx context.Context, interest func(Table) bool, opts ...WatchOption) (*Watcher, error) {
	c, err := socket.Socket(unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_NETFILTER, "nftnl-watch", nil)
	if err != nil {
		return nil, socketError(err)
	}
	setup := func() error {
		if err := c.Bind(&unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
			return fmt.Errorf("bind: %w", err)
		}
		if err := c.SetsockoptInt(unix.SOL_NETLINK, unix.NETLINK_ADD_MEMBERSHIP, unix.NFNLGRP_NFTABLES); err != nil {
			if errors.Is(err, unix.EPERM) {
				return fmt.Errorf("join the nftables group: %w: %w", ErrPermission, err)
			}
			return fmt.Errorf("join the nftables group: %w", err)
		}
		// SO_RCVBUFFORCE passes the rmem_max limit with CAP_NET_ADMIN, which reading nf_tables
		// needs anyway; without it the plain limit applies.
		if err := c.SetsockoptInt(unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, watchRecvBuffer); err != nil {
			_ = c.SetReadBuffer(watchRecvBuffer)
		}
		return nil
	}
	if err := setup(); err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("watch nf_tables: %w", err)
	}
	ch := make(chan Change, 16)
	w := &Watcher{C: ch, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		defer close(ch)
		defer c.Close()
		acc := &changeAccumulator{interest: interest}
		for _, o := range opts {
			o(acc)
		}
		w.err = w.run(ctx, c, ch, acc)
	}()
	return w, nil
}

// run reads events until ctx is cancelled; a receive blocked in the kernel returns then, as
// the socket is in the runtime's poller.
func (w *Watcher) run(ctx context.Context, c *socket.Conn, ch chan<- Change, acc *changeAccumulator) error {
	batch := newRecvBatch(watchBatch, watchDatagramBytes)
	send := func(chg Change) bool {
		select {
		case ch <- chg:
			return true
		case <-ctx.Done():
			return false
		}
	}
	lost := func(reason string) bool {
		w.overruns.Add(1)
		acc.reset()
		return send(Change{Resync: true, Reason: reason})
	}
	// One goroutine cancels the receives by a deadline, rather than one per receive.
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		select {
		case <-ctx.Done():
			_ = c.SetReadDeadline(time.Unix(1, 0))
		case <-stop:
		}
	}()
	for {
		if watchBeforeReceive != nil {
			watchBeforeReceive()
		}
		n, err := batch.recv(c)
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, unix.ENOBUFS):
			if !lost("overrun") {
				return nil
			}
			continue
		case err != nil:
			return fmt.Errorf("receive nf_tables events: %w", err)
		}
		for i := range n {
			b, truncated := batch.datagram(i)
			if truncated {
				// The end of the datagram, and the events in it, are lost.
				if !lost("truncated datagram") {
					return nil
				}
				continue
			}
			for _, chg := range acc.datagram(b) {
				if chg.Reason == "generation gap" {
					w.gaps.Add(1)
				}
				if !send(chg) {
					return nil
				}
			}
		}
	}
}

// changeAccumulator turns the event stream into Changes: it collects the tables of one
// commit's messages until the commit's NEWGEN, and checks that generations follow each other.
type changeAccumulator struct {
	interest func(Table) bool
	rules    ruleDecoder // nil: no rule messages are kept
	keepMaps bool        // FollowNFTMaps
	// keptHint is the most rule messages a recent commit kept for one table: the next
	// commit's list starts that large, as kube-proxy rewrites the same chain each time.
	keptHint int
	touched  []Table
	details  []*detailAcc // by touched
	skipped  Table        // the last table found of no interest
	lastGen  uint32
	haveGen  bool
}

func (a *changeAccumulator) reset() {
	a.touched, a.details, a.haveGen = nil, nil, false
}

// detailAcc collects one table's TableChange, each name once.
type detailAcc struct {
	tc        TableChange
	seen      map[string]struct{} // "c" + chain, "e" + chain event, "s" + set
	key       []byte
	lastChain []byte // the last chain named, as a commit names one chain many times in a row

	rules ruleDecoder
	// keptChain is the chain name of the last kept rule, its string shared by its
	// RuleEvents; keptHint is the accumulator's.
	keptChain string
	keptHint  int
	// chainGone says, per chain of ChainEvents, whether its last event deleted it.
	chainGone map[string]bool

	// keepMaps: the anonymous maps of this table are kept (FollowNFTMaps, keepsMaps);
	// keptElements counts their elements.
	keepMaps     bool
	keptElements int
}

// finish completes the TableChange at the commit's end.
func (d *detailAcc) finish() {
	for _, c := range d.tc.ChainEvents {
		if d.chainGone[c] {
			d.tc.DeletedChains = append(d.tc.DeletedChains, c)
		}
	}
}

// keep records rule message m of chain if the watch keeps the chain's rules.
func (d *detailAcc) keep(m message, chain []byte) {
	if d.rules == nil || d.tc.RulesDropped || d.tc.Overflow || !d.rules.keeps(d.tc.Table, chain) {
		return
	}
	if len(d.tc.Rules) >= maxKeptRules {
		d.dropRules()
		return
	}
	var handle uint64
	found := false
	a := newAttrs(m.attrs)
	for a.next() {
		if a.typ == unix.NFTA_RULE_HANDLE {
			handle, found = a.u64()
			break
		}
	}
	if !found {
		d.dropRules()
		return
	}
	if d.keptChain != string(chain) {
		d.keptChain = string(chain)
	}
	ev := RuleEvent{Chain: d.keptChain, Handle: handle, Deleted: m.typ == unix.NFT_MSG_DELRULE}
	if !ev.Deleted {
		rule, err := d.rules.decode(d.tc.Table, m.attrs)
		if err != nil {
			// The Follower dumps the chains instead, and reports what it cannot read.
			d.dropRules()
			return
		}
		ev.rule = rule
	}
	if d.tc.Rules == nil {
		d.tc.Rules = make([]RuleEvent, 0, max(d.keptHint, 16))
	}
	d.tc.Rules = append(d.tc.Rules, ev)
}

func (d *detailAcc) dropRules() {
	d.tc.RulesDropped = true
	d.tc.Rules = nil
}

func (d *detailAcc) add(kind byte, name []byte) {
	if d.tc.Overflow {
		return
	}
	if kind == 'c' && d.lastChain != nil && bytes.Equal(d.lastChain, name) {
		return
	}
	d.key = append(append(d.key[:0], kind), name...)
	if _, ok := d.seen[string(d.key)]; ok {
		return
	}
	if len(d.seen) >= maxDetailNames {
		d.tc.Overflow = true
		d.tc.Chains, d.tc.ChainEvents, d.tc.Sets, d.seen, d.lastChain = nil, nil, nil, nil, nil
		d.tc.KeptChains = nil
		d.dropRules() // the table is read whole
		d.dropMaps()
		return
	}
	if d.seen == nil {
		d.seen = map[string]struct{}{}
	}
	d.seen[string(d.key)] = struct{}{}
	s := string(name)
	switch kind {
	case 'c':
		d.tc.Chains = append(d.tc.Chains, s)
		d.lastChain = append(d.lastChain[:0], name...)
		if d.rules != nil && d.rules.keeps(d.tc.Table, name) {
			d.tc.KeptChains = append(d.tc.KeptChains, s)
		}
	case 'e':
		d.tc.ChainEvents = append(d.tc.ChainEvents, s)
		d.add('c', name)
	case 's':
		d.tc.Sets = append(d.tc.Sets, s)
	}
}

// note records what message m says changed in the table of d.
func (d *detailAcc) note(m message) {
	switch m.typ {
	case unix.NFT_MSG_NEWTABLE, unix.NFT_MSG_DELTABLE:
		d.tc.TableEvent = true
	case unix.NFT_MSG_NEWRULE, unix.NFT_MSG_DELRULE:
		if name, ok := strAttr(m.attrs, unix.NFTA_RULE_CHAIN); ok {
			d.add('c', name)
			d.keep(m, name)
		}
	case unix.NFT_MSG_NEWCHAIN, unix.NFT_MSG_DELCHAIN:
		if name, ok := strAttr(m.attrs, unix.NFTA_CHAIN_NAME); ok {
			d.add('e', name)
			if !d.tc.Overflow {
				if d.chainGone == nil {
					d.chainGone = map[string]bool{}
				}
				d.chainGone[string(name)] = m.typ == unix.NFT_MSG_DELCHAIN
			}
		}
		if _, ok := strAttr(m.attrs, unix.NFTA_CHAIN_HOOK); ok {
			d.tc.BaseChainEvent = true
		}
	case unix.NFT_MSG_NEWSET, unix.NFT_MSG_DELSET:
		if name, ok := strAttr(m.attrs, unix.NFTA_SET_NAME); ok {
			d.add('s', name)
			d.noteSet(m, name)
		}
	case unix.NFT_MSG_NEWSETELEM, unix.NFT_MSG_DELSETELEM:
		if name, ok := strAttr(m.attrs, unix.NFTA_SET_ELEM_LIST_SET); ok {
			d.add('s', name)
			d.noteElements(m, name)
		}
	default:
		d.tc.Other = true
	}
}

// strAttr returns the first string attribute of type typ, still in the buffer.
func strAttr(b []byte, typ uint16) ([]byte, bool) {
	a := newAttrs(b)
	for a.next() {
		if a.typ == typ {
			return a.str(), true
		}
	}
	return nil, false
}

// datagram handles one received datagram of event messages.
func (a *changeAccumulator) datagram(b []byte) []Change {
	var out []Change
	// Events carry sequence number 0 (or the committer's); splitMessages is for replies, so
	// the messages are walked here.
	for len(b) >= nlmsgHdrLen {
		l := int(nativeU32(b[0:4]))
		if l < nlmsgHdrLen || l > len(b) {
			break
		}
		typ := nativeU16(b[4:6])
		payload := b[nlmsgHdrLen:l]
		b = b[min(nlmAlign(l), len(b)):]
		if typ>>8 != unix.NFNL_SUBSYS_NFTABLES || len(payload) < nfgenHdrLen {
			continue
		}
		if chg, ok := a.event(message{typ: typ & 0xff, family: payload[0], attrs: payload[nfgenHdrLen:]}); ok {
			out = append(out, chg)
		}
	}
	return out
}

// event handles one event message; it returns a Change at the end of a commit that touched a
// table of interest, or at a generation gap.
func (a *changeAccumulator) event(m message) (Change, bool) {
	if m.typ == unix.NFT_MSG_NEWGEN {
		if a.rules != nil {
			a.rules.commitEnd()
		}
		gen, ok := genID(m.attrs)
		if !ok {
			return Change{}, false
		}
		chg := Change{Generation: gen, Tables: a.touched}
		if len(a.details) > 0 {
			chg.Details = make([]TableChange, len(a.details))
			kept := 0
			for i, d := range a.details {
				d.finish()
				chg.Details[i] = d.tc
				kept = max(kept, len(d.tc.Rules))
			}
			if kept > 0 {
				a.keptHint = kept
			}
		}
		a.touched, a.details = nil, nil
		gap := a.haveGen && gen != nextGen(a.lastGen)
		a.lastGen, a.haveGen = gen, true
		if gap {
			chg.Resync, chg.Reason = true, "generation gap"
			return chg, true
		}
		return chg, len(chg.Tables) > 0
	}
	name, ok := eventTable(m)
	if !ok {
		return Change{}, false
	}
	// A commit is mostly many messages about one table: compare before making a string.
	for i, t := range a.touched {
		if t.Family == m.family && t.Name == string(name) {
			a.details[i].note(m)
			return Change{}, false
		}
	}
	if a.skipped.Family == m.family && a.skipped.Name == string(name) {
		return Change{}, false
	}
	table := Table{Family: m.family, Name: string(name)}
	if a.interest != nil && !a.interest(table) {
		a.skipped = table
		return Change{}, false
	}
	a.touched = append(a.touched, table)
	d := &detailAcc{tc: TableChange{Table: table}, rules: a.rules, keptHint: a.keptHint, keepMaps: a.keepMaps && keepsMaps(table)}
	d.note(m)
	a.details = append(a.details, d)
	return Change{}, false
}

// nextGen is the generation after g: the kernel increments it per commit, skipping 0.
func nextGen(g uint32) uint32 {
	if g+1 == 0 {
		return 1
	}
	return g + 1
}

func genID(b []byte) (uint32, bool) {
	a := newAttrs(b)
	for a.next() {
		if a.typ == unix.NFTA_GEN_ID {
			return a.u32()
		}
	}
	return 0, false
}

// eventTable returns the name of the table an event message is about: every nf_tables object message
// (table, chain, rule, set, element list, object, flowtable) names it in attribute 1.
func eventTable(m message) ([]byte, bool) {
	switch m.typ {
	case unix.NFT_MSG_NEWTABLE, unix.NFT_MSG_DELTABLE, unix.NFT_MSG_NEWCHAIN, unix.NFT_MSG_DELCHAIN,
		unix.NFT_MSG_NEWRULE, unix.NFT_MSG_DELRULE, unix.NFT_MSG_NEWSET, unix.NFT_MSG_DELSET,
		unix.NFT_MSG_NEWSETELEM, unix.NFT_MSG_DELSETELEM, unix.NFT_MSG_NEWOBJ, unix.NFT_MSG_DELOBJ,
		unix.NFT_MSG_NEWFLOWTABLE, unix.NFT_MSG_DELFLOWTABLE:
	default:
		return nil, false
	}
	a := newAttrs(m.attrs)
	for a.next() {
		if a.typ == 1 { // NFTA_TABLE_NAME, NFTA_CHAIN_TABLE, NFTA_RULE_TABLE, NFTA_SET_TABLE, ...
			return a.str(), true
		}
	}
	return nil, false
}
