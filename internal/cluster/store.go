package cluster

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/tools/cache"
)

// kind is one of the three resources the view watches.
type kind int

const (
	kindService kind = iota
	kindSlice
	kindNode
	numKinds
)

// state is the view's copy of the API in compact form: the Services kube-proxy programs, the
// EndpointSlices it reads indexed by their Service, and this node. The reflectors write it
// through one kindStore each; the recompute reads it. Objects are immutable, so a reader may
// keep using what it took out after the lock is released.
type state struct {
	nodeName string
	// changed is told which Service's ports may have changed (all: the node's zone, which
	// selects topology hints for every Service), after the change is in place, once every
	// kind has been listed. heard is told of every event and list: each is proof the
	// connection to the API works. synced is called once, when every kind has been listed.
	changed func(key objKey, all bool)
	heard   func()
	synced  func()

	mu sync.Mutex
	// entries are the Services and their slices, sorted by key (namespace, then name), one
	// entry per key: 32 bytes each, where a map of entries cost about 90 (its slots, and a
	// pointer to each entry). The slices are kept under the Service they name: an update or
	// delete finds a slice there (its label does not change), and only otherwise searches
	// every Service's (see putSlice). A map by the slices' own keys would cost more than all
	// the Services' entries.
	entries []serviceEntry
	node    *nodeInfo // nil until this node is seen
	listed  [numKinds]bool
}

// serviceEntry is what one Service key has: the Service, and the slices that name it (by
// their kubernetes.io/service-name label). Either may come first; an entry with neither is
// removed, so the key is always that of one of them.
type serviceEntry struct {
	svc    *serviceInfo // nil while the Service is not kept (not seen yet, deleted, or not programmed)
	slices []*sliceInfo
}

func (e *serviceEntry) key() objKey {
	if e.svc != nil {
		return e.svc.key
	}
	return e.slices[0].serviceKey()
}

func (e *serviceEntry) empty() bool { return e.svc == nil && len(e.slices) == 0 }

// compareKeys orders keys by namespace, then name.
func compareKeys(a, b objKey) int {
	if a.namespace != b.namespace {
		return strings.Compare(a.namespace.Value(), b.namespace.Value())
	}
	return strings.Compare(a.name, b.name)
}

func newState(nodeName string) *state {
	return &state{
		nodeName: nodeName,
		changed:  func(objKey, bool) {},
		heard:    func() {},
		synced:   func() {},
	}
}

// hasSynced is whether every kind has been listed once.
func (s *state) hasSynced() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.allListed()
}

func (s *state) allListed() bool {
	for _, l := range s.listed {
		if !l {
			return false
		}
	}
	return true
}

// service returns a Service and its slices (a copy of the list), or nil when the Service is
// not kept.
func (s *state) service(key objKey) (*serviceInfo, []*sliceInfo) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.lookup(key)
	if e == nil || e.svc == nil {
		return nil, nil
	}
	return e.svc, slices.Clone(e.slices)
}

// serviceKeys lists the Services kept, sorted.
func (s *state) serviceKeys() []objKey {
	s.mu.Lock()
	defer s.mu.Unlock()
	keys := make([]objKey, 0, len(s.entries))
	for i := range s.entries {
		if e := &s.entries[i]; e.svc != nil {
			keys = append(keys, e.svc.key)
		}
	}
	return keys
}

// thisNode returns this node's zone, and whether its Node object exists.
func (s *state) thisNode() (zone string, found bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.node == nil {
		return "", false
	}
	return s.node.zone, true
}

// kept reports whether the store keeps an object at all: kube-proxy lists Services without
// the service-proxy-name label and EndpointSlices without the headless label
// (cmd/kube-proxy/app/server.go), and a skipped Service has no ports to compute. The list
// selectors already leave those out; checking again here keeps them out of a watch that does
// not apply the selectors, and drops an object that gained such a label.
func (s *state) kept(obj any) bool {
	switch o := obj.(type) {
	case *serviceInfo:
		return !o.skip && !o.otherProxy && o.clusterIPCount > 0
	case *sliceInfo:
		return o.service != "" && !o.headless // endpointSliceCacheKeys needs the label
	case *nodeInfo:
		return o.name == s.nodeName // the field selector's job; a fake ignores it
	}
	return false
}

// changedLocked reports a change once the view is synced; until then nothing is reported,
// since the sync itself reports every Service, and marking each of 10,000 on the way would
// only add to the initial list's peak. The caller holds mu.
func (s *state) changedLocked(key objKey, all bool) {
	if s.allListed() {
		s.changed(key, all)
	}
}

// search is where key's entry is, or would be inserted. The caller holds mu.
func (s *state) search(key objKey) (int, bool) {
	return slices.BinarySearchFunc(s.entries, key, compareEntryKey)
}

// lookup returns key's entry, or nil. The pointer is good until entries are added or removed.
// The caller holds mu.
func (s *state) lookup(key objKey) *serviceEntry {
	if i, found := s.search(key); found {
		return &s.entries[i]
	}
	return nil
}

// insert adds e, which holds an object, at its place; no entry of its key may exist. The caller
// holds mu.
func (s *state) insert(e serviceEntry) {
	i, _ := s.search(e.key())
	s.entries = slices.Insert(s.entries, i, e)
}

// removeIfEmpty removes entry i once it holds nothing, before anything searches the entries
// again (an empty entry has no key). The caller holds mu.
func (s *state) removeIfEmpty(i int) {
	if s.entries[i].empty() {
		s.entries = slices.Delete(s.entries, i, i+1)
	}
}

// put adds or replaces one object; for a slice, scan says whether its previous version may
// be under another Service than the one it names (see putSlice). The caller holds mu.
func (s *state) put(k kind, obj any, scan bool) {
	switch o := obj.(type) {
	case *serviceInfo:
		if !s.kept(o) {
			s.removeLocked(k, o.key)
			return
		}
		if e := s.lookup(o.key); e != nil {
			e.svc = o
		} else {
			s.insert(serviceEntry{svc: o})
		}
		s.changedLocked(o.key, false)
	case *sliceInfo:
		s.putSlice(o, scan)
	case *nodeInfo:
		if !s.kept(o) {
			return
		}
		if s.node == nil || s.node.zone != o.zone {
			s.changedLocked(objKey{}, true)
		}
		s.node = o
	}
}

// putSlice adds or replaces a slice. Its previous version, if kept, is under the Service it
// names now: labels are not changed in practice (the EndpointSlice controller sets them at
// creation). With scan (a watch's update: a changed label, or a slice kept only from now on,
// say once it has a Service label) a previous version not found there is searched for among
// every Service's slices. A watch's add, or a list, has none. The caller holds mu.
func (s *state) putSlice(o *sliceInfo, scan bool) {
	sk := o.serviceKey()
	if !s.kept(o) {
		s.removeSlice(o.key, sk, scan) // it may have lost the label that kept it
		return
	}
	defer s.changedLocked(sk, false)
	if e := s.lookup(sk); e != nil {
		if i := slices.IndexFunc(e.slices, func(x *sliceInfo) bool { return x.key == o.key }); i >= 0 {
			e.slices[i] = o
			return
		}
	}
	if scan {
		s.removeSlice(o.key, objKey{}, true) // may remove entries: look sk up again after
	}
	if e := s.lookup(sk); e != nil {
		e.slices = append(e.slices, o)
	} else {
		s.insert(serviceEntry{slices: []*sliceInfo{o}})
	}
}

// removeSlice deletes the slice key from the Service named hint, else (with scan) from
// whichever Service's slices hold it. The caller holds mu.
func (s *state) removeSlice(key, hint objKey, scan bool) {
	remove := func(i int) bool {
		e := &s.entries[i]
		j := slices.IndexFunc(e.slices, func(x *sliceInfo) bool { return x.key == key })
		if j < 0 {
			return false
		}
		sk := e.key()
		e.slices = slices.Delete(e.slices, j, j+1)
		s.removeIfEmpty(i)
		s.changedLocked(sk, false)
		return true
	}
	if hint != (objKey{}) {
		if i, found := s.search(hint); found && remove(i) {
			return
		}
	}
	if !scan {
		return
	}
	for i := range s.entries {
		if remove(i) {
			return
		}
	}
}

// removeLocked deletes the Service or node with key, if kept (slices: removeSlice). The
// caller holds mu.
func (s *state) removeLocked(k kind, key objKey) {
	switch k {
	case kindService:
		if i, found := s.search(key); found && s.entries[i].svc != nil {
			s.entries[i].svc = nil
			s.removeIfEmpty(i)
			s.changedLocked(key, false)
		}
	case kindNode:
		if s.node != nil && s.node.name == key.name {
			s.node = nil
			s.changedLocked(objKey{}, true)
		}
	}
}

// replace makes the objects of kind k exactly list (a full list or a relist). It converts
// list in place: the reflector hands it over.
func (s *state) replace(k kind, list []any) error {
	for i, obj := range list {
		c, err := s.convert(k, obj)
		if err != nil {
			return err
		}
		list[i] = c
	}
	converted := list
	s.mu.Lock()
	defer s.mu.Unlock()
	switch k {
	case kindService, kindSlice:
		s.replaceEntries(k, converted)
	case kindNode:
		if s.node != nil {
			s.node = nil
			s.changedLocked(objKey{}, true)
		}
		for _, c := range converted {
			s.put(k, c, false)
		}
	}
	first := !s.listed[k]
	s.listed[k] = true
	if first && s.allListed() {
		s.synced()
	}
	return nil
}

// replaceEntries makes the Services or slices of the entries exactly list (compact objects
// of kind k; it sorts list). Entries for new keys are appended in order and the entries
// sorted once: 10,000 insertions into the middle would move them 10,000 times. The caller
// holds mu.
func (s *state) replaceEntries(k kind, list []any) {
	for i := range s.entries {
		e := &s.entries[i]
		switch {
		case k == kindService && e.svc != nil:
			s.changedLocked(e.svc.key, false)
			e.svc = nil
		case k == kindSlice && len(e.slices) > 0:
			s.changedLocked(e.key(), false)
			e.slices = nil
		}
	}
	s.entries = slices.DeleteFunc(s.entries, func(e serviceEntry) bool { return e.empty() })
	// In key order, a Service's slices come together, so a key not found is new only for the
	// first of them.
	slices.SortStableFunc(list, func(a, b any) int { return compareKeys(entryKey(a), entryKey(b)) })
	sorted := len(s.entries) // entries[:sorted] were there before, in order
	for _, obj := range list {
		if !s.kept(obj) {
			continue
		}
		key := entryKey(obj)
		var e *serviceEntry
		if n := len(s.entries); n > sorted && s.entries[n-1].key() == key {
			e = &s.entries[n-1]
		} else if i, found := slices.BinarySearchFunc(s.entries[:sorted], key, compareEntryKey); found {
			e = &s.entries[i]
		} else {
			s.entries = append(s.entries, serviceEntry{})
			e = &s.entries[len(s.entries)-1]
		}
		switch o := obj.(type) {
		case *serviceInfo:
			e.svc = o
		case *sliceInfo:
			e.slices = append(e.slices, o)
		}
		s.changedLocked(key, false)
	}
	if len(s.entries) > sorted {
		slices.SortFunc(s.entries, func(a, b serviceEntry) int { return compareKeys(a.key(), b.key()) })
	}
	// Appending grew the array by up to a quarter more than it holds: give the slack back.
	if n := len(s.entries); cap(s.entries)-n > n/8 {
		s.entries = slices.Clone(s.entries)
	}
}

// entryKey is the key of the entry a compact Service or slice belongs under.
func entryKey(obj any) objKey {
	if svc, ok := obj.(*serviceInfo); ok {
		return svc.key
	}
	return obj.(*sliceInfo).serviceKey()
}

func compareEntryKey(e serviceEntry, key objKey) int { return compareKeys(e.key(), key) }

// convert turns an API object, or its compact form, into the compact form of kind k.
func (s *state) convert(k kind, obj any) (any, error) {
	switch k {
	case kindService:
		return toServiceInfo(obj)
	case kindSlice:
		return toSliceInfo(obj, s.nodeName)
	case kindNode:
		return toNodeInfo(obj)
	}
	return nil, fmt.Errorf("unknown kind %d", k)
}

// deletedSliceService is the key of the Service a deleted slice's last state names (zero
// when unknown).
func deletedSliceService(obj any) objKey {
	switch o := obj.(type) {
	case *sliceInfo:
		return o.serviceKey()
	case *discoveryv1.EndpointSlice:
		return keyOf(o.Namespace, o.Labels[discoveryv1.LabelServiceName])
	case cache.DeletedFinalStateUnknown:
		return deletedSliceService(o.Obj)
	}
	return objKey{}
}

// deletedKey is the key of a deleted object, API object or compact form.
func deletedKey(obj any) (objKey, error) {
	switch o := obj.(type) {
	case *serviceInfo:
		return o.key, nil
	case *sliceInfo:
		return o.key, nil
	case *nodeInfo:
		return objKey{name: o.name}, nil
	case cache.DeletedFinalStateUnknown:
		return deletedKey(o.Obj)
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return objKey{}, fmt.Errorf("key of deleted object: %w", err)
	}
	if m.GetNamespace() == "" {
		return objKey{name: m.GetName()}, nil // cluster-scoped: the Node
	}
	return keyOf(m.GetNamespace(), m.GetName()), nil
}

// kindStore is the store one reflector writes: client-go's ReflectorStore on top of state.
// Its Transformer converts each object of a streamed list as it arrives (the reflector's
// temporary store applies it), so that a full list of API objects never exists at once.
type kindStore struct {
	s    *state
	kind kind
}

var (
	_ cache.TransformingStore      = kindStore{}
	_ cache.ReflectorBookmarkStore = kindStore{}
)

// Add is a watch's added object: new, so it has no previous version to look for.
func (k kindStore) Add(obj any) error    { return k.update(obj, false) }
func (k kindStore) Update(obj any) error { return k.update(obj, true) }

func (k kindStore) update(obj any, scan bool) error {
	k.s.heard()
	c, err := k.s.convert(k.kind, obj)
	if err != nil {
		return err
	}
	k.s.mu.Lock()
	defer k.s.mu.Unlock()
	k.s.put(k.kind, c, scan)
	return nil
}

func (k kindStore) Delete(obj any) error {
	k.s.heard()
	key, err := deletedKey(obj)
	if err != nil {
		return err
	}
	k.s.mu.Lock()
	defer k.s.mu.Unlock()
	if k.kind == kindSlice {
		k.s.removeSlice(key, deletedSliceService(obj), true)
	} else {
		k.s.removeLocked(k.kind, key)
	}
	return nil
}

func (k kindStore) Replace(list []any, _ string) error {
	k.s.heard()
	return k.s.replace(k.kind, list)
}

// Resync has nothing to do: there are no handlers to replay to.
func (k kindStore) Resync() error { return nil }

func (k kindStore) Transformer() cache.TransformFunc {
	return func(obj any) (any, error) { return k.s.convert(k.kind, obj) }
}

// Bookmark is a watch bookmark: the watch works, although nothing changed.
func (k kindStore) Bookmark(string) error {
	k.s.heard()
	return nil
}
