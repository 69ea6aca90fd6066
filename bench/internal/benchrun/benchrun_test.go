package benchrun

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestFinish(t *testing.T) {
	interrupted, cancel := context.WithCancel(context.Background())
	cancel()
	failed := errors.New("step failed")
	for _, tc := range []struct {
		name   string
		ctx    context.Context
		report string
		err    error
		want   int
	}{
		{"ok", context.Background(), "# report\n", nil, 0},
		{"failed with a partial report", context.Background(), "# partial\n", failed, 1},
		{"failed without a report", context.Background(), "", failed, 1},
		{"interrupted", interrupted, "# partial\n", failed, 130},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "report.md")
			if got := Finish(tc.ctx, "bench", tc.report, out, tc.err); got != tc.want {
				t.Errorf("exit code %d, want %d", got, tc.want)
			}
			b, err := os.ReadFile(out)
			switch {
			case tc.report == "" && !errors.Is(err, os.ErrNotExist):
				t.Errorf("report file written without a report: %v", err)
			case tc.report != "" && string(b) != tc.report:
				t.Errorf("report file holds %q, want %q (%v)", b, tc.report, err)
			}
		})
	}
}

func TestFinishUnwritableOut(t *testing.T) {
	out := filepath.Join(t.TempDir(), "missing", "report.md")
	if got := Finish(context.Background(), "bench", "# report\n", out, nil); got != 1 {
		t.Errorf("exit code %d, want 1 when the report cannot be saved", got)
	}
}
