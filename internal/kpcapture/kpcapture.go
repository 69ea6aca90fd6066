// Package kpcapture is the version matrix's captures of kube-proxy's rules: where they are kept,
// which files each holds, and what each one's rules must hold (expected.json). The lab writes
// them from the real kube-proxy of each version and mode (test/e2e, TestCaptureKubeProxyRules);
// the readers' tests (internal/nftnl, internal/iptlegacy) load them into the kernel, record what
// the kernel answers, and decode those recordings against the expectation, so a kube-proxy
// release that programs its rules differently fails there.
package kpcapture

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/proxyhealth/proxyhealth/internal/ipvs"
	"github.com/proxyhealth/proxyhealth/internal/ruleset"
)

// Dir holds the captures, relative to the repository root: Dir/<version>/<mode>/.
const Dir = "collectors/rules/testdata/kube-proxy-matrix"

// The modes captured: kube-proxy's iptables mode with each iptables backend, and its nftables
// mode.
const (
	IPTablesLegacy = "iptables-legacy"
	IPTablesNFT    = "iptables-nft"
	NFTables       = "nftables"
)

// Modes are the modes captured, in the order the lab runs them.
var Modes = []string{IPTablesLegacy, IPTablesNFT, NFTables}

// IPVS is kube-proxy's IPVS mode. Its capture is the kernel's state rather than rules
// (IPVSFile, an IPVSState), made in a kernel matrix guest (CAPTURE=1 test/vm/ipvs-lab.sh):
// this machine's kernel may have no IPVS. The rules collector's tests compare it with the
// version's API objects. It is not one of Modes, which the host's lab captures.
const (
	IPVS     = "ipvs"
	IPVSFile = "ipvs.json"
)

// IPVSCaptures lists the IPVS captures under root/Dir (root being the repository), by version.
func IPVSCaptures(root string) ([]Capture, error) {
	return find(root, []string{IPVS}, IPVSFile)
}

// LoadIPVS reads an IPVS capture.
func (c Capture) LoadIPVS() (*IPVSState, error) {
	var s IPVSState
	if err := c.decode(IPVSFile, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// IPVSState is kube-proxy's IPVS mode as the exporter reads it (internal/ipvs), in the form the
// lab passes it on (labtool ipvs): the virtual servers with their real servers, sorted, and the
// addresses bound to kube-proxy's kube-ipvs0, which tell a node port's virtual servers from the
// others.
type IPVSState struct {
	VirtualServers []ipvs.VirtualServer `json:"virtual_servers"`
	Bound          []netip.Addr         `json:"bound"`
}

// ExpectedFile names each capture's expectation; APIObjectsFile, in the version's directory,
// the Node, Services and EndpointSlices every mode was programmed from.
const (
	ExpectedFile   = "expected.json"
	APIObjectsFile = "api-objects.json"
)

// RulesFile is the name of a capture's rules of one family: iptables-save's nat table in the
// iptables modes, `nft -j list table <family> kube-proxy` in nftables mode.
func RulesFile(mode string, ipv6 bool) string {
	switch {
	case mode == NFTables && ipv6:
		return "nft-list-table-ip6-kube-proxy.json"
	case mode == NFTables:
		return "nft-list-table-ip-kube-proxy.json"
	case ipv6:
		return "ip6tables-save-nat.txt"
	default:
		return "iptables-save-nat.txt"
	}
}

// Family is the key of a family's expectation.
func Family(ipv6 bool) string {
	if ipv6 {
		return "ipv6"
	}
	return "ipv4"
}

// Expected is what one capture's rules hold, per family ("ipv4", "ipv6").
type Expected struct {
	Version  string                     `json:"version"`
	Mode     string                     `json:"mode"`
	Families map[string]*FamilyExpected `json:"families"`
}

// FamilyExpected is what one family's table holds.
type FamilyExpected struct {
	// Chains maps every service port chain with rules (KUBE-SVC-*, KUBE-SVL-*; service-*,
	// local-*) to its endpoints, "ip:port" ("[ip]:port" for IPv6), sorted.
	Chains map[string][]string `json:"chains"`
	// Services are cluster IP service ports the dispatch must send to one of their chains.
	Services []Service `json:"services"`
}

// Service is one cluster IP service port of the dispatch.
type Service struct {
	ClusterIP string `json:"cluster_ip"`
	Port      uint16 `json:"port"`
	Protocol  string `json:"protocol"` // tcp, udp, sctp
	// Chains are the port's chains, any of which the dispatch may jump to (the cluster
	// chain, or the local one with internalTrafficPolicy: Local).
	Chains []string `json:"chains"`
}

// Capture is one version and mode kept under Dir.
type Capture struct {
	Version, Mode string
	Dir           string // its directory
}

// File is the path of one of the capture's files.
func (c Capture) File(name string) string { return filepath.Join(c.Dir, name) }

// Captures lists the captures under root/Dir (root being the repository), by version, then in
// the order of Modes.
func Captures(root string) ([]Capture, error) {
	return find(root, Modes, ExpectedFile)
}

// find lists the captures under root/Dir of the modes that hold file, by version, then in the
// order of modes.
func find(root string, modes []string, file string) ([]Capture, error) {
	base := filepath.Join(root, Dir)
	versions, err := os.ReadDir(base)
	if err != nil {
		return nil, err
	}
	var out []Capture
	for _, v := range versions {
		if !v.IsDir() {
			continue
		}
		for _, mode := range modes {
			dir := filepath.Join(base, v.Name(), mode)
			if _, err := os.Stat(filepath.Join(dir, file)); err == nil {
				out = append(out, Capture{Version: v.Name(), Mode: mode, Dir: dir})
			}
		}
	}
	return out, nil
}

// decode reads the capture's file name into v.
func (c Capture) decode(name string, v any) error {
	b, err := os.ReadFile(c.File(name))
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s: %w", c.File(name), err)
	}
	return nil
}

// Load reads the capture's expectation.
func (c Capture) Load() (*Expected, error) {
	var e Expected
	if err := c.decode(ExpectedFile, &e); err != nil {
		return nil, err
	}
	if e.Version != c.Version || e.Mode != c.Mode {
		return nil, fmt.Errorf("%s: version %s, mode %s, in the directory of %s %s", c.File(ExpectedFile), e.Version, e.Mode, c.Version, c.Mode)
	}
	return &e, nil
}

var protocols = map[string]uint8{"tcp": ruleset.ProtoTCP, "udp": ruleset.ProtoUDP, "sctp": ruleset.ProtoSCTP}

// Compare says how a table read from the capture differs from the expectation ("" when it
// does not): every chain with exactly its endpoints and no other chain, and every expected
// service port dispatched to one of its chains.
func (f *FamilyExpected) Compare(pt *ruleset.ProxyTable) string {
	if pt == nil {
		return "no table read"
	}
	var diffs []string
	for chain, want := range f.Chains {
		got, ok := pt.Chains[chain]
		if !ok {
			diffs = append(diffs, fmt.Sprintf("chain %s missing, want %v", chain, want))
			continue
		}
		if gs := addrStrings(got); !slices.Equal(gs, want) {
			diffs = append(diffs, fmt.Sprintf("chain %s: %v, want %v", chain, gs, want))
		}
	}
	for chain, got := range pt.Chains {
		if _, ok := f.Chains[chain]; !ok {
			diffs = append(diffs, fmt.Sprintf("chain %s not expected: %v", chain, addrStrings(got)))
		}
	}
	for _, s := range f.Services {
		ip, err := netip.ParseAddr(s.ClusterIP)
		if err != nil {
			diffs = append(diffs, fmt.Sprintf("service %s: %v", s.ClusterIP, err))
			continue
		}
		found := false
		for _, d := range pt.Services {
			if d.ClusterIP == ip && d.Port == s.Port && d.Protocol == protocols[s.Protocol] {
				found = true
				if !slices.Contains(s.Chains, d.Chain) {
					diffs = append(diffs, fmt.Sprintf("service %s:%d/%s dispatched to %s, want one of %v", s.ClusterIP, s.Port, s.Protocol, d.Chain, s.Chains))
				}
			}
		}
		if !found {
			diffs = append(diffs, fmt.Sprintf("service %s:%d/%s not dispatched", s.ClusterIP, s.Port, s.Protocol))
		}
	}
	sort.Strings(diffs)
	return strings.Join(diffs, "\n")
}

func addrStrings(aps []netip.AddrPort) []string {
	out := make([]string, 0, len(aps))
	for _, ap := range aps {
		out = append(out, ap.String())
	}
	sort.Strings(out)
	return out
}
