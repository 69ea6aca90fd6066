package iptlegacy

import (
	"errors"
	"sync/atomic"
)

// DefaultMaxTableBytes bounds the entries blob of one table that is read. The kernel hands a
// table's rules over in one copy of the size its info gives, so the blob is held whole at the
// start of a read (it is released as it is decoded): the bound is a bound on memory. kube-proxy's
// nat table at 10,000 Services of 10 endpoints with its comments is about 183 MiB (19,174 bytes
// a Service, TestKernelTableLimit), 100 MiB without comments. The default is the DaemonSet's
// whole memory limit: a blob that size cannot be read without the container being killed, so
// it is refused with an error instead.
const DefaultMaxTableBytes = 384 << 20

// ErrTableTooLarge is returned (wrapped) when a table's info gives a blob larger than the bound
// SetMaxTableBytes set; nothing of it is read.
var ErrTableTooLarge = errors.New("iptables-legacy table larger than the read limit")

var maxTableBytes atomic.Int64

func init() { maxTableBytes.Store(DefaultMaxTableBytes) }

// SetMaxTableBytes sets the largest table blob read, for every read the process makes from now
// on; n <= 0 restores DefaultMaxTableBytes.
func SetMaxTableBytes(n int64) {
	if n <= 0 {
		n = DefaultMaxTableBytes
	}
	maxTableBytes.Store(n)
}

// MaxTableBytes returns the bound SetMaxTableBytes set.
func MaxTableBytes() int64 { return maxTableBytes.Load() }
