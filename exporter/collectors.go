package exporter

import (
	"log/slog"

	"github.com/alecthomas/kingpin/v2"

	phcollectors "github.com/proxyhealth/proxyhealth/collectors"
	"github.com/proxyhealth/proxyhealth/collectors/conntrack"
	"github.com/proxyhealth/proxyhealth/collectors/kubeproxy"
	"github.com/proxyhealth/proxyhealth/collectors/node"
	"github.com/proxyhealth/proxyhealth/collectors/rules"
	"github.com/proxyhealth/proxyhealth/internal/cluster"
)

// Paths are the host filesystems the collectors read; in a container they are the host's
// /proc and /sys mounted elsewhere, in tests a fixture tree.
type Paths struct {
	ProcFS string
	SysFS  string
}

func addPathFlags(app *kingpin.Application) *Paths {
	p := &Paths{}
	app.Flag("path.procfs", "procfs mountpoint.").Default("/proc").StringVar(&p.ProcFS)
	app.Flag("path.sysfs", "sysfs mountpoint.").Default("/sys").StringVar(&p.SysFS)
	return p
}

// registration is one collector the exporter knows: its --[no-]collector.<name> switch and how
// to build it once the flags are parsed.
type registration struct {
	name    string
	enabled *bool
	build   func(*slog.Logger) (phcollectors.Collector, error)
}

func register(app *kingpin.Application, name, help string, build func(*slog.Logger) (phcollectors.Collector, error)) registration {
	enabled := app.Flag("collector."+name, "Enable the "+name+" collector: "+help).Default("true").Bool()
	return registration{name: name, enabled: enabled, build: build}
}

// apiView is the exporter's one view of the Kubernetes API, shared by the collectors that need
// it and built only if one of them is enabled.
type apiView struct {
	cfg    cluster.Config
	logger *slog.Logger // the exporter's, set before any collector is built
	view   *cluster.Cluster
}

func (a *apiView) get() (*cluster.Cluster, error) {
	if a.view == nil {
		v, err := cluster.New(a.cfg, a.logger.With("component", "api"))
		if err != nil {
			return nil, err
		}
		a.view = v
	}
	return a.view, nil
}

// registrations lists every collector, each adding its own flags to app. paths is filled in by
// the time build runs; the returned apiView holds the API view once a collector asked for it.
func registrations(app *kingpin.Application, paths *Paths) ([]registration, *apiView) {
	api := &apiView{}
	api.cfg.AddFlags(app)
	var conntrackCfg conntrack.Config
	conntrackCfg.AddFlags(app)
	var nodeCfg node.Config
	nodeCfg.AddFlags(app)
	var rulesCfg rules.Config
	rulesCfg.AddFlags(app)
	var kubeproxyCfg kubeproxy.Config
	kubeproxyCfg.AddFlags(app)
	return []registration{
		register(app, "conntrack", "table fill, per-CPU stats, the event stream and unreplied Service flows (needs CAP_NET_ADMIN).",
			func(l *slog.Logger) (phcollectors.Collector, error) {
				view, err := api.get()
				if err != nil {
					return nil, err
				}
				conntrackCfg.ProcPath, conntrackCfg.API = paths.ProcFS, view
				return conntrack.New(conntrackCfg, l)
			}),
		register(app, node.Name, "bridge netfilter and conntrack sysctls, and whether a conntrack INVALID drop rule is on the forward path (the rules check runs iptables-legacy-save, iptables-nft-save and nft: needs CAP_NET_ADMIN, and CAP_NET_RAW for legacy).",
			func(l *slog.Logger) (phcollectors.Collector, error) {
				nodeCfg.ProcPath = paths.ProcFS
				return node.New(nodeCfg, l)
			}),
		register(app, "rules", "kube-proxy's programmed endpoints against the API, per Service port (needs the API: --kubeconfig or in-cluster; CAP_NET_ADMIN for iptables-save).",
			func(l *slog.Logger) (phcollectors.Collector, error) {
				view, err := api.get()
				if err != nil {
					return nil, err
				}
				rulesCfg.ProcPath, rulesCfg.View = paths.ProcFS, view
				return rules.New(rulesCfg, l)
			}),
		register(app, kubeproxy.Name, "kube-proxy's list/watch failures from its log (needs read access to the host's /var/log), and its metrics and health endpoints.",
			func(l *slog.Logger) (phcollectors.Collector, error) {
				return kubeproxy.New(kubeproxyCfg, l)
			}),
	}, api
}
