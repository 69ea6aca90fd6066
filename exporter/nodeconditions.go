package exporter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/alecthomas/kingpin/v2"

	"github.com/proxyhealth/proxyhealth/internal/nodecondition"
)

// nodeConditionsConfig is the opt-in publication of the verdict on the Node object.
type nodeConditionsConfig struct {
	Enabled       bool
	Heartbeat     time.Duration
	EventInterval time.Duration
}

// How often the verdict is judged for the Node condition, and how long one round's API calls
// may take. Patches are far rarer: on change, and at the heartbeat.
const (
	nodeConditionsCheckInterval = 10 * time.Second
	nodeConditionsTimeout       = 10 * time.Second
)

func addNodeConditionsFlags(app *kingpin.Application) *nodeConditionsConfig {
	c := &nodeConditionsConfig{}
	app.Flag("node-conditions", "Publish the verdict on this node's Node object: condition ProxyHealthy (False with the cause of a critical finding as its reason; Unknown, reason NotChecked, when a cause could not be checked and nothing critical was found; True otherwise) and Events on the Node, and on the Service for stale rules. Needs RBAC to patch nodes/status and create events (deploy/components/node-conditions, or the chart's nodeConditions.enabled).").
		BoolVar(&c.Enabled)
	app.Flag("node-conditions.heartbeat-interval", "With --node-conditions: the condition is patched at least this often, and no more often while only its message's wording changes (a change of status, reason or critical findings is patched at once).").
		Default("5m").DurationVar(&c.Heartbeat)
	app.Flag("node-conditions.event-interval", "With --node-conditions: least time between two Events of one reason on one object (a finding that comes and goes is told once per interval).").
		Default("10m").DurationVar(&c.EventInterval)
	return c
}

func (c *nodeConditionsConfig) validate() error {
	switch {
	case c.Heartbeat <= 0:
		return errors.New("--node-conditions.heartbeat-interval must be positive")
	case c.EventInterval < 0:
		return errors.New("--node-conditions.event-interval must not be negative")
	}
	return nil
}

// startNodeConditions starts publishing judge's verdict on the Node and returns the publisher
// (its metrics), or nil when it cannot run: that is logged, and the exporter serves the rest.
func startNodeConditions(ctx context.Context, c *nodeConditionsConfig, api *apiView, judge *status, logger *slog.Logger) *nodecondition.Publisher {
	pub, err := newNodeConditions(c, api, judge.src.node, logger)
	if err != nil {
		logger.Error("node conditions and events are off; everything else keeps serving", "err", err)
		return nil
	}
	go pub.Run(ctx, nodeConditionsCheckInterval, nodeConditionsTimeout, judge.Report)
	logger.Info("publishing the verdict as node condition "+string(nodecondition.ConditionType), "heartbeat_interval", c.Heartbeat, "event_interval", c.EventInterval)
	return pub
}

func newNodeConditions(c *nodeConditionsConfig, api *apiView, node string, logger *slog.Logger) (*nodecondition.Publisher, error) {
	node, err := writerNodeName(node, api)
	if err != nil {
		return nil, err
	}
	restCfg, err := api.cfg.RESTConfig()
	if err != nil {
		return nil, err
	}
	client, err := nodecondition.NewAPI(restCfg)
	if err != nil {
		return nil, err
	}
	return nodecondition.New(client, nodecondition.Config{
		NodeName:          node,
		HeartbeatInterval: c.Heartbeat,
		EventInterval:     c.EventInterval,
	}, logger.With("component", "node-conditions"))
}

// writerNodeName is the node whose verdict the API writers (the Node condition, the node
// report) publish: the verdict's own node, else --node-name, else the host's name.
func writerNodeName(node string, api *apiView) (string, error) {
	if node == "" {
		node = api.cfg.NodeName
	}
	if node == "" {
		host, err := os.Hostname()
		if err != nil {
			return "", fmt.Errorf("no --node-name or $NODE_NAME, and reading the host name: %w", err)
		}
		node = host
	}
	return node, nil
}
