package ruleset

import "testing"

func TestChangedSince(t *testing.T) {
	pt := &ProxyTable{ID: 7, Deltas: []Delta{
		{Since: 6, Changed: map[string]struct{}{"a": {}}},
		{Since: 5, Changed: map[string]struct{}{"a": {}, "b": {}}},
	}}
	for _, tc := range []struct {
		id      uint64
		name    string
		changed bool
	}{
		{7, "a", false}, // itself
		{6, "a", true},
		{6, "b", false},
		{5, "b", true},
		{5, "c", false},
		{4, "c", true}, // older than it tells
		{0, "c", true}, // a table read whole
	} {
		if got := pt.ChangedSince(tc.id, tc.name); got != tc.changed {
			t.Errorf("ChangedSince(%d, %q) = %v, want %v", tc.id, tc.name, got, tc.changed)
		}
	}
	if (&ProxyTable{}).ChangedSince(0, "a") != true {
		t.Error("a table read whole tells nothing")
	}
}
