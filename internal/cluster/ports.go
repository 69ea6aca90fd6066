package cluster

import (
	"cmp"
	"slices"
	"unique"
)

// The snapshot's port list: sorted as Snapshot documents (by Name.String(), then Protocol),
// and after a change rebuilt from the previous list rather than from per-Service copies kept
// on the side, which at 10,000 Services would be a second copy of every ServicePort.

// mergePorts returns prev (sorted) without the ports of the Services in changed, plus fresh
// (their new ports), sorted. Under churn a few Services change among 10,000: fresh is sorted
// on its own and each of its ports placed by a binary search, rather than the whole list
// sorted again.
func mergePorts(prev []ServicePort, changed map[objKey]struct{}, fresh []ServicePort) []ServicePort {
	sortPorts(fresh)
	out := make([]ServicePort, 0, len(prev)+len(fresh))
	kept := prev
	if len(changed) > 0 {
		kept = make([]ServicePort, 0, len(prev))
		for _, p := range prev {
			if _, ok := changed[objKey{unique.Make(p.Name.Namespace), p.Name.Name}]; !ok {
				kept = append(kept, p)
			}
		}
	}
	for _, p := range fresh {
		i, _ := slices.BinarySearchFunc(kept, p, comparePorts)
		out = append(append(out, kept[:i]...), p)
		kept = kept[i:]
	}
	return append(out, kept...)
}

// sortPorts sorts ports in place and returns them.
func sortPorts(ports []ServicePort) []ServicePort {
	slices.SortFunc(ports, comparePorts)
	return ports
}

// comparePorts orders ports as Snapshot documents: by Name.String(), then Protocol.
func comparePorts(a, b ServicePort) int {
	return cmp.Or(comparePortNames(a.Name, b.Name), cmp.Compare(a.Name.Protocol, b.Name.Protocol))
}

// comparePortNames is cmp.Compare(a.String(), b.String()) without building the strings:
// the recompute sorts 10,000 ports at a time.
func comparePortNames(a, b ServicePortName) int {
	ai, bi := nameBytes(a), nameBytes(b)
	for {
		x, xok := ai.next()
		y, yok := bi.next()
		switch {
		case !xok || !yok:
			return cmp.Compare(boolInt(xok), boolInt(yok)) // the shorter first
		case x != y:
			return cmp.Compare(x, y)
		}
	}
}

// nameIter yields the bytes of a ServicePortName's String().
type nameIter struct {
	parts [5]string
	i, j  int
}

func nameBytes(n ServicePortName) nameIter {
	it := nameIter{parts: [5]string{n.Namespace, "/", n.Name}}
	if n.Port != "" {
		it.parts[3], it.parts[4] = ":", n.Port
	}
	return it
}

func (it *nameIter) next() (byte, bool) {
	for it.i < len(it.parts) {
		if p := it.parts[it.i]; it.j < len(p) {
			it.j++
			return p[it.j-1], true
		}
		it.i, it.j = it.i+1, 0
	}
	return 0, false
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
