// Package sysctl reads the kernel settings proxyhealth looks at from a procfs mountpoint: the
// host's /proc (or its mount in a container), or a fixture tree in tests.
package sysctl

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// The sysctl files proxyhealth reads, relative to the procfs mountpoint.
var (
	BridgeNFCallIptables  = filepath.Join("sys", "net", "bridge", "bridge-nf-call-iptables")
	BridgeNFCallIp6tables = filepath.Join("sys", "net", "bridge", "bridge-nf-call-ip6tables")
	// NetfilterDir holds nf_conntrack's settings; it exists only while nf_conntrack is loaded.
	NetfilterDir          = filepath.Join("sys", "net", "netfilter")
	ConntrackTCPBeLiberal = filepath.Join(NetfilterDir, "nf_conntrack_tcp_be_liberal")
	ConntrackEvents       = filepath.Join(NetfilterDir, "nf_conntrack_events")
)

// ReadInt reads the single-integer sysctl file at path. exists is false (and err nil) when the
// file is absent, which for these settings means their kernel module is not loaded.
func ReadInt(path string) (value int64, exists bool, err error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	v, err := parseInt(b)
	if err != nil {
		return 0, true, fmt.Errorf("%s: %w", path, err)
	}
	return v, true, nil
}

// parseInt parses the content of a single-integer sysctl file such as "1\n".
func parseInt(b []byte) (int64, error) {
	s := strings.TrimSpace(string(b))
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("not an integer: %q", s)
	}
	return v, nil
}
