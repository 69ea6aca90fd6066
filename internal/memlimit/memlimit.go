// Package memlimit reads the memory limit of the cgroup the process runs in: a container's
// memory limit, which is what the process can hold before the kernel kills it. It reads cgroup
// v1 (the memory controller's hierarchy) and v2, finding the process's cgroup directory from
// /proc/self/cgroup and /proc/self/mountinfo.
package memlimit

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
)

// unlimitedFrom is the value from which a limit counts as none: cgroup v1 gives "no limit" as
// the largest page-aligned int64 (9223372036854771712), and no machine has 4 EiB.
const unlimitedFrom = 1 << 62

// Limit is the process's cgroup memory limit.
type Limit struct {
	// Bytes is the limit; 0 when there is none.
	Bytes int64
	// Source is the file it was read from, for the log.
	Source string
}

// Read returns the memory limit of the process's cgroup, as procSelf (normally /proc/self)
// describes it. On cgroup v1 it is the memory controller's hierarchical limit (the smallest of
// the cgroup's and its ancestors'); on v2 the smallest memory.max from the cgroup up to the
// mount's root. A process in no memory cgroup has no limit.
func Read(procSelf string) (Limit, error) {
	dir, v2, err := Dir(procSelf)
	if err != nil || dir == "" {
		return Limit{}, err
	}
	if v2 {
		return readV2(dir)
	}
	return readV1(dir)
}

// Dir returns the directory of the process's memory cgroup as procSelf describes it, and
// whether it is cgroup v2; "" when the process is in none.
func Dir(procSelf string) (dir string, v2 bool, err error) {
	cgroups, err := os.ReadFile(filepath.Join(procSelf, "cgroup"))
	if err != nil {
		return "", false, fmt.Errorf("memory cgroup: %w", err)
	}
	mountinfo, err := os.ReadFile(filepath.Join(procSelf, "mountinfo"))
	if err != nil {
		return "", false, fmt.Errorf("memory cgroup: %w", err)
	}
	return cgroupDir(cgroups, mountinfo)
}

// readV1 reads hierarchical_memory_limit from memory.stat: the cgroup's effective limit.
func readV1(dir string) (Limit, error) {
	file := filepath.Join(dir, "memory.stat")
	b, err := os.ReadFile(file)
	if err != nil {
		return Limit{}, fmt.Errorf("memory cgroup v1: %w", err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		value, ok := strings.CutPrefix(line, "hierarchical_memory_limit ")
		if !ok {
			continue
		}
		n, err := parseLimit(value)
		if err != nil {
			return Limit{}, fmt.Errorf("memory cgroup v1: %s: %w", file, err)
		}
		return Limit{Bytes: n, Source: file}, nil
	}
	return Limit{}, fmt.Errorf("memory cgroup v1: %s has no hierarchical_memory_limit", file)
}

// readV2 walks from dir up to the cgroup2 mount, taking the smallest memory.max; the root
// cgroup has none.
func readV2(dir string) (Limit, error) {
	var lim Limit
	for d := dir; ; d = filepath.Dir(d) {
		file := filepath.Join(d, "memory.max")
		b, err := os.ReadFile(file)
		if errors.Is(err, os.ErrNotExist) {
			break // the mount's root, or above it
		}
		if err != nil {
			return Limit{}, fmt.Errorf("memory cgroup v2: %w", err)
		}
		n, err := parseLimit(strings.TrimSpace(string(b)))
		if err != nil {
			return Limit{}, fmt.Errorf("memory cgroup v2: %s: %w", file, err)
		}
		if n > 0 && (lim.Bytes == 0 || n < lim.Bytes) {
			lim = Limit{Bytes: n, Source: file}
		}
		if d == filepath.Dir(d) {
			break
		}
	}
	return lim, nil
}

// parseLimit reads a limit as the cgroup files give it: bytes, or "max" (v2) or a huge value
// (v1) for none, which is 0.
func parseLimit(s string) (int64, error) {
	s = strings.TrimSpace(s)
	if s == "max" {
		return 0, nil
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("limit %q: %w", s, err)
	}
	if n >= unlimitedFrom {
		return 0, nil
	}
	return int64(n), nil
}

// cgroupDir finds the directory of the process's memory cgroup from /proc/self/cgroup and
// /proc/self/mountinfo: in the v1 memory hierarchy when the process is in one (a hybrid system
// keeps the memory controller there), else in the v2 one. dir is "" when the process is in
// neither; a cgroup that is not mounted where the process can see it is an error, not the
// absence of a limit.
func cgroupDir(cgroups, mountinfo []byte) (dir string, v2 bool, err error) {
	var v1Path, v2Path string
	var hasV1, hasV2 bool
	for line := range bytes.SplitSeq(cgroups, []byte("\n")) {
		// hierarchy-ID:controller-list:cgroup-path
		id, rest, found := strings.Cut(string(line), ":")
		if !found {
			continue
		}
		controllers, p, found := strings.Cut(rest, ":")
		if !found {
			continue
		}
		switch {
		case id == "0" && controllers == "":
			v2Path, hasV2 = p, true
		case hasController(controllers, "memory"):
			v1Path, hasV1 = p, true
		}
	}
	sc := bufio.NewScanner(bytes.NewReader(mountinfo))
	sc.Buffer(nil, 1<<20)
	var v1Mount, v2Mount *mount
	for sc.Scan() {
		m, ok := parseMount(sc.Text())
		if !ok {
			continue
		}
		switch {
		case m.fsType == "cgroup" && hasController(m.superOptions, "memory") && v1Mount == nil:
			v1Mount = &m
		case m.fsType == "cgroup2" && v2Mount == nil:
			v2Mount = &m
		}
	}
	switch {
	case hasV1 && v1Mount == nil:
		return "", false, fmt.Errorf("memory cgroup v1 %s: the memory hierarchy is not mounted", v1Path)
	case hasV1:
		return v1Mount.dirOf(v1Path), false, nil
	case hasV2 && v2Mount == nil:
		return "", true, fmt.Errorf("memory cgroup v2 %s: no cgroup2 mount", v2Path)
	case hasV2:
		return v2Mount.dirOf(v2Path), true, nil
	}
	return "", false, nil
}

func hasController(list, name string) bool {
	for c := range strings.SplitSeq(list, ",") {
		if c == name {
			return true
		}
	}
	return false
}

// mount is one line of mountinfo, the fields this package needs.
type mount struct {
	root, point, fsType, superOptions string
}

// parseMount reads a mountinfo line (proc(5)): ID, parent ID, major:minor, root, mount point,
// mount options, optional fields up to "-", then the filesystem type, source and super options.
func parseMount(line string) (mount, bool) {
	fields := strings.Fields(line)
	sep := -1
	for i := 6; i < len(fields); i++ {
		if fields[i] == "-" {
			sep = i
			break
		}
	}
	if sep < 0 || sep+3 >= len(fields) {
		return mount{}, false
	}
	m := mount{
		root:         unescape(fields[3]),
		point:        filepath.Clean(unescape(fields[4])),
		fsType:       fields[sep+1],
		superOptions: fields[sep+3],
	}
	// Mount points are absolute; anything else is no mount.
	return m, filepath.IsAbs(m.point)
}

// dirOf is the directory of cgroup p (a path from the hierarchy's root) under this mount. A
// cgroup outside what the mount shows (a cgroup namespace's view, or a mount of a subtree
// the process is not in) is taken to be the mount's root.
func (m *mount) dirOf(p string) string {
	rel, ok := strings.CutPrefix(path.Clean("/"+p), path.Clean(m.root))
	if !ok || (rel != "" && !strings.HasPrefix(rel, "/") && m.root != "/") {
		return m.point
	}
	return filepath.Join(m.point, filepath.FromSlash(rel))
}

// unescape undoes mountinfo's octal escapes of space, tab, newline and backslash (\040).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) && isOctal(s[i+1]) && isOctal(s[i+2]) && isOctal(s[i+3]) {
			b.WriteByte((s[i+1]-'0')<<6 | (s[i+2]-'0')<<3 | (s[i+3] - '0'))
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isOctal(c byte) bool { return c >= '0' && c <= '7' }
