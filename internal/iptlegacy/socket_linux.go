package iptlegacy

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"unsafe"

	"golang.org/x/sys/unix"
)

// socket is the raw socket the x_tables options are asked on (iptables uses the same:
// socket(AF_INET, SOCK_RAW, IPPROTO_RAW)).
type socket struct {
	fd   int
	ipv6 bool
}

func openSocket(ipv6 bool) (*socket, error) {
	if strconv.IntSize != 64 {
		// The kernel hands 32-bit processes its compat layout, which the decoders do not read.
		return nil, errors.New("iptables-legacy: reading tables needs a 64-bit process")
	}
	family := unix.AF_INET
	if ipv6 {
		family = unix.AF_INET6
	}
	fd, err := unix.Socket(family, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
	if err != nil {
		if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) {
			return nil, fmt.Errorf("iptables-legacy: opening a raw socket needs CAP_NET_RAW: %w", os.NewSyscallError("socket", err))
		}
		return nil, fmt.Errorf("iptables-legacy: raw socket: %w", os.NewSyscallError("socket", err))
	}
	return &socket{fd: fd, ipv6: ipv6}, nil
}

func (s *socket) close() { unix.Close(s.fd) }

// getsockopt calls getsockopt(2) with a buffer the caller owns (Go heap or a mapping), which
// x/sys/unix has no helper for.
func (s *socket) getsockopt(opt int, buf []byte) (int, error) {
	level := unix.SOL_IP
	if s.ipv6 {
		level = unix.SOL_IPV6
	}
	n := uint32(len(buf))
	_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(s.fd), uintptr(level), uintptr(opt),
		uintptr(unsafe.Pointer(unsafe.SliceData(buf))), uintptr(unsafe.Pointer(&n)), 0)
	if errno != 0 {
		return 0, errno
	}
	return int(n), nil
}

// errTableGone is a table that the kernel does not have although ip_tables_names listed it a
// moment before.
var errTableGone = errors.New("table gone")

// optError gives a failed x_tables option the capability it lacked, if that is why.
func optError(op, table string, err error) error {
	if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) {
		return fmt.Errorf("iptables-legacy: %s of table %s needs CAP_NET_ADMIN: %w", op, table, os.NewSyscallError("getsockopt", err))
	}
	return fmt.Errorf("iptables-legacy: %s of table %s: %w", op, table, os.NewSyscallError("getsockopt", err))
}

// info asks IPT_SO_GET_INFO. The caller must know the table exists (see TableExists):
// naming one that does not makes the kernel create it.
func (s *socket) info(table string) (Info, error) {
	if len(table) >= tableNameLen {
		return Info{}, fmt.Errorf("iptables-legacy: table name %q too long", table)
	}
	var buf [getInfoSize]byte
	copy(buf[:], table)
	n, err := s.getsockopt(soGetInfo, buf[:])
	if errors.Is(err, unix.ENOENT) {
		return Info{}, errTableGone
	}
	if err != nil {
		return Info{}, optError("get info", table, err)
	}
	return decodeInfo(buf[:n], s.ipv6)
}

// entries asks IPT_SO_GET_ENTRIES for the table info describes, into a fresh mapping. The
// kernel copies the whole table in one call and only when the size asked for is the table's
// current size; EAGAIN means it was replaced by one of another size in between. A table larger
// than limit bytes is refused before anything is allocated.
func (s *socket) entries(info *Info, limit int64, heap bool) (*mapping, error) {
	if int64(info.Size) > limit {
		return nil, fmt.Errorf("%w: table %s is %d bytes, the limit %d", ErrTableTooLarge, info.Table, info.Size, limit)
	}
	m, err := newMapping(getEntriesHeader+int(info.Size), heap)
	if err != nil {
		return nil, fmt.Errorf("iptables-legacy: buffer for table %s (%d bytes): %w", info.Table, info.Size, err)
	}
	copy(m.b, info.Table)
	ne.PutUint32(m.b[tableNameLen:], info.Size)
	if _, err := s.getsockopt(soGetEntries, m.b); err != nil {
		m.free()
		if errors.Is(err, unix.ENOENT) {
			return nil, errTableGone
		}
		if errors.Is(err, unix.EAGAIN) {
			return nil, err
		}
		return nil, optError("get entries", info.Table, err)
	}
	return m, nil
}
