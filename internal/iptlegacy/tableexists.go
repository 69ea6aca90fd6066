package iptlegacy

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// TableExists reports whether the legacy (x_tables) table exists in the namespace procPath
// shows, from <procPath>/net/ip_tables_names (ip6_tables_names for IPv6). It must be asked
// before naming a legacy table to iptables-legacy-save: naming one that does not exist makes
// the kernel create it, empty, and a reader must not change the node (an empty legacy table
// also confuses the backend detection of kube-proxy and iptables). Without the file x_tables
// is not loaded and no legacy table exists; the file is root's only, so without root (or
// CAP_DAC_READ_SEARCH) the answer is an error.
func TableExists(procPath string, ipv6 bool, table string) (bool, error) {
	file := "ip_tables_names"
	if ipv6 {
		file = "ip6_tables_names"
	}
	b, err := os.ReadFile(filepath.Join(procPath, "net", file))
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("cannot tell whether a legacy %s table exists without creating one: %w", table, err)
	}
	return slices.Contains(strings.Fields(string(b)), table), nil
}
