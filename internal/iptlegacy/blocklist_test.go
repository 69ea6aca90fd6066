package iptlegacy

import "testing"

// A blockList holds what was added, in order, across the first block's growth and the blocks
// after it.
func TestBlockList(t *testing.T) {
	for _, n := range []int{0, 1, blockLen - 1, blockLen, blockLen + 1, 3*blockLen + 7} {
		var l blockList[int]
		for i := range n {
			l.add(i)
			if got := *l.last(); got != i {
				t.Fatalf("n %d: last after adding %d is %d", n, i, got)
			}
		}
		if l.len() != n {
			t.Errorf("n %d: len %d", n, l.len())
		}
		seen := 0
		for i, v := range l.all {
			if i != seen || *v != i || *l.at(i) != i {
				t.Fatalf("n %d: element %d is %d (at: %d), yielded as %d", n, seen, *v, *l.at(i), i)
			}
			seen++
		}
		if seen != n {
			t.Errorf("n %d: all yielded %d elements", n, seen)
		}
		stopped := 0
		for range l.all {
			if stopped++; stopped == 2 {
				break
			}
		}
		if want := min(n, 2); stopped != want {
			t.Errorf("n %d: a loop that stops after 2 elements saw %d", n, stopped)
		}
	}
}
