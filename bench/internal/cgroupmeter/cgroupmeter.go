//go:build linux

// Package cgroupmeter measures a process tree as a whole, its children included: the CPU time
// and memory of a pair of cgroup v1 directories of the same name, one under the cpuacct
// hierarchy and one under the memory hierarchy, that the tree's root joins before it starts
// and its children inherit. It needs root and the cgroup v1 hierarchies under Root.
package cgroupmeter

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/proxyhealth/proxyhealth/bench/internal/benchns"
)

// Root is where the cgroup v1 hierarchies are mounted.
const Root = "/sys/fs/cgroup"

// namePrefix begins every prefix a benchmark names its groups with, so that a prefix can never
// take in cgroups that are not a benchmark's.
const namePrefix = "ph-bench-"

// Group is a pair of cgroup v1 directories, cpuacct and memory, of the same name. A process
// started through Wrap joins both before it enters its network namespace (`ip netns exec`
// mounts a sysfs of its own, where the hierarchies are not), and its children inherit them,
// so the figures are the whole process tree's.
type Group struct {
	prefix   string
	cpu, mem string // directories
}

// New makes a group named prefix + role + a random suffix. prefix marks the benchmark's groups
// (RemoveLeftovers removes them); it must begin with "ph-bench-".
func New(prefix, role string) (*Group, error) {
	if err := checkPrefix(prefix); err != nil {
		return nil, err
	}
	name := benchns.NewName(prefix + role + "-") // random suffix
	g := &Group{prefix: prefix, cpu: filepath.Join(Root, "cpuacct", name), mem: filepath.Join(Root, "memory", name)}
	for _, d := range []string{g.cpu, g.mem} {
		if err := os.Mkdir(d, 0o755); err != nil {
			g.Remove()
			return nil, fmt.Errorf("cgroup v1 (measuring a process tree needs the cpuacct and memory hierarchies under %s): %w", Root, err)
		}
	}
	return g, nil
}

func checkPrefix(prefix string) error {
	if !strings.HasPrefix(prefix, namePrefix) {
		return fmt.Errorf("cgroup prefix %q does not begin with %q", prefix, namePrefix)
	}
	return nil
}

// Wrap returns a command line that runs argv in namespace ns inside the group: a shell writes
// its own pid to both tasks files, then execs `ip netns exec ns argv...` (which execs argv), so
// the pid the caller starts is argv's own.
func (g *Group) Wrap(ns string, argv ...string) []string {
	return append([]string{"sh", "-c", `echo $$ > "$1" && echo $$ > "$2" && shift 2 && exec "$@"`, "sh",
		filepath.Join(g.cpu, "tasks"), filepath.Join(g.mem, "tasks"), "ip", "netns", "exec", ns}, argv...)
}

func readUint(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
}

// CPUNanos is the CPU time (user and system, every CPU) the group's tasks used since it was
// made, in nanoseconds (cpuacct.usage).
func (g *Group) CPUNanos() (uint64, error) {
	return readUint(filepath.Join(g.cpu, "cpuacct.usage"))
}

// MaxUsage is memory.max_usage_in_bytes: the peak of the group's charged memory (anonymous,
// page cache and kernel memory) since it was made or last reset.
func (g *Group) MaxUsage() (uint64, error) {
	return readUint(filepath.Join(g.mem, "memory.max_usage_in_bytes"))
}

// Usage is memory.usage_in_bytes now.
func (g *Group) Usage() (uint64, error) {
	return readUint(filepath.Join(g.mem, "memory.usage_in_bytes"))
}

// ResetMax sets memory.max_usage_in_bytes to the current usage.
func (g *Group) ResetMax() error {
	return os.WriteFile(filepath.Join(g.mem, "memory.max_usage_in_bytes"), []byte("0"), 0o644)
}

// Procs lists the processes (thread group ids) in the group.
func (g *Group) Procs() []int {
	return procs(g.mem)
}

func procs(dir string) []int {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return nil
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// Remove kills whatever still runs in the group (only ever the benchmark's own processes) and
// removes both directories, waiting a bounded time for the tasks to go.
func (g *Group) Remove() error {
	if g == nil {
		return nil
	}
	return removeDirs(g.prefix, g.cpu, g.mem)
}

func removeDirs(prefix string, dirs ...string) error {
	var errs []error
	for _, d := range dirs {
		if !strings.HasPrefix(filepath.Base(d), prefix) {
			errs = append(errs, fmt.Errorf("refusing to remove cgroup %s", d))
			continue
		}
		if _, err := os.Stat(d); errors.Is(err, os.ErrNotExist) {
			continue
		}
		for range 50 { // 5 s
			pids := procs(d)
			if len(pids) == 0 {
				break
			}
			for _, pid := range pids {
				if pid > 1 && pid != os.Getpid() {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
			time.Sleep(100 * time.Millisecond)
		}
		var err error
		for range 20 { // rmdir fails with EBUSY until the last task is gone
			if err = syscall.Rmdir(d); err == nil || errors.Is(err, os.ErrNotExist) {
				err = nil
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("rmdir %s: %w", d, err))
		}
	}
	return errors.Join(errs...)
}

// RemoveLeftovers removes the groups named with prefix that an earlier run left when it died
// (the caller holds the benchmark lock, so no other run uses them).
func RemoveLeftovers(prefix string) error {
	if err := checkPrefix(prefix); err != nil {
		return err
	}
	var errs []error
	for _, h := range []string{"cpuacct", "memory"} {
		ents, _ := os.ReadDir(filepath.Join(Root, h))
		for _, e := range ents {
			if e.IsDir() && strings.HasPrefix(e.Name(), prefix) {
				fmt.Fprintf(os.Stderr, "removing leftover cgroup %s/%s\n", h, e.Name())
				errs = append(errs, removeDirs(prefix, filepath.Join(Root, h, e.Name())))
			}
		}
	}
	return errors.Join(errs...)
}
