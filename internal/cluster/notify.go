package cluster

// Subscribe returns a new channel that receives a value after the view changed, so that a
// consumer can recompute on change instead of on a timer: after each new generation is
// published (Ports or Synced changed), after a watch fails, when the probe's verdict flips
// (the API server stops or starts answering), and when Fresh has changed with time alone
// (checked at each probe, so seen within ProbeInterval). Each consumer subscribes once and
// has its own channel (notify.Changes): the view never blocks on it, and changes that come
// while a value is still pending merge into it. A consumer should therefore re-read Snapshot
// (and LastError) after each receive, never count receives.
func (c *Cluster) Subscribe() <-chan struct{} { return c.changes.Subscribe() }
