// Package periodic runs background work on an interval: the collectors' polls and checks, and
// the exporter's and the node condition publisher's own.
package periodic

import (
	"context"
	"time"
)

// Every calls fn at once and then every interval until ctx is done. A call that outlasts the
// interval delays the next rather than queueing more: background work never piles up.
func Every(ctx context.Context, interval time.Duration, fn func()) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		fn()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
