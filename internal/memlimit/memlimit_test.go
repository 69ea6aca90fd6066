package memlimit

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeSelf writes a /proc/self with cgroup and mountinfo, and the cgroup files under root
// (relative path to contents); the mountinfo's mount points are %s-formatted with root.
func fakeSelf(t *testing.T, cgroup, mountinfo string, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	self := filepath.Join(root, "self")
	for name, content := range map[string]string{
		filepath.Join(self, "cgroup"):    cgroup,
		filepath.Join(self, "mountinfo"): strings.ReplaceAll(mountinfo, "ROOT", root),
	} {
		write(t, name, content)
	}
	for name, content := range files {
		write(t, filepath.Join(root, name), content)
	}
	return self
}

func write(t *testing.T, name, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(name, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// This machine's shape: cgroup v1 with the memory controller in a hierarchy of its own, the
// process in a nested cgroup, and a cgroup2 mount with no controllers besides.
const v1Mountinfo = `31 23 0:28 / ROOT/fs tmpfs rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / ROOT/fs/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / ROOT/fs/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / ROOT/fs/unified rw,relatime - cgroup2 cgroup2 rw
`

const v1Cgroup = `4:memory:/pods/pod1
1:cpu:/
0::/
`

func TestReadV1(t *testing.T) {
	self := fakeSelf(t, v1Cgroup, v1Mountinfo, map[string]string{
		"fs/memory/pods/pod1/memory.stat": "cache 0\nrss 4096\nhierarchical_memory_limit 402653184\nhierarchical_memsw_limit 9223372036854771712\n",
	})
	got, err := Read(self)
	if err != nil {
		t.Fatal(err)
	}
	if got.Bytes != 384<<20 || !strings.HasSuffix(got.Source, "fs/memory/pods/pod1/memory.stat") {
		t.Errorf("Read = %+v, want 402653184 from fs/memory/pods/pod1/memory.stat", got)
	}
}

func TestReadV1Unlimited(t *testing.T) {
	self := fakeSelf(t, v1Cgroup, v1Mountinfo, map[string]string{
		"fs/memory/pods/pod1/memory.stat": "hierarchical_memory_limit 9223372036854771712\n",
	})
	got, err := Read(self)
	if err != nil || got.Bytes != 0 {
		t.Errorf("Read = %+v, %v; want no limit", got, err)
	}
}

// A container's view: a cgroup namespace shows the process at its mount's root.
func TestReadV2Container(t *testing.T) {
	self := fakeSelf(t, "0::/\n", "29 22 0:26 / ROOT/cg ro,nosuid - cgroup2 cgroup2 rw,nsdelegate\n", map[string]string{
		"cg/memory.max": "268435456\n",
	})
	got, err := Read(self)
	if err != nil || got.Bytes != 256<<20 {
		t.Errorf("Read = %+v, %v; want 268435456", got, err)
	}
}

// On a host's cgroup2 mount the smallest limit on the way up counts; "max" is none.
func TestReadV2Ancestors(t *testing.T) {
	for _, tc := range []struct {
		name         string
		leaf, parent string
		want         int64
		wantSource   string
	}{
		{"leaf smaller", "100000\n", "200000\n", 100000, "kubepods/pod/memory.max"},
		{"parent smaller", "max\n", "200000\n", 200000, "kubepods/memory.max"},
		{"none", "max\n", "max\n", 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			self := fakeSelf(t, "0::/kubepods/pod\n", "29 22 0:26 / ROOT/cg rw - cgroup2 cgroup2 rw\n", map[string]string{
				"cg/kubepods/pod/memory.max": tc.leaf,
				"cg/kubepods/memory.max":     tc.parent,
			})
			got, err := Read(self)
			if err != nil || got.Bytes != tc.want || !strings.HasSuffix(got.Source, tc.wantSource) {
				t.Errorf("Read = %+v, %v; want %d from %s", got, err, tc.want, tc.wantSource)
			}
		})
	}
}

// A process in a memory cgroup whose hierarchy is not mounted in its view (a container
// without /sys/fs/cgroup, `ip netns exec`, which mounts a /sys of its own) cannot tell its
// limit: that is an error, not the absence of a limit.
func TestReadUnmountedCgroup(t *testing.T) {
	for name, tc := range map[string]struct{ cgroup, mountinfo string }{
		"v1": {v1Cgroup, "31 23 0:28 / ROOT/fs tmpfs rw,relatime - tmpfs tmpfs rw,mode=755\n"},
		"v2": {"0::/kubepods/pod\n", "31 23 0:28 / ROOT/fs tmpfs rw,relatime - tmpfs tmpfs rw,mode=755\n"},
	} {
		t.Run(name, func(t *testing.T) {
			if got, err := Read(fakeSelf(t, tc.cgroup, tc.mountinfo, nil)); err == nil || !strings.Contains(err.Error(), "mount") {
				t.Errorf("Read = %+v, %v; want an error saying the cgroup is not mounted", got, err)
			}
		})
	}
}

func TestReadNoMemoryCgroup(t *testing.T) {
	self := fakeSelf(t, "1:cpu:/\n", "32 31 0:29 / ROOT/cpu rw - cgroup cgroup rw,cpu\n", nil)
	got, err := Read(self)
	if err != nil || got.Bytes != 0 {
		t.Errorf("Read = %+v, %v; want no limit", got, err)
	}
}

func TestReadErrors(t *testing.T) {
	for name, files := range map[string]map[string]string{
		"no memory.stat":    nil,
		"no limit in stat":  {"fs/memory/pods/pod1/memory.stat": "rss 1\n"},
		"unreadable number": {"fs/memory/pods/pod1/memory.stat": "hierarchical_memory_limit lots\n"},
	} {
		t.Run(name, func(t *testing.T) {
			if got, err := Read(fakeSelf(t, v1Cgroup, v1Mountinfo, files)); err == nil {
				t.Errorf("Read = %+v, want an error", got)
			}
		})
	}
	if _, err := Read(t.TempDir()); err == nil {
		t.Error("Read of a directory without cgroup and mountinfo: no error")
	}
}

// A mount point with a space is escaped in mountinfo; a mount of a subtree maps the cgroup
// path below its root.
func TestCgroupDirEscapesAndSubtrees(t *testing.T) {
	for _, tc := range []struct {
		cgroup, mountinfo, want string
	}{
		{"4:memory:/a/b\n", `35 31 0:32 / /sys/fs/cg\040mem rw - cgroup cgroup rw,memory` + "\n", "/sys/fs/cg mem/a/b"},
		{"4:memory:/a/b\n", "35 31 0:32 /a /mnt/mem rw - cgroup cgroup rw,memory\n", "/mnt/mem/b"},
		{"4:memory:/ab\n", "35 31 0:32 /a /mnt/mem rw - cgroup cgroup rw,memory\n", "/mnt/mem"},
		{"4:memory:/../..\n", "35 31 0:32 / /mnt/mem rw - cgroup cgroup rw,memory\n", "/mnt/mem"},
		{"4:cpu,memory:/x\n", "35 31 0:32 / /c rw shared:5 master:1 - cgroup cgroup rw,cpu,memory\n", "/c/x"},
	} {
		dir, v2, err := cgroupDir([]byte(tc.cgroup), []byte(tc.mountinfo))
		if err != nil || v2 || dir != tc.want {
			t.Errorf("cgroupDir(%q, %q) = %q, %v, %v; want %q, v1", tc.cgroup, tc.mountinfo, dir, v2, err, tc.want)
		}
	}
}

// The process's own limit reads without error on whatever machine the test runs.
func TestReadSelf(t *testing.T) {
	got, err := Read("/proc/self")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("this process's memory limit: %d bytes (%s)", got.Bytes, got.Source)
}

// FuzzCgroupDir feeds arbitrary /proc/self/cgroup and mountinfo text: the result is a
// directory under a mount point the text names, or nothing, never a panic.
func FuzzCgroupDir(f *testing.F) {
	f.Add([]byte(v1Cgroup), []byte(v1Mountinfo))
	f.Add([]byte("0::/kubepods/pod\n"), []byte("29 22 0:26 / /cg rw - cgroup2 cgroup2 rw\n"))
	f.Add([]byte("4:memory:/a/b\n"), []byte(`35 31 0:32 /a /sys/fs/cg\040mem rw - cgroup cgroup rw,memory`+"\n"))
	f.Fuzz(func(t *testing.T, cgroup, mountinfo []byte) {
		dir, _, err := cgroupDir(cgroup, mountinfo)
		if err != nil || dir == "" {
			return
		}
		for line := range strings.SplitSeq(string(mountinfo), "\n") {
			if m, parsed := parseMount(line); parsed && (dir == m.point || strings.HasPrefix(dir, strings.TrimSuffix(m.point, "/")+"/")) {
				return
			}
		}
		t.Errorf("cgroupDir = %q, under no mount point of %q", dir, mountinfo)
	})
}

// FuzzParseLimit: any text is a limit of 0 or more, or an error.
func FuzzParseLimit(f *testing.F) {
	for _, s := range []string{"max", "402653184\n", "9223372036854771712", "-1", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := parseLimit(s)
		if err == nil && n < 0 {
			t.Errorf("parseLimit(%q) = %d", s, n)
		}
		if err != nil && n != 0 {
			t.Errorf("parseLimit(%q) = %d, %v", s, n, err)
		}
	})
}
