package memrun

import (
	"testing"
)

// The status reader reads the same figures as the kernel reports, and allocates nothing per
// read.
func TestStatusReader(t *testing.T) {
	r, err := newStatusReader()
	if err != nil {
		t.Fatal(err)
	}
	defer r.close()
	rss, err := r.read("VmRSS:")
	if err != nil || rss <= 0 {
		t.Fatalf("VmRSS %d, %v; want a positive size", rss, err)
	}
	hwm, err := r.read("VmHWM:")
	if err != nil || hwm < rss {
		t.Fatalf("VmHWM %d, %v; want at least VmRSS %d", hwm, err, rss)
	}
	if _, err := r.read("NoSuchField:"); err == nil {
		t.Error("a missing field read without an error")
	}
	if allocs := testing.AllocsPerRun(100, func() { _, _ = r.read("VmRSS:") }); allocs != 0 {
		t.Errorf("%.0f allocations per read, want none", allocs)
	}
}
