package iptlegacy

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/proxyhealth/proxyhealth/internal/ruleset"
)

// maxAttempts bounds the reads of a table that keeps being replaced between its info and its
// entries (kube-proxy at 10,000 services replaces the nat table every few seconds under churn).
const maxAttempts = 5

// ReadInfo returns the table's info, or nil when the table does not exist in the network
// namespace procPath (a procfs mount, normally /proc) shows. It never creates a table.
func ReadInfo(procPath string, ipv6 bool, table string) (*Info, error) {
	if ok, err := TableExists(procPath, ipv6, table); err != nil || !ok {
		return nil, err
	}
	s, err := openSocket(ipv6)
	if err != nil {
		return nil, err
	}
	defer s.close()
	info, err := s.info(table)
	if errors.Is(err, errTableGone) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &info, nil
}

// ReadNAT reads kube-proxy's service view from the legacy nat table of one IP family. It
// returns nil when the table does not exist or has no KUBE-SERVICES chain (kube-proxy does not
// program this backend or family); it never creates a table. The read keeps only what the
// ProxyTable holds and gives the blob's memory back as it goes. A table larger than lim allows
// is not read: the error wraps ErrTableTooLarge.
func ReadNAT(procPath string, ipv6 bool, lim Limits) (*ruleset.ProxyTable, error) {
	return readNAT(procPath, ipv6, readOptions{limits: lim})
}

func readNAT(procPath string, ipv6 bool, opts readOptions) (*ruleset.ProxyTable, error) {
	var pt *ruleset.ProxyTable
	found, err := readTable(procPath, ipv6, "nat", opts, func(info *Info, m *mapping) error {
		var release func(int)
		if !opts.keepBlob {
			release = func(upTo int) { m.release(getEntriesHeader + upTo) }
		}
		t, hasServices, err := decodeNAT(info, m.b[getEntriesHeader:], release)
		if hasServices {
			pt = t
		}
		return err
	})
	if err != nil || !found {
		return nil, err
	}
	return pt, nil
}

// ReadFilter reads the legacy filter table of one IP family as the graph the INVALID-drop
// search walks from FORWARD. It returns nil when the table does not exist; it never creates
// one. A table larger than lim allows is not read: the error wraps ErrTableTooLarge.
func ReadFilter(procPath string, ipv6 bool, lim Limits) (*ruleset.Graph, error) {
	var g *ruleset.Graph
	found, err := readTable(procPath, ipv6, "filter", readOptions{limits: lim}, func(info *Info, m *mapping) error {
		var err error
		g, err = decodeFilter(info, m.b[getEntriesHeader:])
		return err
	})
	if err != nil || !found {
		return nil, err
	}
	return g, nil
}

// readOptions are a read's limits, and the alternatives the scale benchmark compares with the
// default.
type readOptions struct {
	limits   Limits
	heapBlob bool // the blob in a Go byte slice instead of a mapping of its own
	keepBlob bool // no release of the decoded part while the rest is decoded
}

// readTable reads table's info and entries and hands them to decode, retrying when the table
// is replaced in between. found is false when the table does not exist.
func readTable(procPath string, ipv6 bool, table string, opts readOptions, decode func(*Info, *mapping) error) (found bool, err error) {
	if ok, err := TableExists(procPath, ipv6, table); err != nil || !ok {
		return false, err
	}
	s, err := openSocket(ipv6)
	if err != nil {
		return false, err
	}
	defer s.close()
	for range maxAttempts {
		info, m, err := readStable(s, table, opts)
		if errors.Is(err, errTableGone) {
			return false, nil
		}
		if errors.Is(err, errChanged) {
			continue
		}
		if err != nil {
			return false, err
		}
		err = decode(&info, m)
		m.free()
		if err != nil {
			return false, fmt.Errorf("iptables-legacy: table %s: %w", table, err)
		}
		return true, nil
	}
	return false, fmt.Errorf("iptables-legacy: table %s changed during each of %d reads", table, maxAttempts)
}

var errChanged = errors.New("table changed while read")

// beforeEntries, set by tests only, runs between a read's info and entries calls: where a
// concurrent replace of the table hurts.
var beforeEntries func()

// readStable reads the info and then the entries, and the info again: a table replaced in
// between by one of another size fails the entries call (EAGAIN), and one that moved its
// chains or changed its entry count shows in the second info. Either way the caller retries.
func readStable(s *socket, table string, opts readOptions) (Info, *mapping, error) {
	info, err := s.info(table)
	if err != nil {
		return Info{}, nil, err
	}
	if beforeEntries != nil {
		beforeEntries()
	}
	m, err := s.entries(&info, opts.limits.maxTableBytes(), opts.heapBlob)
	if errors.Is(err, unix.EAGAIN) {
		return Info{}, nil, errChanged
	}
	if err != nil {
		return Info{}, nil, err
	}
	after, err := s.info(table)
	if err != nil {
		m.free()
		return Info{}, nil, err
	}
	if after != info {
		m.free()
		return Info{}, nil, errChanged
	}
	return info, m, nil
}
