package memlimit

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
)

// MemTotal reads the node's memory (MemTotal, in bytes) from meminfo, normally /proc/meminfo:
// a cgroup limit larger than it limits nothing.
func MemTotal(meminfo string) (int64, error) {
	b, err := os.ReadFile(meminfo)
	if err != nil {
		return 0, fmt.Errorf("the node's memory: %w", err)
	}
	n, err := parseMemTotal(b)
	if err != nil {
		return 0, fmt.Errorf("the node's memory: %s: %w", meminfo, err)
	}
	return n, nil
}

// parseMemTotal reads the "MemTotal:  16329772 kB" line of a meminfo file (proc(5)).
func parseMemTotal(meminfo []byte) (int64, error) {
	sc := bufio.NewScanner(bytes.NewReader(meminfo))
	for sc.Scan() {
		value, ok := strings.CutPrefix(sc.Text(), "MemTotal:")
		if !ok {
			continue
		}
		fields := strings.Fields(value)
		if len(fields) != 2 || fields[1] != "kB" {
			return 0, fmt.Errorf("MemTotal %q: want a number of kB", strings.TrimSpace(value))
		}
		kb, err := strconv.ParseUint(fields[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("MemTotal %q: %w", fields[0], err)
		}
		if kb == 0 || kb > math.MaxInt64>>10 {
			return 0, fmt.Errorf("MemTotal %d kB is out of range", kb)
		}
		return int64(kb) << 10, nil
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, errors.New("no MemTotal line")
}
