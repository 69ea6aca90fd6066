//go:build linux

package main

import (
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The kernel's conntrack garbage collector is global and, on a node whose entries mostly have
// long timeouts, scans only about once a minute: expired entries of the benchmark would then
// sit in the table, and their DESTROY events come in one burst long after the step. A
// ctnetlink dump evicts expired entries as it walks the table, so the reap subcommand dumps
// the table periodically with a mark filter that matches none of the benchmark's entries: the
// kernel walks and evicts, and returns nothing. Expired entries are the only ones it removes,
// and those are gone for good anyway; the DESTROY events then flow about one UDP timeout after
// each NEW, as on a node whose collector keeps up.

const (
	nfnlSubsysCTNetlink = 1
	ipctnlMsgCtGet      = 1
	ctaMark             = 8
	ctaMarkMask         = 21
	reapMark            = 0x7ace5eed
)

// runReap dumps the conntrack table of the current network namespace every --interval until
// --duration has passed.
func runReap(args []string) error {
	fs := flag.NewFlagSet("reap", flag.ContinueOnError)
	interval := fs.Duration("interval", 100*time.Millisecond, "time between dumps")
	dur := fs.Duration("duration", time.Hour, "stop after this long")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *interval < 10*time.Millisecond {
		return errors.New("--interval must be at least 10ms")
	}
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return fmt.Errorf("netlink socket: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("netlink bind: %w", err)
	}
	buf := make([]byte, 64*1024)
	deadline := time.Now().Add(*dur)
	for seq := uint32(1); time.Now().Before(deadline) && seq < 1<<31; seq++ {
		if err := reapOnce(fd, seq, buf); err != nil {
			return err
		}
		time.Sleep(*interval)
	}
	return nil
}

func reapOnce(fd int, seq uint32, buf []byte) error {
	req := make([]byte, 0, 64)
	req = binary.NativeEndian.AppendUint32(req, 0) // length, set below
	req = binary.NativeEndian.AppendUint16(req, nfnlSubsysCTNetlink<<8|ipctnlMsgCtGet)
	req = binary.NativeEndian.AppendUint16(req, unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
	req = binary.NativeEndian.AppendUint32(req, seq)
	req = binary.NativeEndian.AppendUint32(req, 0)
	req = append(req, unix.AF_INET, 0, 0, 0) // nfgenmsg: family, version, res_id
	for _, a := range []uint16{ctaMark, ctaMarkMask} {
		v := uint32(reapMark)
		if a == ctaMarkMask {
			v = 0xffffffff
		}
		req = binary.NativeEndian.AppendUint16(req, 8)
		req = binary.NativeEndian.AppendUint16(req, a)
		req = binary.BigEndian.AppendUint32(req, v)
	}
	binary.NativeEndian.PutUint32(req, uint32(len(req)))
	if err := unix.Sendto(fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("netlink send: %w", err)
	}
	for i := 0; i < 1_000_000; i++ {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return fmt.Errorf("netlink receive: %w", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return fmt.Errorf("netlink parse: %w", err)
		}
		for _, m := range msgs {
			if m.Header.Seq != seq {
				continue
			}
			switch m.Header.Type {
			case unix.NLMSG_DONE:
				return nil
			case unix.NLMSG_ERROR:
				if len(m.Data) >= 4 {
					if e := int32(binary.NativeEndian.Uint32(m.Data)); e != 0 {
						return fmt.Errorf("conntrack dump: %w", unix.Errno(-e))
					}
				}
				return nil
			}
		}
	}
	return errors.New("conntrack dump did not end")
}
