// Package capability holds the exporter's Linux capabilities: it raises, at start-up, the
// capabilities the exporter's file capabilities put in its permitted set, and reads and writes
// file capabilities (the security.capability extended attribute) for the image build.
//
// Why: the image runs as a non-root user. Kubernetes runtimes give a non-root container its
// added capabilities in the bounding and permitted sets of the runtime's own process but not in
// the ambient set, so they are gone after the exec of a plain binary. A binary with file
// capabilities gets, at exec, its file's permitted set limited by the bounding set (and, with
// no_new_privs, by the permitted set it had). The image's binary carries its capabilities in
// the permitted set only, without the effective bit: a capability the container was not given
// is then simply absent, where with the effective bit the kernel refuses the exec. The
// process makes the capabilities it has effective itself (Raise), and each collector that
// lacks one reports it.
package capability

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"os"
	"sort"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Set is a set of capabilities, bit n for capability number n.
type Set uint64

// The capabilities the exporter uses.
const (
	DACReadSearch Set = 1 << unix.CAP_DAC_READ_SEARCH
	NetAdmin      Set = 1 << unix.CAP_NET_ADMIN
	NetRaw        Set = 1 << unix.CAP_NET_RAW
)

// names are the capabilities' names as capabilities(7), setcap and /proc list them, by number.
var names = [...]string{
	"cap_chown", "cap_dac_override", "cap_dac_read_search", "cap_fowner", "cap_fsetid",
	"cap_kill", "cap_setgid", "cap_setuid", "cap_setpcap", "cap_linux_immutable",
	"cap_net_bind_service", "cap_net_broadcast", "cap_net_admin", "cap_net_raw", "cap_ipc_lock",
	"cap_ipc_owner", "cap_sys_module", "cap_sys_rawio", "cap_sys_chroot", "cap_sys_ptrace",
	"cap_sys_pacct", "cap_sys_admin", "cap_sys_boot", "cap_sys_nice", "cap_sys_resource",
	"cap_sys_time", "cap_sys_tty_config", "cap_mknod", "cap_lease", "cap_audit_write",
	"cap_audit_control", "cap_setfcap", "cap_mac_override", "cap_mac_admin", "cap_syslog",
	"cap_wake_alarm", "cap_block_suspend", "cap_audit_read", "cap_perfmon", "cap_bpf",
	"cap_checkpoint_restore",
}

// String lists the set's capabilities by name, comma-separated in number order ("" when
// empty); an unnamed capability is cap_N.
func (s Set) String() string {
	var out []string
	for n := 0; n < 64; n++ {
		if s&(1<<n) == 0 {
			continue
		}
		if n < len(names) {
			out = append(out, names[n])
		} else {
			out = append(out, fmt.Sprintf("cap_%d", n))
		}
	}
	return strings.Join(out, ",")
}

// Names lists the set's capabilities in Kubernetes' spelling (NET_ADMIN), sorted.
func (s Set) Names() []string {
	var out []string
	for _, n := range strings.Split(s.String(), ",") {
		if n != "" {
			out = append(out, strings.ToUpper(strings.TrimPrefix(n, "cap_")))
		}
	}
	sort.Strings(out)
	return out
}

// Count is the number of capabilities in the set.
func (s Set) Count() int { return bits.OnesCount64(uint64(s)) }

// Parse reads a comma-separated list of capabilities, each spelled as capabilities(7) does
// (cap_net_admin) or as Kubernetes does (NET_ADMIN), case-insensitive.
func Parse(list string) (Set, error) {
	var s Set
	for _, f := range strings.Split(list, ",") {
		f = strings.ToLower(strings.TrimSpace(f))
		if f == "" {
			continue
		}
		if !strings.HasPrefix(f, "cap_") {
			f = "cap_" + f
		}
		found := false
		for n, name := range names {
			if name == f {
				s |= 1 << n
				found = true
				break
			}
		}
		if !found {
			return 0, fmt.Errorf("unknown capability %q", f)
		}
	}
	return s, nil
}

// State is a thread's capability sets.
type State struct {
	Effective, Permitted, Inheritable Set
}

// Current returns the calling thread's capability sets (every thread of the exporter has the
// same once Raise has run).
func Current() (State, error) {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return State{}, fmt.Errorf("capget: %w", err)
	}
	join := func(lo, hi uint32) Set { return Set(uint64(hi)<<32 | uint64(lo)) }
	return State{
		Effective:   join(data[0].Effective, data[1].Effective),
		Permitted:   join(data[0].Permitted, data[1].Permitted),
		Inheritable: join(data[0].Inheritable, data[1].Inheritable),
	}, nil
}

// ErrCgo is returned by Raise in a binary linked with cgo: the Go runtime can then not change
// the capabilities of all its threads, and changing one thread's would leave the others
// without them.
var ErrCgo = errors.New("capabilities of every thread cannot be set in a binary built with cgo: build with CGO_ENABLED=0 (make build does)")

// raised is what Raise did, for LogAttrs.
var raised struct {
	called bool
	err    error
}

// Raise makes every capability in the permitted set effective, in every thread of the process,
// and returns the effective set. It changes nothing when they already are (a root process, or
// capabilities held as ambient ones). Call it first thing in main.
func Raise() (Set, error) {
	eff, err := raise()
	raised.called, raised.err = true, err
	return eff, err
}

// LogAttrs describes the process's capabilities for the start-up log: the effective set, and
// why Raise could not raise the permitted ones if it could not.
func LogAttrs() []any {
	st, err := Current()
	if err != nil {
		return []any{"err", err}
	}
	attrs := []any{"uid", os.Getuid(), "effective", st.Effective.String()}
	if st.Permitted != st.Effective {
		attrs = append(attrs, "permitted", st.Permitted.String())
	}
	if raised.err != nil {
		attrs = append(attrs, "err", raised.err)
	}
	return attrs
}

func raise() (Set, error) {
	st, err := Current()
	if err != nil {
		return 0, err
	}
	if st.Effective == st.Permitted {
		return st.Effective, nil
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	for i := range data {
		shift := 32 * i
		data[i] = unix.CapUserData{
			Effective:   uint32(st.Permitted >> shift),
			Permitted:   uint32(st.Permitted >> shift),
			Inheritable: uint32(st.Inheritable >> shift),
		}
	}
	// capset(2) changes the calling thread only; the runtime's threads all run it.
	_, _, errno := syscall.AllThreadsSyscall(unix.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0)
	if errno == syscall.ENOTSUP {
		return st.Effective, ErrCgo
	}
	if errno != 0 {
		return st.Effective, fmt.Errorf("capset: %w", errno)
	}
	st, err = Current()
	if err != nil {
		return 0, err
	}
	return st.Effective, nil
}

// The security.capability attribute (linux/capability.h, struct vfs_cap_data).
const (
	xattrName         = "security.capability"
	vfsCapRevision2   = 0x02000000
	vfsCapRevision3   = 0x03000000
	vfsCapRevisionMsk = 0xff000000
	vfsCapFlagsEff    = 0x000001
)

// File is a file's capabilities.
type File struct {
	Permitted, Inheritable Set
	// Effective: the permitted capabilities are made effective at exec, and the exec fails
	// when any of them cannot be had.
	Effective bool
}

// String spells f as setcap and getcap do ("cap_net_admin,cap_net_raw=p").
func (f File) String() string {
	flags := "p"
	if f.Effective {
		flags = "ep"
	}
	s := f.Permitted.String() + "=" + flags
	if f.Inheritable != 0 {
		s += " " + f.Inheritable.String() + "=i"
	}
	return s
}

// ReadFile returns path's file capabilities, and false when it has none.
func ReadFile(path string) (File, bool, error) {
	buf := make([]byte, 64)
	n, err := unix.Getxattr(path, xattrName, buf)
	if errors.Is(err, unix.ENODATA) {
		return File{}, false, nil
	}
	if err != nil {
		return File{}, false, &os.PathError{Op: "getxattr " + xattrName, Path: path, Err: err}
	}
	f, err := decodeFile(buf[:n])
	if err != nil {
		return File{}, false, fmt.Errorf("%s: %w", path, err)
	}
	return f, true, nil
}

// WriteFile gives path the capabilities f (needs CAP_SETFCAP).
func WriteFile(path string, f File) error {
	if err := unix.Setxattr(path, xattrName, encodeFile(f), 0); err != nil {
		return &os.PathError{Op: "setxattr " + xattrName, Path: path, Err: err}
	}
	return nil
}

func encodeFile(f File) []byte {
	b := make([]byte, 20)
	magic := uint32(vfsCapRevision2)
	if f.Effective {
		magic |= vfsCapFlagsEff
	}
	binary.LittleEndian.PutUint32(b[0:], magic)
	binary.LittleEndian.PutUint32(b[4:], uint32(f.Permitted))
	binary.LittleEndian.PutUint32(b[8:], uint32(f.Inheritable))
	binary.LittleEndian.PutUint32(b[12:], uint32(f.Permitted>>32))
	binary.LittleEndian.PutUint32(b[16:], uint32(f.Inheritable>>32))
	return b
}

func decodeFile(b []byte) (File, error) {
	if len(b) < 4 {
		return File{}, fmt.Errorf("%s of %d bytes", xattrName, len(b))
	}
	magic := binary.LittleEndian.Uint32(b)
	want := 0
	switch magic & vfsCapRevisionMsk {
	case vfsCapRevision2:
		want = 20
	case vfsCapRevision3:
		want = 24 // with the root user id of the user namespace that set it
	default:
		return File{}, fmt.Errorf("%s revision %#x not known", xattrName, magic&vfsCapRevisionMsk)
	}
	if len(b) != want {
		return File{}, fmt.Errorf("%s revision %#x of %d bytes, want %d", xattrName, magic&vfsCapRevisionMsk, len(b), want)
	}
	le := binary.LittleEndian
	return File{
		Permitted:   Set(uint64(le.Uint32(b[12:]))<<32 | uint64(le.Uint32(b[4:]))),
		Inheritable: Set(uint64(le.Uint32(b[16:]))<<32 | uint64(le.Uint32(b[8:]))),
		Effective:   magic&vfsCapFlagsEff != 0,
	}, nil
}

// ParseFile reads setcap's spelling of file capabilities, limited to what the image uses:
// "LIST=p" (permitted only) or "LIST=ep".
func ParseFile(spec string) (File, error) {
	list, flags, ok := strings.Cut(spec, "=")
	if !ok {
		list, flags, ok = strings.Cut(spec, "+")
	}
	if !ok {
		return File{}, fmt.Errorf("%q: want LIST=p or LIST=ep", spec)
	}
	s, err := Parse(list)
	if err != nil {
		return File{}, err
	}
	switch flags {
	case "p":
		return File{Permitted: s}, nil
	case "ep", "pe":
		return File{Permitted: s, Effective: true}, nil
	}
	return File{}, fmt.Errorf("%q: flags %q, want p or ep", spec, flags)
}
