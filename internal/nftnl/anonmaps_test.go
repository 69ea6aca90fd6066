package nftnl

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"reflect"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/proxyhealth/proxyhealth/internal/ruleset"
)

// A kept element owns its bytes: the watch reuses the buffer the message came in.
func TestElementCloneOwnsItsBytes(t *testing.T) {
	buf := []byte("keyvaluetarget")
	e := element{key: buf[0:3], value: buf[3:8], target: buf[8:14], hasVerdict: true}
	c := e.clone()
	copy(buf, bytes.Repeat([]byte{'x'}, len(buf)))
	if string(c.key) != "key" || string(c.value) != "value" || string(c.target) != "target" || !c.hasVerdict {
		t.Errorf("clone = %q %q %q %v, want key value target true", c.key, c.value, c.target, c.hasVerdict)
	}
	if c := (&element{key: []byte{1}}).clone(); c.value != nil || c.target != nil {
		t.Errorf("clone of an element without value and target has %q, %q", c.value, c.target)
	}
	// Appending to one part must not write into the next.
	c.key = append(c.key, 'Z')
	if string(c.value) != "value" {
		t.Errorf("value after an append to the key: %q", c.value)
	}
}

// Later commits' word on a name wins; a commit that dropped its maps makes everything dumped.
func TestMergeAnonSets(t *testing.T) {
	a, b := &anonSet{elems: []element{{key: []byte{0}}}}, &anonSet{}
	acc := &TableChange{}
	mergeAnonSets(acc, &TableChange{anonSets: map[string]*anonSet{"__map0": a, "__map1": b}})
	mergeAnonSets(acc, &TableChange{anonSets: map[string]*anonSet{"__map0": nil}})
	if _, ok := acc.anonSets["__map0"]; ok || acc.anonSets["__map1"] != b {
		t.Errorf("after a deletion: %v, want only __map1", acc.anonSets)
	}
	mergeAnonSets(acc, &TableChange{anonSets: map[string]*anonSet{"__map0": a}})
	mergeAnonSets(acc, &TableChange{mapsDropped: true})
	if acc.anonSets != nil {
		t.Errorf("after a commit that dropped its maps: %v, want none", acc.anonSets)
	}
}

// A followed table tells what changed since each of the tables before it, up to maxDeltas of
// them and maxDeltaChains chains.
func TestDeltasAfter(t *testing.T) {
	set := func(names ...string) map[string]struct{} {
		m := map[string]struct{}{}
		for _, n := range names {
			m[n] = struct{}{}
		}
		return m
	}
	t1 := &ruleset.ProxyTable{ID: 1}
	t2 := &ruleset.ProxyTable{ID: 2, Deltas: deltasAfter(t1, set("a"))}
	t3 := &ruleset.ProxyTable{ID: 3, Deltas: deltasAfter(t2, set("b"))}
	want := []ruleset.Delta{{Since: 2, Changed: set("b")}, {Since: 1, Changed: set("a", "b")}}
	if !reflect.DeepEqual(t3.Deltas, want) {
		t.Errorf("deltas after two changes: %v, want %v", t3.Deltas, want)
	}
	if !reflect.DeepEqual(t2.Deltas[0].Changed, set("a")) {
		t.Errorf("the earlier table's delta was modified: %v", t2.Deltas)
	}
	if d := deltasAfter(&ruleset.ProxyTable{}, set("a")); d != nil {
		t.Errorf("after a table read whole: %v, want none", d)
	}
	many := map[string]struct{}{}
	for i := range maxDeltaChains + 1 {
		many[fmt.Sprint(i)] = struct{}{}
	}
	if d := deltasAfter(t3, many); d != nil {
		t.Errorf("after %d changed chains: %v, want none", len(many), d)
	}
	tables := t1
	for id := uint64(2); id < 2*maxDeltas; id++ {
		tables = &ruleset.ProxyTable{ID: id, Deltas: deltasAfter(tables, set(fmt.Sprint(id)))}
	}
	if len(tables.Deltas) != maxDeltas || tables.Deltas[maxDeltas-1].Since != tables.ID-maxDeltas {
		t.Errorf("after many changes: %d deltas, the oldest since %d; want %d, since %d", len(tables.Deltas), tables.Deltas[len(tables.Deltas)-1].Since, maxDeltas, tables.ID-maxDeltas)
	}
}

func setEvent(typ uint16, table, set string, flags uint32) message {
	attrs := appendStrAttr(appendStrAttr(nil, unix.NFTA_SET_TABLE, table), unix.NFTA_SET_NAME, set)
	if typ == unix.NFT_MSG_NEWSET {
		attrs = appendAttr(attrs, unix.NFTA_SET_FLAGS, binary.BigEndian.AppendUint32(nil, flags))
	}
	return message{typ: typ, family: unix.NFPROTO_IPV4, attrs: attrs}
}

// elemEvent is a NEWSETELEM (or DELSETELEM) of a map from each key byte to an address and port.
func elemEvent(typ uint16, table, set string, keys ...byte) message {
	var list []byte
	for _, k := range keys {
		var e []byte
		e = appendAttr(e, unix.NFTA_SET_ELEM_KEY, appendAttr(nil, unix.NFTA_DATA_VALUE, []byte{0, 0, 0, k}))
		e = appendAttr(e, unix.NFTA_SET_ELEM_DATA, appendAttr(nil, unix.NFTA_DATA_VALUE, []byte{10, 1, 1, k, 0x1f, 0x90, 0, 0}))
		list = appendAttr(list, unix.NFTA_LIST_ELEM, e)
	}
	attrs := appendStrAttr(appendStrAttr(nil, unix.NFTA_SET_ELEM_LIST_TABLE, table), unix.NFTA_SET_ELEM_LIST_SET, set)
	attrs = appendAttr(attrs, unix.NFTA_SET_ELEM_LIST_ELEMENTS, list)
	return message{typ: typ, family: unix.NFPROTO_IPV4, attrs: attrs}
}

// The watch keeps the elements of the anonymous maps a commit creates in kube-proxy's table,
// and nothing of what it cannot vouch for: a named set, a set the commit did not create, one
// it deleted or took elements from, another table's, or more elements than it keeps.
func TestWatchKeepsAnonymousMaps(t *testing.T) {
	kp := Table{Family: unix.NFPROTO_IPV4, Name: kubeProxyTable}
	a := &changeAccumulator{keepMaps: true}
	c := commit(t, a, 1,
		setEvent(unix.NFT_MSG_NEWSET, kubeProxyTable, "__map0", unix.NFT_SET_ANONYMOUS|unix.NFT_SET_MAP|unix.NFT_SET_CONSTANT),
		elemEvent(unix.NFT_MSG_NEWSETELEM, kubeProxyTable, "__map0", 0),
		elemEvent(unix.NFT_MSG_NEWSETELEM, kubeProxyTable, "__map0", 1),
		setEvent(unix.NFT_MSG_NEWSET, kubeProxyTable, "service-ips", unix.NFT_SET_MAP),
		elemEvent(unix.NFT_MSG_NEWSETELEM, kubeProxyTable, "service-ips", 2),
		elemEvent(unix.NFT_MSG_NEWSETELEM, kubeProxyTable, "__map9", 3), // not created here
		setEvent(unix.NFT_MSG_NEWSET, kubeProxyTable, "__map1", unix.NFT_SET_ANONYMOUS),
		elemEvent(unix.NFT_MSG_NEWSETELEM, kubeProxyTable, "__map1", 4),
		elemEvent(unix.NFT_MSG_DELSETELEM, kubeProxyTable, "__map1", 4),
		setEvent(unix.NFT_MSG_DELSET, kubeProxyTable, "__map2", 0),
	)
	got := c.Touched(kp).anonSets
	m0 := got["__map0"]
	if m0 == nil || len(m0.elems) != 2 {
		t.Fatalf("__map0: %+v, want its 2 elements", m0)
	}
	if ap, ok := addrPort(unix.NFPROTO_IPV4, m0.elems[1].value); !ok || ap.String() != "10.1.1.1:8080" {
		t.Errorf("__map0's second element: %v, %v; want 10.1.1.1:8080", ap, ok)
	}
	for _, name := range []string{"service-ips", "__map1", "__map2"} {
		if s, ok := got[name]; !ok || s != nil {
			t.Errorf("%s: %+v, %v; want named as not followed (nil)", name, s, ok)
		}
	}
	if _, ok := got["__map9"]; ok {
		t.Errorf("__map9, which the commit did not create: %+v", got["__map9"])
	}

	// Another table's maps are not kept.
	nat := commit(t, a, 2,
		setEvent(unix.NFT_MSG_NEWSET, "nat", "__map0", unix.NFT_SET_ANONYMOUS),
		elemEvent(unix.NFT_MSG_NEWSETELEM, "nat", "__map0", 0))
	if s := nat.Touched(Table{Family: unix.NFPROTO_IPV4, Name: "nat"}).anonSets; s != nil {
		t.Errorf("the nat table's maps kept: %v", s)
	}

	// Past maxKeptElements the commit keeps none and says so.
	defer func(n int) { maxKeptElements = n }(maxKeptElements)
	maxKeptElements = 1
	big := commit(t, a, 3,
		setEvent(unix.NFT_MSG_NEWSET, kubeProxyTable, "__map0", unix.NFT_SET_ANONYMOUS),
		elemEvent(unix.NFT_MSG_NEWSETELEM, kubeProxyTable, "__map0", 0, 1))
	if d := big.Touched(kp); !d.mapsDropped || d.anonSets != nil {
		t.Errorf("past the bound: dropped %v, sets %v; want dropped, none", d.mapsDropped, d.anonSets)
	}
}
