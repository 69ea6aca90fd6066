package nftnl

import (
	"encoding/binary"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

func newGen(gen uint32) message {
	return message{typ: unix.NFT_MSG_NEWGEN, attrs: appendAttr(nil, unix.NFTA_GEN_ID, binary.BigEndian.AppendUint32(nil, gen))}
}

// commit feeds msgs and the commit's NEWGEN to a, and returns the Change it reports.
func commit(t *testing.T, a *changeAccumulator, gen uint32, msgs ...message) Change {
	t.Helper()
	for _, m := range msgs {
		if _, ok := a.event(m); ok {
			t.Fatalf("a Change before the commit's NEWGEN")
		}
	}
	chg, ok := a.event(newGen(gen))
	if !ok {
		t.Fatalf("no Change for generation %d", gen)
	}
	return chg
}

func chainEvent(typ uint16, chain string) message {
	attrs := appendStrAttr(appendStrAttr(nil, unix.NFTA_CHAIN_TABLE, "nat"), unix.NFTA_CHAIN_NAME, chain)
	return message{typ: typ, family: unix.NFPROTO_IPV4, attrs: attrs}
}

// A chain deleted in a commit is named as such, unless the commit created it again; over
// several commits the last one says.
func TestDeletedChains(t *testing.T) {
	nat := Table{Family: unix.NFPROTO_IPV4, Name: "nat"}
	a := &changeAccumulator{}
	c1 := commit(t, a, 1,
		chainEvent(unix.NFT_MSG_DELCHAIN, "KUBE-SEP-OLD"),
		chainEvent(unix.NFT_MSG_NEWCHAIN, "KUBE-SEP-NEW"),
		chainEvent(unix.NFT_MSG_DELCHAIN, "KUBE-SEP-BACK"),
		chainEvent(unix.NFT_MSG_NEWCHAIN, "KUBE-SEP-BACK"),
	)
	first := c1.Touched(nat)
	if !slices.Equal(first.DeletedChains, []string{"KUBE-SEP-OLD"}) {
		t.Errorf("deleted chains %v, want [KUBE-SEP-OLD]", first.DeletedChains)
	}
	c2 := commit(t, a, 2,
		chainEvent(unix.NFT_MSG_NEWCHAIN, "KUBE-SEP-OLD"),
		chainEvent(unix.NFT_MSG_DELCHAIN, "KUBE-SEP-NEW"),
	)
	second := c2.Touched(nat)
	merged := mergeDetail(mergeDetail(nil, first), second)
	if !slices.Equal(merged.DeletedChains, []string{"KUBE-SEP-NEW"}) {
		t.Errorf("deleted chains over two commits %v, want [KUBE-SEP-NEW]", merged.DeletedChains)
	}
}
