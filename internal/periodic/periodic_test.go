package periodic

import (
	"context"
	"testing"
	"time"
)

// Every calls at once, goes on calling, and returns once ctx is done.
func TestEvery(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	calls := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		Every(ctx, time.Millisecond, func() {
			if calls++; calls >= 3 {
				cancel()
			}
		})
	}()
	<-done // Every returned once ctx was done
	// A tick ready together with ctx.Done may be taken first: one more call at the most.
	if calls < 3 || calls > 4 {
		t.Errorf("%d calls, want 3 (or 4): the one at once, then one a tick until cancelled", calls)
	}
}

// A context already done still gets the call at once, and no more.
func TestEveryCallsAtOnce(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	calls := 0
	Every(ctx, time.Hour, func() { calls++ })
	if calls != 1 {
		t.Errorf("%d calls, want 1", calls)
	}
}
