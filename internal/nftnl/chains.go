package nftnl

import (
	"context"
	"encoding/binary"
	"fmt"

	"golang.org/x/sys/unix"
)

// baseChain is a chain attached to a netfilter hook.
type baseChain struct {
	family      uint8
	table, name string
	hook        uint32
	priority    int32
}

// dumpBaseChains lists the base chains of every table of every family. Regular chains are
// skipped as they stream by: iptables-nft's nat table alone has one per service and endpoint.
func dumpBaseChains(ctx context.Context, q querier) ([]baseChain, error) {
	var out []baseChain
	err := q.query(ctx, request{typ: unix.NFT_MSG_GETCHAIN, family: unix.NFPROTO_UNSPEC, dump: true}, func(m message) error {
		if m.typ != unix.NFT_MSG_NEWCHAIN {
			return nil
		}
		var c baseChain
		var table, name []byte
		isBase := false
		a := newAttrs(m.attrs)
		for a.next() {
			switch a.typ {
			case unix.NFTA_CHAIN_TABLE:
				table = a.str()
			case unix.NFTA_CHAIN_NAME:
				name = a.str()
			case unix.NFTA_CHAIN_HOOK:
				h := newAttrs(a.val)
				for h.next() {
					switch h.typ {
					case unix.NFTA_HOOK_HOOKNUM:
						c.hook, isBase = must32(&h), true
					case unix.NFTA_HOOK_PRIORITY:
						if len(h.val) == 4 {
							c.priority = int32(binary.BigEndian.Uint32(h.val))
						}
					}
				}
			}
		}
		if a.bad {
			return errMalformed
		}
		if isBase {
			c.family, c.table, c.name = m.family, string(table), string(name)
			out = append(out, c)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list nf_tables chains: %w", err)
	}
	return out, nil
}

// hookForward is NF_INET_FORWARD, and the forward hook's number in the arp and bridge
// families too; netdev has no forward hook (its 0 and 1 are ingress and egress).
const hookForward = 2

func isForward(c baseChain) bool {
	return c.hook == hookForward && c.family != unix.NFPROTO_NETDEV
}
