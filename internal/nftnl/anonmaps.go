package nftnl

// kube-proxy's nftables mode writes a service port's endpoints into an anonymous map of the
// rule that picks one (`numgen random mod N map { 0 : ADDR . PORT, ... }`, or a vmap of
// endpoint chains with ClientIP affinity). The kernel names it __mapN and announces it with the
// commit that writes the rule: NEWSET, then NEWSETELEM with its elements, all of them, since an
// anonymous set is constant once its rule binds it. Reading such a map back is a dump whose
// lookup of the set by name walks every set of the table (about one per Service): under
// endpoint churn at 10,000 Services those dumps were 40% of the exporter's CPU in nftables
// mode, and they grow with the table. With FollowNFTMaps the watch keeps the elements of the
// anonymous maps each commit creates in kube-proxy's tables, and the Follower resolves the
// maps of the chains a commit rewrote from them, dumping only those it was not told of.

import (
	"errors"

	"golang.org/x/sys/unix"
)

// maxKeptElements bounds the map elements one commit keeps for one table: past it (kube-proxy's
// full sync of a large cluster) the commit's maps are dumped, as that table is read whole anyway.
// A variable so the tests can reach it.
var maxKeptElements = 1 << 14

// anonSet is what a commit left of an anonymous set: nil when it deleted the set, or when what
// it did to it cannot be followed (the Follower dumps the set then); else every element.
type anonSet struct {
	elems []element // their bytes copied out of the messages
}

// FollowNFTMaps makes the watch keep, for a Follower, the elements of the anonymous maps each
// commit creates in kube-proxy's nftables-mode tables (ip and ip6 kube-proxy).
func FollowNFTMaps() WatchOption {
	return func(a *changeAccumulator) { a.keepMaps = true }
}

func keepsMaps(t Table) bool {
	return t.Name == kubeProxyTable && (t.Family == unix.NFPROTO_IPV4 || t.Family == unix.NFPROTO_IPV6)
}

// noteSet follows a NEWSET or DELSET message of set name.
func (d *detailAcc) noteSet(m message, name []byte) {
	if !d.keepMaps || d.tc.mapsDropped {
		return
	}
	var s *anonSet
	if m.typ == unix.NFT_MSG_NEWSET {
		a := newAttrs(m.attrs)
		for a.next() {
			if a.typ == unix.NFTA_SET_FLAGS {
				if f, ok := a.u32(); ok && f&unix.NFT_SET_ANONYMOUS != 0 {
					s = &anonSet{}
				}
				break
			}
		}
	}
	if d.tc.anonSets == nil {
		d.tc.anonSets = map[string]*anonSet{}
	}
	d.tc.anonSets[string(name)] = s
}

// noteElements follows a NEWSETELEM or DELSETELEM message of set name: the added elements of a
// set the commit created are kept; anything else makes the set one to dump.
func (d *detailAcc) noteElements(m message, name []byte) {
	if !d.keepMaps || d.tc.mapsDropped {
		return
	}
	s, ok := d.tc.anonSets[string(name)]
	if !ok || s == nil {
		// Not a set this commit created: a named set, which the Follower dumps whatever it is
		// told, or one it had already given up on.
		return
	}
	if m.typ == unix.NFT_MSG_DELSETELEM {
		d.tc.anonSets[string(name)] = nil
		return
	}
	err := eachElement(m.attrs, func(e *element) error {
		if d.keptElements >= maxKeptElements {
			return errTooMany
		}
		d.keptElements++
		s.elems = append(s.elems, e.clone())
		return nil
	})
	switch {
	case errors.Is(err, errTooMany):
		d.dropMaps()
	case err != nil:
		d.tc.anonSets[string(name)] = nil
	}
}

// dropMaps gives up keeping the commit's maps: the Follower dumps them, and forgets what
// earlier commits told it (this one may have deleted and created again any of those names).
func (d *detailAcc) dropMaps() {
	d.tc.mapsDropped = true
	d.tc.anonSets = nil
}

// errTooMany stops a walk of elements past maxKeptElements.
var errTooMany = errors.New("too many elements")

// clone copies e's bytes out of the message buffer, which the watch reuses, into one array.
func (e *element) clone() element {
	c := *e
	buf := make([]byte, len(e.key)+len(e.value)+len(e.target))
	cut := func(b []byte) []byte {
		if b == nil {
			return nil
		}
		n := copy(buf, b)
		out := buf[:n:n]
		buf = buf[n:]
		return out
	}
	c.key, c.value, c.target = cut(e.key), cut(e.value), cut(e.target)
	return c
}

// mergeAnonSets adds what change d says of anonymous sets to what acc knows from the changes
// before it.
func mergeAnonSets(acc, d *TableChange) {
	if d.mapsDropped {
		acc.anonSets = nil
		return
	}
	for name, s := range d.anonSets {
		if s == nil {
			delete(acc.anonSets, name)
			continue
		}
		if acc.anonSets == nil {
			acc.anonSets = map[string]*anonSet{}
		}
		acc.anonSets[name] = s
	}
}
