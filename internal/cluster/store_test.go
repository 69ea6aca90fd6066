package cluster

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// recordingState is a state whose callbacks are recorded.
type recordingState struct {
	*state
	changed  map[objKey]bool
	all      int
	heard    int
	syncedAt int // how many kinds had been replaced when synced was called; 0: not called
	replaced int
}

func newRecordingState(nodeName string) *recordingState {
	r := &recordingState{state: newState(nodeName), changed: map[objKey]bool{}}
	r.state.changed = func(k objKey, all bool) {
		if all {
			r.all++
		} else {
			r.changed[k] = true
		}
	}
	r.state.heard = func() { r.heard++ }
	r.state.synced = func() { r.syncedAt = r.replaced + 1 }
	return r
}

func (r *recordingState) store(k kind) kindStore { return kindStore{r.state, k} }

func (r *recordingState) reset() { r.changed, r.all = map[objKey]bool{}, 0 }

func (r *recordingState) sliceNames(svc string) []string {
	_, sls := r.service(keyOf("ns", svc))
	var names []string
	for _, s := range sls {
		names = append(names, s.key.name)
	}
	slices.Sort(names)
	return names
}

// sliceKeys lists every slice kept, under whichever Service.
func (r *recordingState) sliceKeys() []objKey {
	var keys []objKey
	for _, e := range r.entries {
		for _, s := range e.slices {
			keys = append(keys, s.key)
		}
	}
	return keys
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestStore(t *testing.T) {
	r := newRecordingState("node-a")
	svcs, sls, nodes := r.store(kindService), r.store(kindSlice), r.store(kindNode)

	must(t, svcs.Replace([]any{service("a"), service("b"), service("mesh", func(s *corev1.Service) {
		s.Labels = map[string]string{labelServiceProxyName: "other"}
	})}, "1"))
	// A streamed list hands over objects its Transformer already converted.
	converted, err := sls.Transformer()(epSlice("a-1", "a", ipv4, httpPort, apiEP("10.0.0.1", "")))
	must(t, err)
	must(t, sls.Replace([]any{converted, epSlice("a-2", "a", ipv4, httpPort), epSlice("b-1", "b", ipv4, httpPort)}, "1"))
	if r.syncedAt != 0 || r.hasSynced() {
		t.Fatal("synced before every kind was listed")
	}
	if len(r.changed) != 0 || r.all != 0 {
		t.Errorf("changes reported before the sync (which reports them all): %v, all %d", r.changed, r.all)
	}
	r.replaced = 2
	must(t, nodes.Replace([]any{node("node-b", "zone-b"), node("node-a", "zone-a")}, "1"))
	if r.syncedAt != 3 || !r.hasSynced() {
		t.Fatalf("synced callback after %d lists, hasSynced %v; want after the third", r.syncedAt-1, r.hasSynced())
	}
	if zone, found := r.thisNode(); zone != "zone-a" || !found {
		t.Errorf("this node: zone %q, found %v; want zone-a (other nodes ignored)", zone, found)
	}
	if got := r.serviceKeys(); len(got) != 2 {
		t.Errorf("services kept %v, want a and b (not the other proxy's)", got)
	}
	if got := r.sliceNames("a"); !slices.Equal(got, []string{"a-1", "a-2"}) {
		t.Errorf("slices of a: %v", got)
	}
	if r.heard != 3 {
		t.Errorf("heard %d times, want once per list", r.heard)
	}

	r.reset()
	// A slice moves to another Service: both change.
	must(t, sls.Update(epSlice("a-2", "b", ipv4, httpPort)))
	if got := r.sliceNames("b"); !slices.Equal(got, []string{"a-2", "b-1"}) || !slices.Equal(r.sliceNames("a"), []string{"a-1"}) {
		t.Errorf("after the move: a %v, b %v", r.sliceNames("a"), got)
	}
	if !r.changed[keyOf("ns", "a")] || !r.changed[keyOf("ns", "b")] {
		t.Errorf("changed %v, want a and b", r.changed)
	}

	r.reset()
	// A slice that gains the headless label, and one without a Service label, are dropped.
	headless := epSlice("b-1", "b", ipv4, httpPort)
	headless.Labels[corev1.IsHeadlessService] = ""
	must(t, sls.Update(headless))
	must(t, sls.Add(&discoveryv1.EndpointSlice{ObjectMeta: epSlice("x", "", ipv4, nil).ObjectMeta}))
	if got := r.sliceNames("b"); !slices.Equal(got, []string{"a-2"}) || len(r.sliceKeys()) != 2 {
		t.Errorf("after the headless label: b %v, slices kept %v", got, r.sliceKeys())
	}

	r.reset()
	// A Service turned ExternalName is no longer kept; deleting its slice works from the
	// deleted object's last state.
	must(t, svcs.Update(service("a", func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeExternalName })))
	if svc, _ := r.service(keyOf("ns", "a")); svc != nil || !r.changed[keyOf("ns", "a")] {
		t.Errorf("ExternalName Service still kept (%v) or not marked changed (%v)", svc, r.changed)
	}
	must(t, sls.Delete(epSlice("a-1", "a", ipv4, httpPort)))
	if slices.Contains(r.sliceKeys(), keyOf("ns", "a-1")) {
		t.Error("deleted slice still kept")
	}

	r.reset()
	// A relist drops what is gone and marks every Service before and after changed.
	must(t, svcs.Replace([]any{service("c")}, "2"))
	if got := r.serviceKeys(); len(got) != 1 || got[0] != keyOf("ns", "c") {
		t.Errorf("after the relist: %v", got)
	}
	for _, k := range []string{"b", "c"} {
		if !r.changed[keyOf("ns", k)] {
			t.Errorf("relist did not mark %s changed: %v", k, r.changed)
		}
	}
	// Entries hold what is left: c's Service, and the slice a-2 naming b, whose Service is
	// gone; a's entry, with neither, is removed.
	if e := r.lookup(keyOf("ns", "b")); len(r.entries) != 2 || e == nil || e.svc != nil || len(e.slices) != 1 {
		t.Errorf("entries after the relist: %d, b's %+v", len(r.entries), e)
	}

	r.reset()
	// The node: an update of another label changes nothing, a zone change everything.
	n := node("node-a", "zone-a")
	n.Labels["x"] = "y"
	must(t, nodes.Update(n))
	if r.all != 0 {
		t.Error("a node update without a zone change marked every Service")
	}
	must(t, nodes.Update(node("node-a", "zone-b")))
	must(t, nodes.Delete(node("node-a", "")))
	if _, found := r.thisNode(); found || r.all != 2 {
		t.Errorf("after a zone change and the delete: found %v, all marked %d times; want not found, twice", found, r.all)
	}

	heard := r.heard
	must(t, sls.Bookmark("9"))
	if r.heard != heard+1 {
		t.Error("a bookmark is not heard")
	}
	if err := svcs.Add(node("n", "")); err == nil {
		t.Error("a Node given to the Service store: no error")
	}
}

// Slices are kept under the Service they name; the lookups for their earlier versions.
func TestStoreSliceLookups(t *testing.T) {
	r := newRecordingState("node-a")
	sls := r.store(kindSlice)
	must(t, r.store(kindService).Replace([]any{service("a"), service("b")}, "1"))
	must(t, sls.Replace([]any{epSlice("x-1", "a", ipv4, httpPort)}, "1"))
	must(t, r.store(kindNode).Replace(nil, "1"))
	count := func() int { return len(r.sliceKeys()) }

	// Added again (a watch would not): replaced, not doubled.
	must(t, sls.Add(epSlice("x-1", "a", ipv4, httpPort, apiEP("10.0.0.1", ""))))
	if count() != 1 || len(r.sliceNames("a")) != 1 {
		t.Fatalf("after a second add: %v", r.sliceKeys())
	}
	// Loses its label: dropped from a.
	must(t, sls.Update(epSlice("x-1", "", ipv4, httpPort)))
	if count() != 0 {
		t.Fatalf("after losing its label: %v", r.sliceKeys())
	}
	// Gains one again, naming b: kept under b.
	must(t, sls.Update(epSlice("x-1", "b", ipv4, httpPort)))
	if got := r.sliceNames("b"); count() != 1 || !slices.Equal(got, []string{"x-1"}) {
		t.Fatalf("after gaining a label: %v", r.sliceKeys())
	}
	// Deleted with a last state that names another Service (or none): found anyway.
	r.reset()
	must(t, sls.Delete(epSlice("x-1", "a", ipv4, httpPort)))
	if count() != 0 || !r.changed[keyOf("ns", "b")] {
		t.Fatalf("after the delete: %v, changed %v", r.sliceKeys(), r.changed)
	}
	// An entry that named a slice but no kept Service is gone with the slice.
	must(t, sls.Add(epSlice("y-1", "nosuch", ipv4, httpPort)))
	must(t, sls.Delete(epSlice("y-1", "nosuch", ipv4, httpPort)))
	if r.lookup(keyOf("ns", "nosuch")) != nil {
		t.Error("an empty entry is left behind")
	}
}

// checkEntries fails t unless the entries are sorted by key, one per key, none empty, and
// each holds only objects of its key.
func checkEntries(t *testing.T, s *state) {
	t.Helper()
	for i := range s.entries {
		e := &s.entries[i]
		if e.empty() {
			t.Fatalf("entry %d is empty", i)
		}
		if i > 0 && compareKeys(s.entries[i-1].key(), e.key()) >= 0 {
			t.Fatalf("entries %d and %d out of order: %v, %v", i-1, i, s.entries[i-1].key(), e.key())
		}
		if e.svc != nil && e.svc.key != e.key() {
			t.Fatalf("entry %v holds the Service %v", e.key(), e.svc.key)
		}
		for _, sl := range e.slices {
			if sl.serviceKey() != e.key() {
				t.Fatalf("entry %v holds the slice %v of %v", e.key(), sl.key, sl.serviceKey())
			}
		}
	}
}

// The entries stay sorted, one per key, through lists in any order (a namespace "a-b" comes
// before "a" in etcd's key order, after it in the view's), slices of one Service that are not
// listed together ("web-1", "web-api-1", "web-2"), relists and single changes.
func TestStoreEntriesSorted(t *testing.T) {
	svc := func(ns, name string) *corev1.Service {
		return service(name, func(s *corev1.Service) { s.Namespace = ns })
	}
	slice := func(ns, name, service string) *discoveryv1.EndpointSlice {
		s := epSlice(name, service, ipv4, httpPort, apiEP("10.0.0.1", ""))
		s.Namespace = ns
		return s
	}
	r := newRecordingState("node-a")
	svcs, sls := r.store(kindService), r.store(kindSlice)
	must(t, sls.Replace([]any{
		slice("a-b", "web-1", "web"), slice("a", "web-1", "web"), slice("a", "web-api-1", "web-api"),
		slice("a", "web-2", "web"), slice("a", "zz-1", "zz"), slice("b", "x-1", "x"),
	}, "1"))
	checkEntries(t, r.state)
	must(t, svcs.Replace([]any{svc("b", "x"), svc("a-b", "web"), svc("a", "web-api"), svc("a", "web"), svc("a", "aa")}, "1"))
	checkEntries(t, r.state)
	must(t, r.store(kindNode).Replace(nil, "1"))
	if got := len(r.entries); got != 6 {
		t.Errorf("%d entries, want 6 (a/aa, a/web, a/web-api, a/zz, a-b/web, b/x)", got)
	}
	_, webSlices := r.service(keyOf("a", "web"))
	if len(webSlices) != 2 {
		t.Errorf("a/web has %d slices, want 2", len(webSlices))
	}
	if got := r.serviceKeys(); len(got) != 5 || got[0] != keyOf("a", "aa") || got[4] != keyOf("b", "x") {
		t.Errorf("service keys %v, want a/aa first and b/x last of 5", got)
	}

	// Single changes insert and remove in place.
	must(t, svcs.Add(svc("a", "ab")))
	must(t, svcs.Add(svc("0", "first")))
	must(t, sls.Add(slice("c", "last-1", "last")))
	must(t, svcs.Delete(svc("a", "aa")))
	must(t, sls.Update(slice("a", "web-2", "web-api"))) // moves to a/web-api
	must(t, sls.Delete(slice("a", "zz-1", "zz")))       // a/zz had nothing else
	checkEntries(t, r.state)
	want := []objKey{keyOf("0", "first"), keyOf("a", "ab"), keyOf("a", "web"), keyOf("a", "web-api"), keyOf("a-b", "web"), keyOf("b", "x"), keyOf("c", "last")}
	var got []objKey
	for i := range r.entries {
		got = append(got, r.entries[i].key())
	}
	if !slices.Equal(got, want) {
		t.Errorf("entries %v, want %v", got, want)
	}

	// A relist of the slices keeps the Services' entries and drops c/last.
	must(t, sls.Replace([]any{slice("a", "web-1", "web"), slice("d", "new-1", "new")}, "2"))
	checkEntries(t, r.state)
	if got := len(r.entries); got != 7 || r.lookup(keyOf("c", "last")) != nil {
		t.Errorf("after the relist: %d entries, c/last %v; want 7 without c/last", got, r.lookup(keyOf("c", "last")))
	}
	if cap(r.entries) > len(r.entries)+len(r.entries)/8+1 {
		t.Errorf("entries hold %d with room for %d", len(r.entries), cap(r.entries))
	}
}
