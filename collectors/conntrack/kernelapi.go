package conntrack

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/ti-mo/conntrack"
)

// Kernel is what the collector reads from the kernel: conntrack's statistics, its event stream
// and table over netfilter netlink, and the node's network over rtnetlink. Config.Kernel nil
// means this network namespace's kernel; the exporter's golden scrape test replaces it with
// fixtures (no privilege, no netlink).
type Kernel interface {
	// Stats returns the per-CPU statistics and the table's fill (`conntrack -S`, `-C`).
	Stats() (perCPU []conntrack.Stats, global conntrack.StatsGlobal, err error)
	// Subscribe opens a subscription to the NEW, UPDATE and DESTROY event groups with a receive
	// buffer of bufBytes.
	Subscribe(bufBytes int) (EventStream, error)
	// Dump calls fn with every entry of the conntrack table, each one netlink message (header
	// included) as the kernel answers a dump.
	Dump(fn func(msg []byte) error) error
	// LocalNetwork returns the subnets of the node's bridges and the prefixes of addresses on
	// this node (its own addresses, bridge subnets, per-pod host routes): what names the reason
	// of an unreplied flow (see localNet).
	LocalNetwork() (bridges, local []netip.Prefix, err error)
}

// InvalidLogKernel is a Kernel that also serves conntrack's INVALID log. With
// --conntrack.invalid-reasons, a Kernel without it has no log to read: that part of the
// collector fails, as it does where group 0 is taken.
type InvalidLogKernel interface {
	Kernel
	// LogInvalid binds NFLOG group 0 with a receive buffer of bufBytes; each message is one
	// netlink message as nfnetlink_log sends it.
	LogInvalid(bufBytes int) (EventStream, error)
}

// EventStream is one subscription to the conntrack event groups.
type EventStream interface {
	// Receive calls fn with each event, one netlink message (header included) as the kernel
	// sends it, until fn or the stream fails or Close is called.
	Receive(fn func(msg []byte) error) error
	// Drops is how many events the kernel dropped for this subscription (sk_drops).
	Drops() (uint32, error)
	// Close ends a Receive in progress; it may be called more than once.
	Close() error
}

// useKernel reads k instead of this network namespace's kernel.
func (c *Collector) useKernel(k Kernel) {
	c.stats = func() (tableStats, error) {
		perCPU, global, err := k.Stats()
		if err != nil {
			return tableStats{}, err
		}
		return tableStats{entries: uint64(global.Entries), limit: uint64(global.MaxEntries), cpu: sumCPUStats(perCPU)}, nil
	}
	c.openEvents = func(n int) (eventSource, error) {
		s, err := k.Subscribe(n)
		if err != nil {
			return nil, err
		}
		return streamSource{s}, nil
	}
	c.dump = func(fn func(*flowEvent)) error {
		var ev flowEvent
		return k.Dump(func(msg []byte) error {
			// As dumpTable: other netfilter messages are skipped, a broken entry fails the dump.
			if err := decodeFlowMessage(msg, &ev); err != nil {
				if errors.Is(err, errNotConntrack) {
					return nil
				}
				return fmt.Errorf("decode conntrack dump entry: %w", err)
			}
			fn(&ev)
			return nil
		})
	}
	if c.invalid != nil {
		c.invalid.open = func(n int) (eventSource, error) {
			ik, ok := k.(InvalidLogKernel)
			if !ok {
				return nil, errors.New("the kernel's replacement serves no INVALID log")
			}
			s, err := ik.LogInvalid(n)
			if err != nil {
				return nil, err
			}
			return streamSource{s}, nil
		}
	}
	c.loadNet = func() (*localNet, error) {
		bridges, local, err := k.LocalNetwork()
		if err != nil {
			return nil, err
		}
		return &localNet{bridges: bridges, local: local}, nil
	}
}

// streamSource is an EventStream as the listener uses it.
type streamSource struct{ s EventStream }

func (s streamSource) receiveBatches(fn func(msg []byte) error) error { return s.s.Receive(fn) }
func (s streamSource) drops() (uint32, error)                         { return s.s.Drops() }
func (s streamSource) Close() error                                   { return s.s.Close() }
