package node

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/proxyhealth/proxyhealth/internal/sysctl"
)

// Settings are the node settings the verdict judges, read now (sysctls) and from the rules'
// last read. A nil field was not read; Err and RulesErr say why.
type Settings struct {
	// BridgeNFCallIptables is 1, 0, or -1 when br_netfilter is not loaded.
	BridgeNFCallIptables *int
	TCPBeLiberal         *int
	ConntrackEvents      *int
	// InvalidDrop tells whether a ctstate INVALID drop is reachable from the forward path:
	// true when one was found (InvalidDropPath names it), false only when every backend was
	// read and none was found.
	InvalidDrop     *bool
	InvalidDropPath string
	Err             error // sysctls that could not be read
	RulesErr        error // why InvalidDrop is nil
}

// Settings reads the sysctls and looks at the rules' last read. It waits on nothing.
func (c *Collector) Settings() Settings {
	var s Settings
	var errs []error
	for _, x := range []struct {
		dst  **int
		path string
	}{
		{&s.BridgeNFCallIptables, sysctl.BridgeNFCallIptables},
		{&s.TCPBeLiberal, sysctl.ConntrackTCPBeLiberal},
		{&s.ConntrackEvents, sysctl.ConntrackEvents},
	} {
		v, exists, err := sysctl.ReadInt(filepath.Join(c.cfg.ProcPath, x.path))
		switch {
		case err != nil:
			errs = append(errs, err)
		case !exists && x.path == sysctl.BridgeNFCallIptables:
			minus := -1
			*x.dst = &minus
		case !exists:
			errs = append(errs, fmt.Errorf("%s not found: is nf_conntrack loaded?", filepath.Join(c.cfg.ProcPath, x.path)))
		default:
			n := int(v)
			*x.dst = &n
		}
	}
	s.Err = errors.Join(errs...)

	switch {
	case c.cfg.Rules == nil:
		s.RulesErr = errors.New("the node's netfilter rules are not read")
	case c.cfg.Rules.State() == nil:
		s.RulesErr = errors.New("the node's netfilter rules have not been read yet")
	default:
		dc := checkDrop(c.cfg.Rules.State())
		switch {
		case dc.path != nil:
			found := true
			s.InvalidDrop, s.InvalidDropPath = &found, dc.backend+": "+strings.Join(dc.path, " => ")
		case dc.err() != nil:
			s.RulesErr = dc.err()
		default:
			none := false
			s.InvalidDrop = &none
		}
	}
	return s
}
