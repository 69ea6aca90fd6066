// Package notify tells any number of consumers that something changed, so that each can
// re-read it instead of polling.
package notify

import "sync"

// Changes is a source of change notifications; its zero value is ready to use. Each
// subscriber has its own channel with a buffer of one: Notify never blocks, and changes that
// come while a subscriber's signal is still pending merge into it. A subscriber therefore
// re-reads what changed after each receive, and never counts receives.
type Changes struct {
	mu   sync.Mutex
	subs []chan struct{}
}

// Subscribe returns a new channel that receives a value after each later Notify (merged as
// above). It is never closed.
func (c *Changes) Subscribe() <-chan struct{} {
	ch := make(chan struct{}, 1)
	c.mu.Lock()
	c.subs = append(c.subs, ch)
	c.mu.Unlock()
	return ch
}

// Notify signals every subscriber without blocking.
func (c *Changes) Notify() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, ch := range c.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}
