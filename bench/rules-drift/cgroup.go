//go:build linux

package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The node-cost benchmark's cgroups (v1): one under the cpuacct hierarchy and one under the
// memory hierarchy per measured process tree, named cgPrefix + role + random suffix.
const (
	cgroupRoot = "/sys/fs/cgroup"
	cgPrefix   = "ph-bench-nc-"
)

// cgroup is a pair of cgroup v1 directories, cpuacct and memory, of the same name. A process
// started through wrap joins both before it enters its network namespace (`ip netns exec`
// mounts a sysfs of its own, where the hierarchies are not), and its children inherit them,
// so the figures are the whole process tree's.
type cgroup struct {
	name     string
	cpu, mem string // directories
}

func newCgroup(role string) (*cgroup, error) {
	name := newNSName(role) // random suffix
	name = cgPrefix + strings.TrimPrefix(name, nsPrefix)
	cg := &cgroup{name: name, cpu: filepath.Join(cgroupRoot, "cpuacct", name), mem: filepath.Join(cgroupRoot, "memory", name)}
	for _, d := range []string{cg.cpu, cg.mem} {
		if err := os.Mkdir(d, 0o755); err != nil {
			cg.remove()
			return nil, fmt.Errorf("cgroup v1 (the node-cost benchmark needs the cpuacct and memory hierarchies under %s): %w", cgroupRoot, err)
		}
	}
	return cg, nil
}

// wrap returns a command line that runs argv in namespace ns inside the cgroup: a shell writes
// its own pid to both tasks files, then execs `ip netns exec ns argv...` (which execs argv), so
// the pid the caller starts is argv's own.
func (cg *cgroup) wrap(ns string, argv ...string) []string {
	return append([]string{"sh", "-c", `echo $$ > "$1" && echo $$ > "$2" && shift 2 && exec "$@"`, "sh",
		filepath.Join(cg.cpu, "tasks"), filepath.Join(cg.mem, "tasks"), "ip", "netns", "exec", ns}, argv...)
}

func readUint(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
}

// cpuNS is the CPU time (user and system, every CPU) the cgroup's tasks used since it was made.
func (cg *cgroup) cpuNS() (uint64, error) {
	return readUint(filepath.Join(cg.cpu, "cpuacct.usage"))
}

// maxUsage is memory.max_usage_in_bytes: the peak of the cgroup's charged memory (anonymous,
// page cache and kernel memory) since it was made or last reset.
func (cg *cgroup) maxUsage() (uint64, error) {
	return readUint(filepath.Join(cg.mem, "memory.max_usage_in_bytes"))
}

// usage is memory.usage_in_bytes now.
func (cg *cgroup) usage() (uint64, error) {
	return readUint(filepath.Join(cg.mem, "memory.usage_in_bytes"))
}

// resetMax sets memory.max_usage_in_bytes to the current usage.
func (cg *cgroup) resetMax() error {
	return os.WriteFile(filepath.Join(cg.mem, "memory.max_usage_in_bytes"), []byte("0"), 0o644)
}

// procs lists the processes (thread group ids) in the memory cgroup.
func (cg *cgroup) procs() []int {
	return cgroupProcs(cg.mem)
}

func cgroupProcs(dir string) []int {
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

// remove kills whatever still runs in the cgroup (only ever the benchmark's own processes)
// and removes both directories, waiting a bounded time for the tasks to go.
func (cg *cgroup) remove() error {
	if cg == nil {
		return nil
	}
	return removeCgroupDirs(cg.cpu, cg.mem)
}

func removeCgroupDirs(dirs ...string) error {
	var errs []error
	for _, d := range dirs {
		if !strings.HasPrefix(filepath.Base(d), cgPrefix) {
			errs = append(errs, fmt.Errorf("refusing to remove cgroup %s", d))
			continue
		}
		if _, err := os.Stat(d); errors.Is(err, os.ErrNotExist) {
			continue
		}
		for range 50 { // 5 s
			pids := cgroupProcs(d)
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

// removeLeftoverCgroups removes the cgroups of an earlier run that died (the caller holds the
// benchmark lock, so no other run uses them).
func removeLeftoverCgroups() error {
	var errs []error
	for _, h := range []string{"cpuacct", "memory"} {
		ents, _ := os.ReadDir(filepath.Join(cgroupRoot, h))
		for _, e := range ents {
			if e.IsDir() && strings.HasPrefix(e.Name(), cgPrefix) {
				fmt.Fprintf(os.Stderr, "removing leftover cgroup %s/%s\n", h, e.Name())
				errs = append(errs, removeCgroupDirs(filepath.Join(cgroupRoot, h, e.Name())))
			}
		}
	}
	return errors.Join(errs...)
}
