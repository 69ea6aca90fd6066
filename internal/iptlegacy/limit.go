package iptlegacy

import "errors"

// DefaultMaxTableBytes bounds the entries blob of one table that is read. The kernel hands a
// table's rules over in one copy of the size its info gives, so the blob is held whole at the
// start of a read (it is released as it is decoded): the bound is a bound on memory. kube-proxy's
// nat table at 10,000 Services of 10 endpoints with its comments is about 183 MiB (19,174 bytes
// a Service, TestKernelTableLimit), 100 MiB without comments. The default is the DaemonSet's
// whole memory limit: a blob that size cannot be read without the container being killed, so
// it is refused with an error instead.
const DefaultMaxTableBytes = 384 << 20

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
