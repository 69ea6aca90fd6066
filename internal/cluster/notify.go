package cluster

// Changed returns a channel that receives a value after the view changed, so that a consumer
// can recompute on change instead of on a timer: after each new generation is published
// (Ports or Synced changed), after a watch fails, when the probe's verdict flips (the API
// server stops or starts answering), and when Fresh has changed with time alone (checked at
// each probe, so seen within ProbeInterval). The channel has a buffer of one and is never
// closed; the view never blocks on it: changes that come while a value is still pending merge
// into it. A consumer should therefore re-read Snapshot (and LastError) after each receive,
// never count receives. There is one channel per Cluster, meant for one consumer: two readers
// would each see only some of the notifications.
func (c *Cluster) Changed() <-chan struct{} { return c.changed }

// notify signals Changed without blocking.
func (c *Cluster) notify() {
	select {
	case c.changed <- struct{}{}:
	default:
	}
}
