// Package benchns holds what the benchmarks share about the machine they run on: one lock so
// that two benchmarks never run at once (each removes leftover namespaces), the network
// namespaces they create and always remove, and the CPU they report.
package benchns

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// BenchLock is the lock the speed benchmarks share; SoakLock keeps two soaks apart (a soak
// measures no speed, so it may run beside a benchmark).
const (
	BenchLock = "/run/ph-bench.lock"
	SoakLock  = "/run/ph-soak.lock"
)

// Lock takes the machine-wide benchmark lock, or fails at once when another benchmark holds it.
func Lock() (unlock func(), err error) { return LockFile(BenchLock) }

// LockFile takes the exclusive lock on path, or fails at once when another process holds it.
func LockFile(path string) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("another run holds %s: %w", path, err)
	}
	return func() { f.Close() }, nil
}

// LockWithin takes the benchmark lock, trying again every 5 s for up to wait (0: once).
// waiting is told, once, why it waits.
func LockWithin(ctx context.Context, wait time.Duration, waiting func(error)) (unlock func(), err error) {
	deadline := time.Now().Add(wait)
	for told := false; ; told = true {
		unlock, err := Lock()
		if err == nil || !time.Now().Before(deadline) {
			return unlock, err
		}
		if !told {
			waiting(err)
		}
		if err := Sleep(ctx, 5*time.Second); err != nil {
			return nil, err
		}
	}
}

// Sleep waits for d, or until ctx ends.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// RemoveLeftovers deletes the namespaces named with prefix that a killed earlier run left.
func RemoveLeftovers(prefix string) error {
	for _, ns := range List(prefix) {
		fmt.Fprintf(os.Stderr, "removing leftover namespace %s\n", ns)
		if err := Delete(prefix, ns); err != nil {
			return err
		}
	}
	return nil
}

// NewName is a fresh namespace name: prefix and a random suffix.
func NewName(prefix string) string {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// List returns the names of the network namespaces whose names start with prefix.
func List(prefix string) []string {
	ents, err := os.ReadDir("/run/netns")
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), prefix) {
			out = append(out, e.Name())
		}
	}
	return out
}

// Delete ends whatever still runs in namespace name (only ever a benchmark's own children, or
// those of an earlier run that died) and removes it. It refuses names without prefix, so that
// a benchmark can only remove its own namespaces.
func Delete(prefix, name string) error {
	if !strings.HasPrefix(name, prefix) {
		return fmt.Errorf("refusing to delete namespace %q", name)
	}
	for range 5 {
		out, err := exec.Command("ip", "netns", "pids", name).Output()
		if err != nil {
			break
		}
		pids := strings.Fields(string(out))
		if len(pids) == 0 {
			break
		}
		for _, p := range pids {
			if pid, err := strconv.Atoi(p); err == nil && pid > 1 && pid != os.Getpid() {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		time.Sleep(300 * time.Millisecond)
	}
	if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
		return fmt.Errorf("ip netns del %s: %w: %s", name, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// CPUModel is the machine's CPU model name from /proc/cpuinfo.
func CPUModel() string {
	for _, line := range strings.Split(cpuinfo(), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown CPU"
}

// NumCPU counts the processors in /proc/cpuinfo (all of them, whatever this process may use).
func NumCPU() int {
	n := 0
	for _, line := range strings.Split(cpuinfo(), "\n") {
		if strings.HasPrefix(line, "processor") {
			n++
		}
	}
	return n
}

func cpuinfo() string {
	b, _ := os.ReadFile("/proc/cpuinfo")
	return string(b)
}

// Load1 is the machine's one-minute load average, 0 when it cannot be read: reports print it
// beside timings, which other work on the machine slows.
func Load1() float64 {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}
