package exporter

import (
	"log/slog"

	"github.com/alecthomas/kingpin/v2"

	phcollectors "github.com/proxyhealth/proxyhealth/collectors"
	"github.com/proxyhealth/proxyhealth/collectors/conntrack"
	"github.com/proxyhealth/proxyhealth/collectors/node"
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

// registrations lists every collector, each adding its own flags to app. paths is filled in by
// the time build runs.
func registrations(app *kingpin.Application, paths *Paths) []registration {
	var conntrackCfg conntrack.Config
	conntrackCfg.AddFlags(app)
	var nodeCfg node.Config
	nodeCfg.AddFlags(app)
	return []registration{
		register(app, "conntrack", "table fill, per-CPU stats, the event stream and unreplied Service flows (needs CAP_NET_ADMIN).",
			func(l *slog.Logger) (phcollectors.Collector, error) {
				conntrackCfg.ProcPath = paths.ProcFS
				return conntrack.New(conntrackCfg, l)
			}),
		register(app, node.Name, "bridge netfilter and conntrack sysctls, and whether a conntrack INVALID drop rule is on the forward path (the rules check runs iptables-legacy-save, iptables-nft-save and nft: needs CAP_NET_ADMIN, and CAP_NET_RAW for legacy).",
			func(l *slog.Logger) (phcollectors.Collector, error) {
				nodeCfg.ProcPath = paths.ProcFS
				c, err := node.New(nodeCfg, l)
				if err != nil {
					return nil, err
				}
				return c, nil
			}),
	}
}
