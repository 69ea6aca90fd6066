//go:build linux

package cgroupmeter

import (
	"sync"
	"time"
)

// ChildPoll reads groups' process lists every 100 ms and remembers the pids other than each
// group's root: the children alive at some poll. It is the fallback when process
// events are not available, and a cross-check when they are.
type ChildPoll struct {
	mu    sync.Mutex
	roots map[string]int
	seen  map[string]map[int]bool
}

// Start polls groups, by name, until stop is called.
func (c *ChildPoll) Start(groups map[string]*Group) (stop func()) {
	c.mu.Lock()
	c.roots, c.seen = map[string]int{}, map[string]map[int]bool{}
	for g := range groups {
		c.seen[g] = map[int]bool{}
	}
	c.mu.Unlock()
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			for name, g := range groups {
				pids := g.Procs()
				c.mu.Lock()
				root, ok := c.roots[name]
				for _, pid := range pids {
					if ok && pid != root {
						c.seen[name][pid] = true
					}
				}
				c.mu.Unlock()
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() { close(done); <-stopped })
	}
}

// SetRoot names group's root process, which is not counted.
func (c *ChildPoll) SetRoot(group string, pid int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.roots[group] = pid
}

// Take returns how many children of group were seen since the last Take.
func (c *ChildPoll) Take(group string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := len(c.seen[group])
	c.seen[group] = map[int]bool{}
	return n
}
