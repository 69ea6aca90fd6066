package node

import (
	"errors"
	"fmt"
	"strings"

	"github.com/proxyhealth/proxyhealth/internal/hostrules"
)

// dropCheck is what the node's forward path says about INVALID packets, from one read of its
// netfilter state (internal/hostrules: iptables-legacy's filter table, iptables-nft's, and
// every native nftables table with a forward base chain).
type dropCheck struct {
	backend  string   // where the drop was found
	path     []string // the rules followed to it; nil when none was found
	readable bool     // at least one backend was read
	errs     []error  // backends that could not be read
}

func checkDrop(st *hostrules.State) dropCheck {
	var dc dropCheck
	for _, fwd := range st.Forward {
		if fwd.Err != nil {
			dc.errs = append(dc.errs, fmt.Errorf("%s: %w", fwd.Backend, fwd.Err))
			continue
		}
		dc.readable = true
		if dc.path != nil {
			continue
		}
		for _, g := range fwd.Graphs {
			if p := g.InvalidDropPath(); p != nil {
				dc.backend, dc.path = fwd.Backend, p
				break
			}
		}
	}
	return dc
}

// err explains what the check could not read. It is nil when a drop was found (the answer is
// certain whatever else failed) or when every backend was read.
func (dc dropCheck) err() error {
	switch {
	case dc.path != nil || len(dc.errs) == 0:
		return nil
	case !dc.readable:
		return fmt.Errorf("invalid drop rule check: no backend could be read: %w", errors.Join(dc.errs...))
	default:
		return fmt.Errorf("invalid drop rule check incomplete, no drop found in what could be read: %w", errors.Join(dc.errs...))
	}
}

func (dc dropCheck) String() string { return dc.backend + ": " + strings.Join(dc.path, " => ") }
