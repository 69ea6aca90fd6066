// Package ipvstest is what the kernel tests of IPVS need: a network namespace of their own with
// IPVS loaded and its loopback up.
package ipvstest

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/proxyhealth/proxyhealth/internal/ipvs"
	"github.com/proxyhealth/proxyhealth/internal/nftnl/nftnltest"
	"github.com/proxyhealth/proxyhealth/internal/testsupport/prereq"
)

// Require skips t unless it runs in a network namespace of its own (nftnltest.ReexecInNetns)
// with IPVS loaded, and brings the namespace's loopback up. A kernel built without IPVS at all
// (no ip_vs module, not built in, as on the development machine) cannot run such a test
// whatever is installed, so t skips even under CI: the kernel matrix (test/vm) runs it on the
// kernels users' nodes run, with ip_vs loaded. A kernel with the module, not loaded, is a
// missing prerequisite.
func Require(t testing.TB) {
	t.Helper()
	if !nftnltest.InNetns() {
		prereq.Skip(t, "needs root and unshare(1) to run in a network namespace of its own")
	}
	RequireLoaded(t)
	loopbackUp(t)
}

// RequireLoaded skips t unless the kernel has IPVS loaded, as Require does: even under CI on a
// kernel built without IPVS, which the kernel matrix stands in for. A lab that makes network
// namespaces of its own (test/e2e) needs no more.
func RequireLoaded(t testing.TB) {
	t.Helper()
	loaded, err := ipvs.Loaded("/proc")
	if err != nil {
		t.Fatal(err)
	}
	if !loaded {
		if !kernelHasIPVS(t) {
			t.Skip("this kernel has no IPVS (no ip_vs module, not built in); the kernel matrix runs this test")
		}
		prereq.Skip(t, "needs the ip_vs module loaded (modprobe ip_vs)")
	}
}

// loopbackUp brings the namespace's loopback up: until it is, the namespace has no local routing
// table, and IPVS refuses an IPv4 real server whose address type it cannot tell (EINVAL).
func loopbackUp(t testing.TB) {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		t.Fatalf("lo's flags: %v", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		t.Fatalf("bring lo up: %v", err)
	}
}

// kernelHasIPVS reports whether the running kernel's module lists name ip_vs.
func kernelHasIPVS(t testing.TB) bool {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		t.Fatal(err)
	}
	release := unix.ByteSliceToString(u.Release[:])
	for _, root := range []string{"/lib/modules", "/usr/lib/modules"} {
		for _, list := range []string{"modules.dep", "modules.builtin"} {
			if listsIPVS(filepath.Join(root, release, list)) {
				return true
			}
		}
	}
	return false
}

func listsIPVS(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if strings.Contains(sc.Text(), "/ip_vs.ko") {
			return true
		}
	}
	return false
}
