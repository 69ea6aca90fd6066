package main

import (
	"strings"
	"testing"
)

// TestCheck type-checks a module that uses a Linux-only system call in a file without a build
// constraint: it passes for linux/arm64 and fails for darwin/arm64 with the compiler's reason.
func TestCheck(t *testing.T) {
	n, err := check("testdata/linuxonly", "linux", "arm64", []string{"."})
	if err != nil {
		t.Fatalf("linux/arm64: %v", err)
	}
	if n < 2 { // the package and at least syscall
		t.Errorf("linux/arm64: checked %d packages, want the package and its imports", n)
	}
	_, err = check("testdata/linuxonly", "darwin", "arm64", []string{"."})
	if err == nil {
		t.Fatal("darwin/arm64: no error for syscall.Gettid, which darwin has not")
	}
	if !strings.Contains(err.Error(), "Gettid") {
		t.Errorf("darwin/arm64: error %q does not name Gettid", err)
	}
}
