package sysctl

import (
	"os"
	"path/filepath"
	"testing"
)

func TestParseInt(t *testing.T) {
	for in, want := range map[string]int64{"1\n": 1, "0": 0, " 2 \n": 2, "-1\n": -1} {
		if got, err := parseInt([]byte(in)); err != nil || got != want {
			t.Errorf("%q: %d %v", in, got, err)
		}
	}
	for _, in := range []string{"", "x", "1 2", "1.5"} {
		if _, err := parseInt([]byte(in)); err == nil {
			t.Errorf("%q: want error", in)
		}
	}
}

func TestReadInt(t *testing.T) {
	dir := t.TempDir()
	ok, bad := filepath.Join(dir, "ok"), filepath.Join(dir, "bad")
	if err := os.WriteFile(ok, []byte("2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, []byte("yes\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if v, exists, err := ReadInt(ok); v != 2 || !exists || err != nil {
		t.Errorf("ReadInt(ok) = %d, %v, %v; want 2, true, nil", v, exists, err)
	}
	if _, exists, err := ReadInt(filepath.Join(dir, "absent")); exists || err != nil {
		t.Errorf("ReadInt(absent) = %v, %v; want false, nil", exists, err)
	}
	if _, exists, err := ReadInt(bad); !exists || err == nil || err.Error() != bad+`: not an integer: "yes"` {
		t.Errorf("ReadInt(bad) = %v, %v; want true and an error naming the file", exists, err)
	}
}
