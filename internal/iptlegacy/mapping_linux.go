package iptlegacy

import (
	"os"

	"golang.org/x/sys/unix"
)

// mapping is an anonymous private mapping that holds one entries blob. A kube-proxy nat table
// at 10,000 services is a blob of 80 to 180 MB: in the Go heap it would stay resident after
// the read (the runtime returns freed pages slowly) and raise the next GC goal by its size.
// Mapped outside the heap, its pages go back to the kernel the moment they are released, part
// by part while the decoder moves on, and the rest when the read ends.
type mapping struct {
	b        []byte
	released int  // bytes at the start already given back
	heap     bool // b is a Go slice (for comparison): nothing to release or unmap
}

func newMapping(n int, heap bool) (*mapping, error) {
	if heap {
		return &mapping{b: make([]byte, n), heap: true}, nil
	}
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, os.NewSyscallError("mmap", err)
	}
	return &mapping{b: b}, nil
}

// release gives back the whole pages below offset upTo. Their contents read as zeros after, so
// the caller must be done with them. It is best effort: on failure the pages go at free.
func (m *mapping) release(upTo int) {
	if m.heap {
		return
	}
	page := os.Getpagesize()
	upTo = min(upTo, len(m.b)) / page * page
	if upTo <= m.released {
		return
	}
	if unix.Madvise(m.b[m.released:upTo], unix.MADV_DONTNEED) == nil {
		m.released = upTo
	}
}

// free unmaps the blob; m must not be used after.
func (m *mapping) free() {
	if m.b != nil && !m.heap {
		unix.Munmap(m.b)
	}
	m.b = nil
}
