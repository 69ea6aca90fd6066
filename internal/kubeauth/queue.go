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

// reviewQueue bounds what reviews cost the API server and the callers. Reviews of new
// credentials (a token never accepted, a user and path never allowed) queue: at most
// reviewing at once, at most waiting behind them (past that a review is refused at once).
// Reviews of known credentials, whose cached answer has expired, go ahead of that queue, at
// most reviewing of them at once; past that they queue as new ones. Every review waits for
// its turn at one rate, so the API server gets no more than it in all, and nobody's turn is
// far off: at most 2*reviewing reviews wait for their turn at once. So a flood of invented
// tokens delays only other new ones, and a flood of known reviews cannot lock new
// credentials out.
type reviewQueue struct {
	// admitted holds a place for every review of a new credential waiting or running;
	// reviewing, for each running; knownReviewing, for each review of a known one running.
	admitted, reviewing, knownReviewing chan struct{}
	limiter                             *rate.Limiter
}

func newReviewQueue(reviewing, waiting int, qps float64, burst int) *reviewQueue {
	return &reviewQueue{
		admitted:       make(chan struct{}, reviewing+waiting),
		reviewing:      make(chan struct{}, reviewing),
		knownReviewing: make(chan struct{}, reviewing),
		limiter:        rate.NewLimiter(rate.Limit(qps), burst),
	}
}

// known runs review ahead of the queue once the rate gives it a turn, or, when as many known
// reviews run already, queues it as unknown does.
func (q *reviewQueue) known(ctx context.Context, review func() error) error {
	select {
	case q.knownReviewing <- struct{}{}:
	default:
		return q.unknown(ctx, review)
	}
	defer func() { <-q.knownReviewing }()
	return q.reviewAtRate(ctx, review)
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
	return q.reviewAtRate(ctx, review)
}

// reviewAtRate runs review once the rate gives it a turn, or returns errThrottled: at once
// when that turn would come after ctx's deadline.
func (q *reviewQueue) reviewAtRate(ctx context.Context, review func() error) error {
	if err := q.limiter.Wait(ctx); err != nil {
		return fmt.Errorf("%w: over the review rate (%v a second) for the review timeout: %w", errThrottled, q.limiter.Limit(), err)
	}
	return review()
}

// waiting is how many reviews of new credentials wait or run.
func (q *reviewQueue) waiting() int { return len(q.admitted) }
