package hostrules

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/proxyhealth/proxyhealth/internal/nftnl"
	"github.com/proxyhealth/proxyhealth/internal/ruleset"
)

// refusingFollower is an nftnl.Follower whose every read fails with err.
type refusingFollower struct{ err error }

func (f refusingFollower) Generation(context.Context) (uint32, error)     { return 0, f.err }
func (f refusingFollower) Resync(context.Context) error                   { return f.err }
func (f refusingFollower) Apply(context.Context, ...nftnl.Change) error   { return f.err }
func (f refusingFollower) IPTablesNAT(bool) (*ruleset.ProxyTable, error)  { return nil, f.err }
func (f refusingFollower) KubeProxyNFT(bool) (*ruleset.ProxyTable, error) { return nil, f.err }

// refusingForward is an nftnl.ForwardReader whose every read fails with err.
type refusingForward struct {
	err   error
	reads int
}

func (f *refusingForward) Read(context.Context, []nftnl.Change) ([]*ruleset.Graph, error) {
	f.reads++
	return nil, f.err
}

// The errors internal/nftnl gives on a kernel without nf_tables
// (nftnl.TestForwardReaderWithoutNFTables, TestDialWithoutNFNetlink), and without the
// privilege to read it.
var (
	noNFNetlink = fmt.Errorf("open netfilter netlink socket: %w: %w", nftnl.ErrNotSupported, unix.EPROTONOSUPPORT)
	noNFTables  = fmt.Errorf("read nf_tables generation: %w: %w", nftnl.ErrNotSupported, unix.EINVAL)
	noPrivilege = fmt.Errorf("read nf_tables generation: %w: %w", nftnl.ErrPermission, unix.EPERM)
)

// systemSource is a Source on the system backends with nftnl's readers failing as given; the
// legacy tables are read from an empty procfs, where there are none.
func systemSource(t *testing.T, dialErr, readErr error) (*Source, *refusingForward, *int) {
	t.Helper()
	dials := 0
	fwd := &refusingForward{err: readErr}
	b := newSystemBackends(Config{ProcPath: t.TempDir()})
	b.forward = fwd
	b.newFollower = func() (nftFollower, error) {
		dials++
		if dialErr != nil {
			return nil, dialErr
		}
		return refusingFollower{err: readErr}, nil
	}
	return newSource(Config{}, nil, b), fwd, &dials
}

// read is one poll of the Source without a watch: both backends read, then published.
func read(s *Source) *State {
	s.readLegacy()
	s.readNFT(nil)
	s.publish()
	return s.State()
}

// A kernel without nf_tables has none of its backends in use: no error for kube-proxy's rules
// or for any forward path (State.Forward), so the INVALID drop check is complete with what
// the other backends say; and a poll does not read it again for nothing.
func TestSystemBackendsWithoutNFTables(t *testing.T) {
	for _, tc := range []struct {
		name             string
		dialErr, readErr error
	}{
		{"no nfnetlink: the socket is refused", noNFNetlink, nil},
		{"no nf_tables: every request is refused", nil, noNFTables},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, fwd, dials := systemSource(t, tc.dialErr, tc.readErr)
			for i := range 2 {
				st := read(s)
				if st.ProxyErr != nil || st.Mode != ModeNone {
					t.Errorf("read %d: mode %q, proxy error %v; want none and no error", i, st.Mode, st.ProxyErr)
				}
				for _, f := range st.Forward {
					if f.Err != nil || len(f.Graphs) != 0 {
						t.Errorf("read %d: forward %s: %d graphs, error %v; want nothing and no error", i, f.Backend, len(f.Graphs), f.Err)
					}
				}
			}
			if tc.readErr != nil && fwd.reads != 1 {
				t.Errorf("forward path read %d times over two polls, want once (nothing moves without nf_tables)", fwd.reads)
			}
			if tc.dialErr != nil && (*dials != 2 || fwd.reads != 0) {
				t.Errorf("%d dials, %d forward reads over two polls; want the socket tried at each, nothing read", *dials, fwd.reads)
			}
		})
	}
}

// Any other failure to read nf_tables is still said, for every backend it hides.
func TestSystemBackendsNFTablesRefused(t *testing.T) {
	s, _, _ := systemSource(t, nil, noPrivilege)
	st := read(s)
	if !errors.Is(st.ProxyErr, nftnl.ErrPermission) {
		t.Errorf("proxy error %v, want the refusal", st.ProxyErr)
	}
	for _, f := range st.Forward {
		if wantErr := f.Backend != BackendLegacy; errors.Is(f.Err, nftnl.ErrPermission) != wantErr {
			t.Errorf("forward %s: error %v, want the refusal: %v", f.Backend, f.Err, wantErr)
		}
	}
}

// A read limit of 0 is the reader's default; a negative one is refused, naming its flag.
func TestConfigReadLimits(t *testing.T) {
	base := Config{LegacyPollInterval: time.Second, ResyncInterval: time.Minute, ProcPath: t.TempDir()}
	if _, err := New(base, nil); err != nil {
		t.Errorf("zero limits: %v", err)
	}
	for _, tc := range []struct {
		flag string
		set  func(*Config)
	}{
		{"--netfilter.max-dump-bytes", func(c *Config) { c.MaxDumpBytes = -1 }},
		{"--netfilter.legacy-max-table-bytes", func(c *Config) { c.LegacyMaxTableBytes = -1 }},
	} {
		cfg := base
		tc.set(&cfg)
		if _, err := New(cfg, nil); err == nil || !strings.Contains(err.Error(), tc.flag) {
			t.Errorf("negative %s: %v, want an error naming it", tc.flag, err)
		}
	}
}
