package memlimit

import (
	"path/filepath"
	"testing"
)

func TestMemTotal(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "meminfo"), "MemTotal:       24605316 kB\nMemFree:         1203884 kB\n")
	got, err := MemTotal(filepath.Join(dir, "meminfo"))
	if err != nil || got != 24605316<<10 {
		t.Errorf("MemTotal = %d, %v; want %d", got, err, int64(24605316)<<10)
	}
	if _, err := MemTotal(filepath.Join(dir, "missing")); err == nil {
		t.Error("MemTotal of a missing file: no error")
	}
}

func TestParseMemTotalRefuses(t *testing.T) {
	for _, in := range []string{
		"",
		"MemFree: 1 kB\n",
		"MemTotal: 1024\n",
		"MemTotal: 1024 MB\n",
		"MemTotal: -1 kB\n",
		"MemTotal: 0 kB\n",
		"MemTotal: 18446744073709551615 kB\n",
	} {
		if n, err := parseMemTotal([]byte(in)); err == nil {
			t.Errorf("parseMemTotal(%q) = %d, want an error", in, n)
		}
	}
}

// Whatever meminfo holds, MemTotal is a positive number of bytes or an error.
func FuzzParseMemTotal(f *testing.F) {
	f.Add([]byte("MemTotal:       24605316 kB\nMemFree:         1203884 kB\n"))
	f.Add([]byte("MemTotal: 9007199254740991 kB\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		n, err := parseMemTotal(in)
		if err == nil && (n <= 0 || n%1024 != 0) {
			t.Errorf("parseMemTotal(%q) = %d", in, n)
		}
	})
}
