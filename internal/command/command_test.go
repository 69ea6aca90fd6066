package command

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestRun(t *testing.T) {
	out, err := Run(context.Background(), "sh", "-c", "echo hello")
	if err != nil || string(out) != "hello\n" {
		t.Fatalf("Run(echo) = %q, %v", out, err)
	}
	_, err = Run(context.Background(), "sh", "-c", "echo 'Permission denied (you must be root)' >&2; exit 4")
	if err == nil || !strings.Contains(err.Error(), "Permission denied (you must be root)") || !strings.Contains(err.Error(), "exit status 4") {
		t.Errorf("failed command: %v, want its stderr and exit status", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err = Run(ctx, "sleep", "5")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("timed-out command: %v, want context.DeadlineExceeded", err)
	}
	if _, err := Run(context.Background(), "/nonexistent/binary"); err == nil {
		t.Error("missing binary: no error")
	}
}
