package node

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Sysctl files, relative to the procfs mountpoint.
var (
	bridgeNFCallIptablesPath  = filepath.Join("sys", "net", "bridge", "bridge-nf-call-iptables")
	bridgeNFCallIp6tablesPath = filepath.Join("sys", "net", "bridge", "bridge-nf-call-ip6tables")
	netfilterDir              = filepath.Join("sys", "net", "netfilter")
	tcpBeLiberalPath          = filepath.Join(netfilterDir, "nf_conntrack_tcp_be_liberal")
	conntrackEventsPath       = filepath.Join(netfilterDir, "nf_conntrack_events")
)

// parseSysctl parses the content of a single-integer sysctl file such as "1\n".
func parseSysctl(b []byte) (int64, error) {
	s := strings.TrimSpace(string(b))
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("not an integer: %q", s)
	}
	return v, nil
}

// readSysctl reads one integer sysctl. exists is false (and err nil) when the file is absent.
func readSysctl(path string) (value int64, exists bool, err error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	v, err := parseSysctl(b)
	if err != nil {
		return 0, true, fmt.Errorf("%s: %w", path, err)
	}
	return v, true, nil
}
