package nftnl

import (
	"encoding/binary"
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
