package exporter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/alecthomas/kingpin/v2"

	"github.com/proxyhealth/proxyhealth/internal/reportwriter"
)

// nodeReportConfig is the opt-in report of the verdict in a ConfigMap, which `kubectl
// proxyhealth` reads.
type nodeReportConfig struct {
	Enabled     bool
	Namespace   string
	MinInterval time.Duration
	Heartbeat   time.Duration
}

// How often the verdict is looked at for the report, and how long one round's API calls may
// take. Writes are far rarer: on change, at most one per --node-report.min-interval, and at
// the heartbeat.
const (
	nodeReportCheckInterval = 10 * time.Second
	nodeReportTimeout       = 10 * time.Second
	// inClusterNamespace is where a pod finds its own namespace.
	inClusterNamespace = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
)

func addNodeReportFlags(app *kingpin.Application) *nodeReportConfig {
	c := &nodeReportConfig{}
	app.Flag("node-report", "Keep this node's verdict, as /status gives it (bounded in size), in a ConfigMap proxyhealth-node-<node> in --node-report.namespace, owned by the Node: what `kubectl proxyhealth` reads. Needs RBAC to create and update ConfigMaps in that namespace (deploy/components/node-report, or the chart's nodeReport.enabled).").
		BoolVar(&c.Enabled)
	app.Flag("node-report.namespace", "With --node-report: the namespace of the report (default: the pod's own).").
		StringVar(&c.Namespace)
	app.Flag("node-report.min-interval", "With --node-report: least time between two writes of the report, however often the verdict changes.").
		Default("30s").DurationVar(&c.MinInterval)
	app.Flag("node-report.heartbeat-interval", "With --node-report: the report is rewritten at least this often (counts and times brought up to date; an older report tells the plugin its exporter stopped), and no more often while the verdict, its findings' causes and Service ports and what was not checked stay the same.").
		Default("5m").DurationVar(&c.Heartbeat)
	return c
}

func (c *nodeReportConfig) validate() error {
	switch {
	case c.MinInterval <= 0:
		return errors.New("--node-report.min-interval must be positive")
	case c.Heartbeat < c.MinInterval:
		return errors.New("--node-report.heartbeat-interval must not be shorter than --node-report.min-interval")
	}
	return nil
}

// startNodeReport starts writing judge's verdict to the node's report and returns the writer
// (its metrics), or nil when it cannot run: that is logged, and the exporter serves the rest.
func startNodeReport(ctx context.Context, c *nodeReportConfig, api *apiView, judge *status, logger *slog.Logger) *reportwriter.Writer {
	w, err := newNodeReport(c, api, judge.src.node, logger)
	if err != nil {
		logger.Error("the node report is off; everything else keeps serving", "err", err)
		return nil
	}
	go w.Run(ctx, nodeReportCheckInterval, nodeReportTimeout, judge.Report)
	logger.Info("writing the verdict to the node's report", "min_interval", c.MinInterval, "heartbeat_interval", c.Heartbeat)
	return w
}

func newNodeReport(c *nodeReportConfig, api *apiView, node string, logger *slog.Logger) (*reportwriter.Writer, error) {
	node, err := writerNodeName(node, api)
	if err != nil {
		return nil, err
	}
	namespace := c.Namespace
	if namespace == "" {
		b, err := os.ReadFile(inClusterNamespace)
		if err != nil {
			return nil, fmt.Errorf("no --node-report.namespace, and not in a pod: %w", err)
		}
		namespace = strings.TrimSpace(string(b))
	}
	restCfg, err := api.cfg.RESTConfig()
	if err != nil {
		return nil, err
	}
	client, err := reportwriter.NewAPI(restCfg)
	if err != nil {
		return nil, err
	}
	return reportwriter.New(client, reportwriter.Config{
		NodeName:    node,
		Namespace:   namespace,
		MinInterval: c.MinInterval,
		Heartbeat:   c.Heartbeat,
	}, logger.With("component", "node-report"))
}
