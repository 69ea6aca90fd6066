package collectors

import (
	"errors"
	"testing"
	"time"
)

func TestFlagChecks(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string // "" for a good value
	}{
		{Positive("a", time.Second), ""},
		{Positive("a", time.Duration(0)), "--a must be positive"},
		{Positive("a", -1), "--a must be positive"},
		{NotNegative("b", 0), ""},
		{NotNegative("b", -time.Second), "--b must not be negative"},
		{AtLeast("c", 256, 256), ""},
		{AtLeast("c", 255, 256), "--c must be at least 256"},
		{NotEmpty("d", "/proc"), ""},
		{NotEmpty("d", ""), "--d must not be empty"},
	} {
		if got := errString(tc.err); got != tc.want {
			t.Errorf("got %q, want %q", got, tc.want)
		}
	}
	// A validate joins them: each bad value on its own line, the good ones silent.
	joined := errors.Join(Positive("a", 0), NotNegative("b", 1), NotEmpty("d", ""))
	if got, want := errString(joined), "--a must be positive\n--d must not be empty"; got != want {
		t.Errorf("joined: %q, want %q", got, want)
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
