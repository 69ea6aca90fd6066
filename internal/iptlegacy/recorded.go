package iptlegacy

import (
	"fmt"

	"github.com/proxyhealth/proxyhealth/internal/ruleset"
)

// A recorded table is a table as the kernel tests store it with -update (testdata/*.blob): the
// struct ipt_getinfo the kernel returned, then the entries, in the byte order of the machine
// that read them (little-endian).

// splitRecorded returns a recorded table's info and entries.
func splitRecorded(recorded []byte, ipv6 bool) (*Info, []byte, error) {
	info, err := decodeInfo(recorded, ipv6)
	if err != nil {
		return nil, nil, err
	}
	if entries := recorded[getInfoSize:]; len(entries) != int(info.Size) {
		return nil, nil, fmt.Errorf("recorded table: %d bytes of entries, its info says %d", len(entries), info.Size)
	}
	return &info, recorded[getInfoSize:], nil
}

// DecodeRecordedFilter decodes a recorded filter table as ReadFilter decodes the kernel's. It
// is for the tests of the packages that read through this one, so that they decode what the
// kernel answered with the decoder the exporter runs, without root; the exporter never uses it
// (nor links it). It lives here, not in a test-support package, because it calls this package's
// unexported decoders (decodeInfo, decodeFilter).
func DecodeRecordedFilter(recorded []byte, ipv6 bool) (*ruleset.Graph, error) {
	info, entries, err := splitRecorded(recorded, ipv6)
	if err != nil {
		return nil, err
	}
	return decodeFilter(info, entries)
}
