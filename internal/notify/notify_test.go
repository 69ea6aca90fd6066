package notify

import (
	"testing"
	"time"
)

func pending(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// Every subscriber is told, each on its own channel.
func TestEverySubscriberIsTold(t *testing.T) {
	var c Changes
	a, b := c.Subscribe(), c.Subscribe()
	if pending(a) || pending(b) {
		t.Fatal("a signal before any Notify")
	}
	c.Notify()
	if !pending(a) || !pending(b) {
		t.Fatal("a subscriber was not told of the change")
	}
	// One subscriber's receive does not take the other's signal.
	c.Notify()
	if !pending(a) {
		t.Fatal("the first subscriber missed the second change")
	}
	if !pending(b) {
		t.Fatal("the second subscriber missed the second change")
	}
}

// Changes while a signal is pending merge into it: one receive, then nothing.
func TestChangesCoalesce(t *testing.T) {
	var c Changes
	ch := c.Subscribe()
	for range 5 {
		c.Notify()
	}
	if !pending(ch) {
		t.Fatal("no signal after five changes")
	}
	if pending(ch) {
		t.Fatal("a second signal: changes did not merge")
	}
}

// Notify returns at once whether or not anyone reads, and with no subscriber at all.
func TestNotifyNeverBlocks(t *testing.T) {
	var c Changes
	c.Notify()
	_ = c.Subscribe() // never read
	done := make(chan struct{})
	go func() {
		for range 1000 {
			c.Notify()
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Notify blocked on a subscriber that does not read")
	}
}
