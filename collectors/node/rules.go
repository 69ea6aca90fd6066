package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/proxyhealth/proxyhealth/internal/command"
	"github.com/proxyhealth/proxyhealth/internal/iptables"
	"github.com/proxyhealth/proxyhealth/internal/nft"
)

// CommandRunner runs a command and returns its standard output; see command.Runner.
type CommandRunner = command.Runner

// ExecRunner runs commands with os/exec.
var ExecRunner CommandRunner = command.Run

// backend is one source of forward-path rules.
type backend struct {
	name  string // what the metric's error text calls it
	bin   string
	args  []string
	check func(out []byte) (bool, []string, error)
	// legacy backends are only asked about their filter table when it exists
	// (iptables.LegacyTableExists): naming a missing legacy table makes the kernel create it.
	legacy bool
}

// iptables-legacy-save is run with -t filter only when <procfs>/net/ip_tables_names lists the
// legacy filter table. That file is readable by root only (mode 0440): with CAP_NET_ADMIN and
// CAP_NET_RAW alone the legacy backend reports that it cannot tell, rather than risk creating
// the table.
var (
	legacyBackend = backend{"iptables-legacy", "iptables-legacy-save", []string{"-t", "filter"}, iptablesForwardDrop, true}
	nftBackend    = backend{"iptables-nft", "iptables-nft-save", []string{"-t", "filter"}, iptablesForwardDrop, false}
	// iptablesSave is used when neither split binary exists (an iptables build with only one
	// backend); it reads whichever backend that build uses. Such a build is usually legacy, so
	// it runs without -t: iptables-save then prints only the tables that exist (it reads
	// ip_tables_names itself, and fails without root) and never creates one.
	iptablesSave  = backend{"iptables", "iptables-save", nil, iptablesForwardDrop, false}
	nativeBackend = backend{"nftables", "nft", []string{"-j", "list", "ruleset"}, nftForwardDrop, false}
)

// iptablesForwardDrop parses iptables-save output and looks for an INVALID drop
// reachable from FORWARD.
func iptablesForwardDrop(out []byte) (bool, []string, error) {
	rs, err := iptables.Parse(bytes.NewReader(out))
	if err != nil {
		return false, nil, err
	}
	found, path := rs.InvalidDropReachable("filter", "FORWARD")
	return found, path, nil
}

// nftForwardDrop parses `nft -j list ruleset` output and looks for an INVALID drop reachable
// from a native forward-hook base chain.
func nftForwardDrop(out []byte) (bool, []string, error) {
	rs, err := nft.Parse(bytes.NewReader(out))
	if err != nil {
		return false, nil, err
	}
	found, path := nft.InvalidDropReachable(rs)
	return found, path, nil
}

// backendResult is what one backend told.
type backendResult struct {
	name    string
	missing bool // binary not found: the backend is not in use here
	err     error
	found   bool
	path    []string
}

// Backend is what one source of forward-path rules told the INVALID-drop check; see
// Config.ForwardDrop.
type Backend struct {
	// Name is the backend as the collector's errors name it: "iptables-legacy", "iptables-nft",
	// "iptables" (an iptables build with one backend) or "nftables".
	Name string
	// Missing is set when the backend is not in use here (its binary is not installed).
	Missing bool
	// Err says why its rules could not be read.
	Err error
	// DropPath is the rules from the forward path to a conntrack INVALID drop; empty when none
	// is reachable.
	DropPath []string
}

// fromBackends is a check whose backends were read by Config.ForwardDrop, finished at at.
func fromBackends(bs []Backend, at time.Time) *rulesResult {
	res := &rulesResult{at: at}
	for _, b := range bs {
		res.backends = append(res.backends, backendResult{name: b.Name, missing: b.Missing, err: b.Err, found: len(b.DropPath) > 0, path: b.DropPath})
	}
	return res
}

// rulesResult is one background check.
type rulesResult struct {
	at       time.Time
	backends []backendResult
}

// readable reports whether any backend could be read.
func (r *rulesResult) readable() bool {
	for _, b := range r.backends {
		if !b.missing && b.err == nil {
			return true
		}
	}
	return false
}

// found returns the first backend's path to an INVALID drop.
func (r *rulesResult) found() (string, []string, bool) {
	for _, b := range r.backends {
		if b.found {
			return b.name, b.path, true
		}
	}
	return "", nil, false
}

// err explains what the check could not read. It is nil when a drop was found (the answer is
// certain whatever else failed) or when every backend whose binary exists was read. Missing
// binaries are only named when nothing could be read at all.
func (r *rulesResult) err() error {
	if _, _, ok := r.found(); ok {
		return nil
	}
	var errs []error
	var missing []string
	for _, b := range r.backends {
		switch {
		case b.missing:
			missing = append(missing, b.name)
		case b.err != nil:
			errs = append(errs, fmt.Errorf("%s: %w", b.name, b.err))
		}
	}
	if !r.readable() {
		msg := "invalid drop rule check: no backend could be read"
		if len(missing) > 0 {
			msg += " (binaries not found: " + strings.Join(missing, ", ") + ")"
		}
		return fmt.Errorf("%s: %w", msg, errors.Join(errs...))
	}
	if len(errs) > 0 {
		return fmt.Errorf("invalid drop rule check incomplete, no drop found in what could be read: %w", errors.Join(errs...))
	}
	return nil
}

// checkRules runs every backend's command (each bounded by timeout) and evaluates its output. A
// legacy backend is only run when procPath's table list shows its filter table exists.
func checkRules(ctx context.Context, procPath string, run CommandRunner, lookPath func(string) (string, error), timeout time.Duration, now func() time.Time) *rulesResult {
	res := &rulesResult{}
	_, legacyErr := lookPath(legacyBackend.bin)
	_, nftErr := lookPath(nftBackend.bin)
	backends := []backend{legacyBackend, nftBackend}
	if legacyErr != nil && nftErr != nil {
		backends = []backend{iptablesSave}
	}
	backends = append(backends, nativeBackend)
	for _, b := range backends {
		br := backendResult{name: b.name}
		path, err := lookPath(b.bin)
		if err != nil {
			br.missing = true
			br.err = err
			res.backends = append(res.backends, br)
			continue
		}
		if b.legacy {
			exists, err := iptables.LegacyTableExists(procPath, false, "filter")
			if err != nil || !exists {
				// No table is a certain "no rule here"; an unreadable list is an error.
				br.err = err
				res.backends = append(res.backends, br)
				continue
			}
		}
		cctx, cancel := context.WithTimeout(ctx, timeout)
		out, err := run(cctx, path, b.args...)
		cancel()
		cmdline := strings.Join(append([]string{b.bin}, b.args...), " ")
		if err != nil {
			br.err = fmt.Errorf("%s: %w", cmdline, err)
		} else if br.found, br.path, err = b.check(out); err != nil {
			br.err = fmt.Errorf("%s: %w", cmdline, err)
		}
		res.backends = append(res.backends, br)
	}
	res.at = now()
	return res
}
