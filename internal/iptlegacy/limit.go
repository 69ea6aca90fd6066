package iptlegacy

import "errors"

// DefaultMaxTableBytes bounds the entries blob of one table that is read when nothing tells
// how much memory the process may use (no cgroup memory limit; see MaxTableBytesWithin). The
// kernel hands a table's rules over in one copy of the size its info gives, so the blob is
// held whole at the start of a read (it is released as it is decoded): the bound is a bound on
// memory. kube-proxy's nat table at 10,000 Services of 10 endpoints with its comments is about
// 183 MiB (19,174 bytes a Service, TestKernelTableLimit), 100 MiB without comments.
const DefaultMaxTableBytes = 384 << 20

// ReadPeakPerTableByte is how much a read raises the process's memory, per byte of the table
// read: the blob's mapping (released as it is decoded) and the decoding's allocations. It is
// measured under a memory cgroup by TestKernelReadUnderMemoryCgroup, which fails should a read
// need more.
const ReadPeakPerTableByte = 1.1

// MaxTableBytesWithin is the largest table a process can read within a memory limit of
// memLimit bytes when floor of them are its own without the read: what is left, divided by
// ReadPeakPerTableByte, and never more than DefaultMaxTableBytes (a generous limit, or one
// above the node's memory, must not let a read hold gigabytes). A memLimit of 0 (none) gives
// DefaultMaxTableBytes; a limit that leaves nothing gives 1, which no table fits.
func MaxTableBytesWithin(memLimit, floor int64) int64 {
	if memLimit <= 0 {
		return DefaultMaxTableBytes
	}
	return min(max(int64(float64(memLimit-floor)/ReadPeakPerTableByte), 1), DefaultMaxTableBytes)
}

// ErrTableTooLarge is returned (wrapped) when a table's info gives a blob larger than the
// read's Limits.MaxTableBytes; nothing of it is read.
var ErrTableTooLarge = errors.New("iptables-legacy table larger than the read limit")

// Limits bounds what one read of this package accepts; the zero value is the defaults.
type Limits struct {
	// MaxTableBytes is the largest table blob read, as the table's info gives its size; 0 (or
	// less) means DefaultMaxTableBytes.
	MaxTableBytes int64
}

// maxTableBytes is l.MaxTableBytes, or the default in its absence.
func (l Limits) maxTableBytes() int64 {
	if l.MaxTableBytes <= 0 {
		return DefaultMaxTableBytes
	}
	return l.MaxTableBytes
}
