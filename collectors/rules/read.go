package rules

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/proxyhealth/proxyhealth/internal/command"
	"github.com/proxyhealth/proxyhealth/internal/iptables"
	"github.com/proxyhealth/proxyhealth/internal/nft"
)

// Proxy modes, the values of proxyhealth_proxy_mode's mode label.
const (
	modeIPTables = "iptables"
	modeNFTables = "nftables"
	modeIPVS     = "ipvs"
	modeNone     = "none"
)

var modes = []string{modeIPTables, modeNFTables, modeIPVS, modeNone}

func runCommand(ctx context.Context, name string, args ...string) ([]byte, error) {
	out, err := command.Run(ctx, name, args...)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", filepath.Base(name), strings.Join(args, " "), err)
	}
	return out, nil
}

// reader finds kube-proxy's mode and reads its rules.
type reader struct {
	procPath   string
	timeout    time.Duration
	run        command.Runner
	lookPath   func(string) (string, error)
	ipvsActive func() bool
	generation func() (uint32, error)

	// The last read, reused while the nftables generation it was read at still holds.
	last     *readResult
	lastGen  uint32
	lastIPv6 bool
	reused   uint64
}

func newReader(procPath string, timeout time.Duration) *reader {
	return &reader{procPath: procPath, timeout: timeout, run: runCommand, lookPath: exec.LookPath, ipvsActive: ipvsInterfaceExists, generation: nftGeneration}
}

// ipvsInterfaceExists: kube-proxy's IPVS mode binds service addresses to a dummy interface
// named kube-ipvs0 (pkg/proxy/ipvs: defaultDummyDevice).
func ipvsInterfaceExists() bool {
	_, err := net.InterfaceByName("kube-ipvs0")
	return err == nil
}

// iptablesFamily names one IP family's save binaries and legacy table list.
type iptablesFamily struct {
	nftSave, legacySave, legacyTables string
}

var (
	ipv4Family = iptablesFamily{"iptables-nft-save", "iptables-legacy-save", "ip_tables_names"}
	ipv6Family = iptablesFamily{"ip6tables-nft-save", "ip6tables-legacy-save", "ip6_tables_names"}
)

// readResult is what one read found.
type readResult struct {
	mode    string
	backend string                   // the binary the rules came from, for the log
	rules   map[bool]programmedRules // by ipv6; a family that could not be read is absent
}

// read finds the mode and, in iptables and nftables mode, the programmed rules of IPv4 and,
// when wantIPv6, of IPv6. An error means the mode or rules could not be read.
func (rd *reader) read(ctx context.Context, wantIPv6 bool) (readResult, error) {
	if rd.ipvsActive() {
		rd.last = nil
		return readResult{mode: modeIPVS}, nil
	}
	gen, cacheable := rd.cacheKey()
	if cacheable && rd.last != nil && rd.lastGen == gen && rd.lastIPv6 == wantIPv6 {
		rd.reused++
		return *rd.last, nil
	}
	res, err := rd.readNow(ctx, wantIPv6)
	rd.last = nil
	if err == nil && cacheable {
		rd.last, rd.lastGen, rd.lastIPv6 = &res, gen, wantIPv6
	}
	return res, err
}

// cacheKey returns the nftables generation, and whether a read may be reused while it holds:
// not when a legacy nat table exists (legacy changes do not move nftables' generation) or the
// generation cannot be read.
func (rd *reader) cacheKey() (uint32, bool) {
	for _, ipv6 := range []bool{false, true} {
		if exists, err := iptables.LegacyTableExists(rd.procPath, ipv6, "nat"); exists || err != nil {
			return 0, false
		}
	}
	gen, err := rd.generation()
	return gen, err == nil
}

// readNow reads the mode and rules (see read). iptables mode is looked for first, as before
// nftables mode was compared: kube-proxy removes the other modes' rules when it starts
// (cmd/kube-proxy/app/server_linux.go: platformCleanup), so both are found only where that
// cleanup failed.
func (rd *reader) readNow(ctx context.Context, wantIPv6 bool) (readResult, error) {
	v4, backend, err := rd.readIPTables(ctx, ipv4Family)
	if err != nil {
		return readResult{}, err
	}
	if v4 != nil {
		res := readResult{mode: modeIPTables, backend: backend, rules: map[bool]programmedRules{false: v4}}
		if wantIPv6 {
			v6, _, err := rd.readIPTables(ctx, ipv6Family)
			if err != nil {
				return readResult{}, err
			}
			if v6 != nil {
				res.rules[true] = v6
			}
		}
		return res, nil
	}
	v4nft, err := rd.readNFT(ctx, "ip")
	if err != nil {
		return readResult{}, err
	}
	if v4nft == nil {
		return readResult{mode: modeNone}, nil
	}
	res := readResult{mode: modeNFTables, backend: "nft", rules: map[bool]programmedRules{false: v4nft}}
	if wantIPv6 {
		v6, err := rd.readNFT(ctx, "ip6")
		if err != nil {
			return readResult{}, err
		}
		if v6 != nil {
			res.rules[true] = v6
		}
	}
	return res, nil
}

// readIPTables reads the nat table of every backend that has kube-proxy's KUBE-SERVICES chain
// and keeps the one with the most service chains (during a backend migration both may hold
// some). It returns nil rules when no backend has the chain.
func (rd *reader) readIPTables(ctx context.Context, fam iptablesFamily) (*iptablesRules, string, error) {
	var best *iptablesRules
	var bestBin string
	var errs []error
	for _, bin := range []string{fam.nftSave, fam.legacySave} {
		path, err := rd.lookPath(bin)
		if err != nil {
			continue
		}
		if bin == fam.legacySave {
			// Naming a legacy table that does not exist makes the kernel create it.
			exists, err := iptables.LegacyTableExists(rd.procPath, fam == ipv6Family, "nat")
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if !exists {
				continue
			}
		}
		cctx, cancel := context.WithTimeout(ctx, rd.timeout)
		out, err := rd.run(cctx, path, "-t", "nat")
		cancel()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		r, hasServices, err := readIPTablesNAT(bytes.NewReader(out))
		if err != nil {
			errs = append(errs, fmt.Errorf("%s -t nat: %w", bin, err))
			continue
		}
		if !hasServices {
			continue
		}
		if best == nil || len(r.chains) > len(best.chains) {
			best, bestBin = r, bin
		}
	}
	if best == nil && len(errs) > 0 {
		return nil, "", errors.Join(errs...)
	}
	return best, bestBin, nil
}

// readNFT reads kube-proxy's nftables-mode table of one family ("ip" or "ip6") with
// `nft -j list table <family> kube-proxy` (see nftables.go for why JSON). It returns nil rules
// when nft is not installed or the table does not exist.
func (rd *reader) readNFT(ctx context.Context, family string) (*nftRules, error) {
	path, err := rd.lookPath("nft")
	if err != nil {
		return nil, nil
	}
	cctx, cancel := context.WithTimeout(ctx, rd.timeout)
	out, err := rd.run(cctx, path, "-j", "list", "table", family, "kube-proxy")
	cancel()
	if err != nil {
		// nft's words for a table that does not exist (ENOENT).
		if strings.Contains(err.Error(), "No such file or directory") {
			return nil, nil
		}
		return nil, err
	}
	rs, err := nft.Parse(bytes.NewReader(out))
	if err != nil {
		return nil, fmt.Errorf("nft -j list table %s kube-proxy: %w", family, err)
	}
	tb := rs.Table(family, "kube-proxy")
	if tb == nil {
		return nil, nil
	}
	return newNFTRules(tb), nil
}
