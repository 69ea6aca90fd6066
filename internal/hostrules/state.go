// Package hostrules is proxyhealth's one reader of the node's netfilter state. It reads
// kube-proxy's rules and the forward path in-process (nf_tables over netlink, iptables-legacy
// through its socket options), follows nf_tables changes as they are committed (re-reading
// only the chains and sets each names, through nftnl.Follower), re-reads the
// legacy tables only when they may have changed, and publishes each read as an immutable State
// that the drift check (collectors/rules), the INVALID-drop check (collectors/node) and flow
// attribution (collectors/conntrack) share. No child process is run.
package hostrules

import (
	"time"

	"github.com/proxyhealth/proxyhealth/internal/ipvs"
	"github.com/proxyhealth/proxyhealth/internal/ruleset"
)

// kube-proxy's modes as found from the rules: the values of proxyhealth_proxy_mode's label.
const (
	ModeIPTables = "iptables"
	ModeNFTables = "nftables"
	ModeIPVS     = "ipvs"
	ModeNone     = "none"
)

// Modes lists every mode, for a gauge per mode.
var Modes = []string{ModeIPTables, ModeNFTables, ModeIPVS, ModeNone}

// Backends, as State and the metrics name them.
const (
	BackendLegacy      = "iptables-legacy"
	BackendIPTablesNFT = "iptables-nft"
	BackendNFTables    = "nftables"
	BackendIPVS        = "ipvs"
)

// State is one read of the node's netfilter state. It is never modified once published.
type State struct {
	// At is when the newest part of this state was read.
	At time.Time
	// Seq grows by one with every published State.
	Seq uint64

	// Mode is kube-proxy's mode found from its rules, and Backend where they were read:
	// iptables mode reads from BackendLegacy or BackendIPTablesNFT (the one holding more
	// service chains, should both hold some during a backend migration), nftables mode from
	// BackendNFTables, IPVS mode from BackendIPVS.
	Mode    string
	Backend string
	// Proxy holds kube-proxy's rules by family (key: IPv6); a family with no kube-proxy
	// rules is absent.
	Proxy map[bool]*ruleset.ProxyTable
	// IPVS holds kube-proxy's virtual servers in IPVS mode, both families; nil in the other
	// modes, or when IPVS could not be read (ProxyErr says why).
	IPVS *ipvs.Table
	// ProxyErr says why kube-proxy's rules could not be read; Mode and Proxy are then as far
	// as the readable backends tell.
	ProxyErr error

	// Forward is the forward path of each backend, for the INVALID-drop check.
	Forward []Forward
}

// Forward is one backend's forward path.
type Forward struct {
	Backend string
	// Graphs are its tables with a forward path: iptables' filter table, or each native
	// nftables table with a base chain on the forward hook. Empty when it has none.
	Graphs []*ruleset.Graph
	// Err says why the backend could not be read; a backend that is not in use on this node
	// (no legacy filter table, no nf_tables) is no error.
	Err error
}

// ProxyRules returns kube-proxy's rules of one family, nil when there are none.
func (s *State) ProxyRules(ipv6 bool) *ruleset.ProxyTable {
	if s == nil {
		return nil
	}
	return s.Proxy[ipv6]
}
