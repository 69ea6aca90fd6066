package nftnl

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// appendAttr appends one netlink attribute (host-order header, value padded to 4 bytes).
func appendAttr(b []byte, typ uint16, val []byte) []byte {
	l := 4 + len(val)
	b = binary.NativeEndian.AppendUint16(b, uint16(l))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = append(b, val...)
	for range (4 - l%4) % 4 {
		b = append(b, 0)
	}
	return b
}

func appendStrAttr(b []byte, typ uint16, s string) []byte {
	return appendAttr(b, typ, append([]byte(s), 0))
}

// errInterrupted: the kernel flagged a dump NLM_F_DUMP_INTR because the ruleset changed while
// it was being dumped; the read is retried.
var errInterrupted = errors.New("nf_tables dump interrupted by a ruleset change")

// maxAttempts bounds the retries of a read that a concurrent commit made inconsistent.
const maxAttempts = 5

// wholeDump runs dump, one multi-part dump, until no commit cut it: a cut dump may have
// skipped or repeated entries, so reset forgets what the cut one gave before each try.
func wholeDump(reset func(), dump func() error) error {
	var err error
	for range maxAttempts {
		reset()
		if err = dump(); !errors.Is(err, errInterrupted) {
			return err
		}
	}
	return fmt.Errorf("no uninterrupted dump in %d attempts: %w", maxAttempts, err)
}

// consistently runs read until it completes within one ruleset generation: a read made of
// several requests (a table's rules, then its maps' elements) is consistent only if no commit
// came in between, and a single dump is flagged interrupted if one came during it.
func consistently(ctx context.Context, q querier, read func() error) error {
	_, err := consistentlyAt(ctx, q, read)
	return err
}

// consistentlyAt is consistently, returning the generation the read is consistent with.
func consistentlyAt(ctx context.Context, q querier, read func() error) (uint32, error) {
	var err error
	for range maxAttempts {
		var before, after uint32
		if before, err = generation(ctx, q); err != nil {
			return 0, err
		}
		err = read()
		if errors.Is(err, errInterrupted) {
			continue
		}
		if err != nil {
			return 0, err
		}
		if after, err = generation(ctx, q); err != nil {
			return 0, err
		}
		if before == after {
			return after, nil
		}
		err = fmt.Errorf("ruleset generation moved from %d to %d during the read", before, after)
	}
	return 0, fmt.Errorf("no consistent read in %d attempts: %w", maxAttempts, err)
}

// generation asks for the current ruleset generation (NFT_MSG_GETGEN).
func generation(ctx context.Context, q querier) (uint32, error) {
	var gen uint32
	found := false
	err := q.query(ctx, request{typ: unix.NFT_MSG_GETGEN, family: unix.AF_UNSPEC}, func(m message) error {
		if m.typ != unix.NFT_MSG_NEWGEN {
			return nil
		}
		a := newAttrs(m.attrs)
		for a.next() {
			if a.typ == unix.NFTA_GEN_ID {
				gen, found = a.u32()
			}
		}
		return nil
	})
	if errors.Is(err, unix.EINVAL) {
		// The request has no attributes to be wrong: nfnetlink found no nf_tables subsystem
		// to hand it to.
		err = fmt.Errorf("%w: %w", ErrNotSupported, err)
	}
	if err != nil {
		return 0, fmt.Errorf("read nf_tables generation: %w", err)
	}
	if !found {
		return 0, errors.New("read nf_tables generation: no NFTA_GEN_ID in the reply")
	}
	return gen, nil
}

// Generation returns the current nf_tables ruleset generation of this network namespace. Every
// committed change to any nf_tables table (iptables-nft's included) moves it, so while it holds
// the last read still holds. It costs one netlink round trip, whose one short reply is read
// under the default Limits.
func Generation(ctx context.Context) (uint32, error) {
	var gen uint32
	err := withSocket(Limits{}, func(q querier) error {
		var err error
		gen, err = generation(ctx, q)
		return err
	})
	return gen, err
}

// exists asks for one object by name (a table, or a chain with chain set) and reports false
// when the kernel answers ENOENT.
func exists(ctx context.Context, q querier, family uint8, table, chain string) (bool, error) {
	req := request{typ: unix.NFT_MSG_GETTABLE, family: family, attrs: appendStrAttr(nil, unix.NFTA_TABLE_NAME, table)}
	if chain != "" {
		attrs := appendStrAttr(nil, unix.NFTA_CHAIN_TABLE, table)
		req = request{typ: unix.NFT_MSG_GETCHAIN, family: family, attrs: appendStrAttr(attrs, unix.NFTA_CHAIN_NAME, chain)}
	}
	err := q.query(ctx, req, func(message) error { return nil })
	switch {
	case errors.Is(err, unix.ENOENT):
		return false, nil
	case err != nil:
		return false, err
	}
	return true, nil
}

// dumpRules streams the rules of one table, or of one chain of it when chain is set.
func dumpRules(ctx context.Context, q querier, family uint8, table, chain string, fn func(r *ruleMsg) error) error {
	attrs := appendStrAttr(nil, unix.NFTA_RULE_TABLE, table)
	if chain != "" {
		attrs = appendStrAttr(attrs, unix.NFTA_RULE_CHAIN, chain)
	}
	return q.query(ctx, request{typ: unix.NFT_MSG_GETRULE, family: family, dump: true, attrs: attrs}, func(m message) error {
		if m.typ != unix.NFT_MSG_NEWRULE {
			return nil
		}
		r, err := parseRule(m.attrs)
		if err != nil {
			return fmt.Errorf("rule message of table %s: %w", table, err)
		}
		return fn(&r)
	})
}

func isNotExist(err error) bool { return errors.Is(err, unix.ENOENT) }
