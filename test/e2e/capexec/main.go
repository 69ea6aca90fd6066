//go:build e2e

// Command capexec starts a program the way runc starts a Kubernetes container's process whose
// securityContext sets runAsUser to a non-root user, drops ALL capabilities, adds some and sets
// allowPrivilegeEscalation: false: the added capabilities in the bounding, permitted and
// effective sets, none inheritable or ambient, no supplementary groups, no_new_privs. A
// non-root process keeps such capabilities across exec only through file capabilities, which
// is what the lab checks against the image's.
//
//	capexec -uid 65534 -gid 65534 -caps net_admin,net_raw -- PROGRAM ARGS...
package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

var capNumbers = map[string]uint{
	"dac_read_search": unix.CAP_DAC_READ_SEARCH,
	"net_admin":       unix.CAP_NET_ADMIN,
	"net_raw":         unix.CAP_NET_RAW,
}

func main() {
	uid := flag.Int("uid", 65534, "user id")
	gid := flag.Int("gid", 65534, "group id")
	capList := flag.String("caps", "", "capabilities, comma separated (dac_read_search, net_admin, net_raw)")
	flag.Parse()
	if flag.NArg() == 0 {
		fail("no program given")
	}
	var set uint64
	for _, name := range strings.Split(*capList, ",") {
		if name == "" {
			continue
		}
		n, ok := capNumbers[strings.ToLower(name)]
		if !ok {
			fail("unknown capability " + name)
		}
		set |= 1 << n
	}
	prog, err := exec.LookPath(flag.Arg(0))
	if err != nil {
		fail(err.Error())
	}

	// Credentials are per thread: everything below, and the exec, on this one.
	runtime.LockOSThread()
	for c := uint(0); c <= unix.CAP_LAST_CAP; c++ {
		if set&(1<<c) == 0 {
			if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil {
				fail(fmt.Sprintf("dropping capability %d from the bounding set: %v", c, err))
			}
		}
	}
	if err := unix.Prctl(unix.PR_SET_KEEPCAPS, 1, 0, 0, 0); err != nil {
		fail(err.Error())
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, 0, 0, 0); e != 0 {
		fail("setgroups: " + e.Error())
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, uintptr(*gid), uintptr(*gid), uintptr(*gid)); e != 0 {
		fail("setresgid: " + e.Error())
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, uintptr(*uid), uintptr(*uid), uintptr(*uid)); e != 0 {
		fail("setresuid: " + e.Error())
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	data := [2]unix.CapUserData{
		{Effective: uint32(set), Permitted: uint32(set)},
		{Effective: uint32(set >> 32), Permitted: uint32(set >> 32)},
	}
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		fail("capset: " + err.Error())
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		fail(err.Error())
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		fail(err.Error())
	}
	err = syscall.Exec(prog, flag.Args(), os.Environ())
	fail(fmt.Sprintf("exec %s: %v", prog, err))
}

func fail(msg string) {
	fmt.Fprintln(os.Stderr, "capexec:", msg)
	os.Exit(126)
}
