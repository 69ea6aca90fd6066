package hostrules

import (
	"encoding/binary"
	"fmt"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// nftables' ruleset generation (NFT_MSG_GETGEN) counts every committed change to any nftables
// table, the ones iptables-nft writes included. Asking for it is one netlink round trip, where
// iptables-nft-save of a large nat table takes seconds: while it is unchanged, the last read
// rules still hold and only the comparison with the API runs (incident 3 is exactly "rules
// unchanged, API changed").
const (
	nfnlSubsysNFTables = 10
	nftMsgGetGen       = 16
	nftaGenID          = 1
)

// nftGeneration returns the current nftables ruleset generation of this network namespace.
func nftGeneration() (uint32, error) {
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
	if err != nil {
		return 0, fmt.Errorf("open netfilter netlink socket: %w", err)
	}
	defer conn.Close()
	msgs, err := conn.Execute(netlink.Message{
		Header: netlink.Header{
			Type:  netlink.HeaderType(nfnlSubsysNFTables<<8 | nftMsgGetGen),
			Flags: netlink.Request,
		},
		Data: []byte{unix.AF_UNSPEC, 0 /* NFNETLINK_V0 */, 0, 0},
	})
	if err != nil {
		return 0, fmt.Errorf("read nftables ruleset generation: %w", err)
	}
	for _, m := range msgs {
		if len(m.Data) < 4 {
			continue
		}
		ad, err := netlink.NewAttributeDecoder(m.Data[4:])
		if err != nil {
			return 0, fmt.Errorf("decode nftables generation: %w", err)
		}
		ad.ByteOrder = binary.BigEndian
		for ad.Next() {
			if ad.Type() == nftaGenID {
				return ad.Uint32(), nil
			}
		}
		if err := ad.Err(); err != nil {
			return 0, fmt.Errorf("decode nftables generation: %w", err)
		}
	}
	return 0, fmt.Errorf("nftables generation: no NFTA_GEN_ID in the reply")
}
