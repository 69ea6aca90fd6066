package iptlegacy

import (
	"os"
	"runtime/debug"

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

// collectBeforeBytes is the blob size from which the process's garbage is collected, and
// handed back to the kernel, before the blob is mapped. The blob's pages come on top of
// whatever the process holds at that moment, and the garbage the previous read's decoding left
// (a whole decoded table) can be that large again until the collector runs: at 10,000
// Services x 10 the peak varied from 161 to 210 MiB with when it ran. A collection costs tens
// of milliseconds, and reads of tables this large come at most every
// --netfilter.legacy-min-read-interval.
const collectBeforeBytes = 16 << 20

// collectGarbage is debug.FreeOSMemory; the tests count its calls.
var collectGarbage = debug.FreeOSMemory

func newMapping(n int, heap bool) (*mapping, error) {
	if heap {
		return &mapping{b: make([]byte, n), heap: true}, nil
	}
	if n >= collectBeforeBytes {
		collectGarbage()
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
