package cluster

import (
	"cmp"
	"slices"
)

// The snapshot's port list: sorted as Snapshot documents (by Name.String(), then Protocol),
// and after a change rebuilt from the previous list rather than from per-Service copies kept
// on the side, which at 10,000 Services would be a second copy of every ServicePort. The list
// holds pointers: a rebuild copies 8 bytes per unchanged port, not the ServicePort, and the
// unchanged ports stay shared between snapshots.

// mergePorts returns prev (sorted) without the ports of the Services in changed, plus fresh
// (their new ports), sorted. Under churn a few Services change among 10,000: each changed
// Service's ports are found in prev by a binary search, fresh is sorted on its own and each of
// its ports placed by a binary search, and the ports in between are copied in runs, rather
// than every port looked up or the whole list sorted again. The ports kept are prev's own.
func mergePorts(prev []*ServicePort, changed map[objKey]struct{}, fresh []*ServicePort) []*ServicePort {
	sortPorts(fresh)
	dropped := changedPortIndexes(prev, changed)
	out := make([]*ServicePort, 0, len(prev)-len(dropped)+len(fresh))
	// Each fresh port goes before the first kept port not less than it, as a binary search
	// over the kept ports alone would place it.
	placeIn := func(run []*ServicePort) {
		for len(fresh) > 0 {
			i, _ := slices.BinarySearchFunc(run, fresh[0], comparePorts)
			if i == len(run) {
				break // after this run: it may still belong before a port of the next
			}
			out = append(append(out, run[:i]...), fresh[0])
			run, fresh = run[i:], fresh[1:]
		}
		out = append(out, run...)
	}
	start := 0
	for _, i := range dropped {
		placeIn(prev[start:i])
		start = i + 1
	}
	placeIn(prev[start:])
	return append(out, fresh...)
}

// changedPortIndexes returns the indexes in prev (sorted) of the ports of the Services in
// changed, in increasing order.
//
// A Service's ports are those named "namespace/name" (its unnamed port) or
// "namespace/name:port" (its named ports). In prev's order the former are next to each other
// (they differ only by protocol), and so are the latter, all names with that prefix; but the
// two need not be: "ns/a" < "ns/a-b" < "ns/a:http". Each is found by its own binary search
// and then walked, the walk keeping only the Service's own ports.
func changedPortIndexes(prev []*ServicePort, changed map[objKey]struct{}) []int {
	var out []int
	for key := range changed {
		ns, name := key.namespace.Value(), key.name
		unnamed := nameIter{parts: [5]string{ns, "/", name}}
		i, _ := slices.BinarySearchFunc(prev, unnamed, comparePortToName)
		for ; i < len(prev) && comparePortToName(prev[i], unnamed) == 0; i++ {
			if n := prev[i].Name; n.Namespace == ns && n.Name == name && n.Port == "" {
				out = append(out, i)
			}
		}
		// Names with the prefix "ns/name:" sort from "ns/name:" on and before "ns/name;".
		named, after := nameIter{parts: [5]string{ns, "/", name, ":"}}, nameIter{parts: [5]string{ns, "/", name, ";"}}
		i, _ = slices.BinarySearchFunc(prev, named, comparePortToName)
		for ; i < len(prev) && comparePortToName(prev[i], after) < 0; i++ {
			if n := prev[i].Name; n.Namespace == ns && n.Name == name && n.Port != "" {
				out = append(out, i)
			}
		}
	}
	slices.Sort(out)
	return out
}

// comparePortToName compares p's Name.String() with the name that it yields.
func comparePortToName(p *ServicePort, it nameIter) int {
	return compareNames(nameBytes(p.Name), it)
}

// sortPorts sorts ports in place and returns them.
func sortPorts(ports []*ServicePort) []*ServicePort {
	slices.SortFunc(ports, comparePorts)
	return ports
}

// comparePorts orders ports as Snapshot documents: by Name.String(), then Protocol.
func comparePorts(a, b *ServicePort) int {
	return cmp.Or(comparePortNames(a.Name, b.Name), cmp.Compare(a.Name.Protocol, b.Name.Protocol))
}

// comparePortNames is cmp.Compare(a.String(), b.String()) without building the strings:
// the recompute sorts 10,000 ports at a time.
func comparePortNames(a, b ServicePortName) int {
	return compareNames(nameBytes(a), nameBytes(b))
}

// compareNames compares the strings that ai and bi yield.
func compareNames(ai, bi nameIter) int {
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

// nameIter yields the bytes of its parts, one after the other: of a ServicePortName's String()
// (nameBytes), or of a name to search for.
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
