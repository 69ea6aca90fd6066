package kubeauth

import (
	"context"
	"errors"
	"fmt"

	"golang.org/x/time/rate"
)

// errThrottled is a review the exporter did not send: too many new credentials were waiting
// for one already. It is the exporter's own limit, not the API server's answer.
var errThrottled = errors.New("throttled")

// reviewQueue bounds what reviews of new credentials (a token, or a user and path, never
// reviewed before) cost the API server and the callers: at most reviewing at once, at most
// waiting behind them (past that a review is refused at once), and a rate. Reviews of known
// credentials, whose cached answer has expired, do not queue: they take from the rate without
// waiting, so that a flood of invented tokens delays only other new ones.
type reviewQueue struct {
	// admitted holds a place for every review waiting or running; reviewing, for each running.
	admitted, reviewing chan struct{}
	limiter             *rate.Limiter
}

func newReviewQueue(reviewing, waiting int, qps float64, burst int) *reviewQueue {
	return &reviewQueue{
		admitted:  make(chan struct{}, reviewing+waiting),
		reviewing: make(chan struct{}, reviewing),
		limiter:   rate.NewLimiter(rate.Limit(qps), burst),
	}
}

// known runs review at once, on the rate's account.
func (q *reviewQueue) known(review func() error) error {
	// The reservation is taken even when the rate is used up: new credentials then wait
	// longer, the known one does not.
	q.limiter.Reserve()
	return review()
}

// unknown runs review once it has a place, or returns errThrottled: at once when every
// place is taken, or when ctx ends before its turn.
func (q *reviewQueue) unknown(ctx context.Context, review func() error) error {
	select {
	case q.admitted <- struct{}{}:
	default:
		return fmt.Errorf("%w: %d new credentials are waiting for review or being reviewed", errThrottled, cap(q.admitted))
	}
	defer func() { <-q.admitted }()
	select {
	case q.reviewing <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("%w: no turn to review within the review timeout: %w", errThrottled, ctx.Err())
	}
	defer func() { <-q.reviewing }()
	if err := q.limiter.Wait(ctx); err != nil {
		return fmt.Errorf("%w: over the review rate (%v a second) for the review timeout: %w", errThrottled, q.limiter.Limit(), err)
	}
	return review()
}

// waiting is how many reviews of new credentials wait or run.
func (q *reviewQueue) waiting() int { return len(q.admitted) }
