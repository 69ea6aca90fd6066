package cluster

import (
	"errors"
	"time"
)

// Configured reports whether a way to reach the API is configured (a kubeconfig, the
// in-cluster service account, or $KUBECONFIG): false while no such configuration was found.
func (c *Cluster) Configured() bool { return !errors.Is(c.LastError(), errNoAPI) }

// NodeName is this node's name as the view uses it (--node-name, $NODE_NAME, else the host
// name).
func (c *Cluster) NodeName() string { return c.cfg.NodeName }

// ProbeCycle is how long the view may take to prove itself current, or fail to: until its next
// probe (--api.probe-interval) and that probe's timeout.
func (c *Cluster) ProbeCycle() time.Duration { return c.cfg.ProbeInterval + c.cfg.ProbeTimeout }
