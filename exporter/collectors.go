package exporter

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/alecthomas/kingpin/v2"

	phcollectors "github.com/proxyhealth/proxyhealth/collectors"
	"github.com/proxyhealth/proxyhealth/collectors/conntrack"
	"github.com/proxyhealth/proxyhealth/collectors/kubeproxy"
	"github.com/proxyhealth/proxyhealth/collectors/node"
	"github.com/proxyhealth/proxyhealth/collectors/rules"
	"github.com/proxyhealth/proxyhealth/internal/cluster"
	"github.com/proxyhealth/proxyhealth/internal/hostrules"
	"github.com/proxyhealth/proxyhealth/internal/iptlegacy"
	"github.com/proxyhealth/proxyhealth/internal/memlimit"
	"github.com/proxyhealth/proxyhealth/internal/nftnl"
	"github.com/proxyhealth/proxyhealth/internal/proxyversion"
)

// Paths are the host filesystems the collectors read; in a container they are the host's
// /proc and /sys mounted elsewhere, in tests a fixture tree.
type Paths struct {
	ProcFS string
}

func addPathFlags(app *kingpin.Application) *Paths {
	p := &Paths{}
	app.Flag("path.procfs", "procfs mountpoint.").Default("/proc").StringVar(&p.ProcFS)
	// Nothing proxyhealth reads is in sysfs (the bridge and conntrack settings are under
	// /proc/sys); kept so that command lines written for node_exporter-style flags still parse.
	app.Flag("path.sysfs", "Deprecated and ignored: nothing is read from sysfs.").Hidden().String()
	return p
}

// registration is one collector the exporter knows: its --[no-]collector.<name> switch and how
// to build it once the flags are parsed. build returns the collector's background work as its
// Runner, nil when it has none.
type registration struct {
	name    string
	enabled *bool
	build   func(*slog.Logger) (phcollectors.Collector, phcollectors.Runner, error)
}

// register adds a collector that does all its work when scraped.
func register(app *kingpin.Application, name, help string, build func(*slog.Logger) (phcollectors.Collector, error)) registration {
	return registration{name: name, enabled: collectorFlag(app, name, help), build: func(l *slog.Logger) (phcollectors.Collector, phcollectors.Runner, error) {
		c, err := build(l)
		return c, nil, err
	}}
}

// backgroundCollector is a collector with background work, which the exporter runs.
type backgroundCollector interface {
	phcollectors.Collector
	phcollectors.Runner
}

// registerRunner adds a collector with background work: the exporter starts its Run once every
// enabled collector is built.
func registerRunner[C backgroundCollector](app *kingpin.Application, name, help string, build func(*slog.Logger) (C, error)) registration {
	return registration{name: name, enabled: collectorFlag(app, name, help), build: func(l *slog.Logger) (phcollectors.Collector, phcollectors.Runner, error) {
		c, err := build(l)
		if err != nil {
			return nil, nil, err
		}
		return c, c, nil
	}}
}

func collectorFlag(app *kingpin.Application, name, help string) *bool {
	return app.Flag("collector."+name, "Enable the "+name+" collector: "+help).Default("true").Bool()
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
			return nil, fmt.Errorf("the API view: %w", err)
		}
		a.view = v
	}
	return a.view, nil
}

// hostRules is the exporter's one reader of the node's netfilter state, shared by the
// collectors that need it and built only if one of them is enabled.
type hostRules struct {
	cfg    hostrules.Config
	logger *slog.Logger
	source *hostrules.Source
	// procSelf is where the process's cgroup is read (default /proc/self; tests give theirs).
	procSelf string
}

func (h *hostRules) addFlags(app *kingpin.Application) {
	app.Flag("netfilter.legacy-poll-interval", "How often the iptables-legacy tables' size is compared with the last read (the kernel sends no notification for them; nf_tables changes are followed as they are committed).").
		Default("2s").DurationVar(&h.cfg.LegacyPollInterval)
	app.Flag("netfilter.legacy-min-read-interval", "Least time between two reads of the iptables-legacy tables: under churn they are read at most this often, and sooner when a difference from the API has lasted the grace period (it counts as drift only in rules read since).").
		Default("30s").DurationVar(&h.cfg.LegacyMinReadInterval)
	app.Flag("netfilter.resync-interval", "How often the iptables-legacy tables are read again whatever their size said (nf_tables is followed through its notifications, and read whole only when some were lost).").
		Default("5m").DurationVar(&h.cfg.ResyncInterval)
	app.Flag("netfilter.max-dump-bytes", "Largest nf_tables netlink reply read (bytes); a larger one is abandoned and its read reported as failed. kube-proxy's nat table at 10,000 Services x 10 endpoints dumps to about 190 MiB.").
		Default(strconv.FormatInt(nftnl.DefaultMaxDumpBytes, 10)).Int64Var(&h.cfg.MaxDumpBytes)
	app.Flag("netfilter.legacy-max-table-bytes", "Largest iptables-legacy table read (bytes, as the kernel gives its size); a larger one is not read and its read reported as failed. The table is held whole while read: kube-proxy's nat table at 10,000 Services x 10 endpoints is about 183 MiB. 0: what the container's memory limit leaves after the exporter's own memory (without a limit, 384 MiB).").
		Default("0").Int64Var(&h.cfg.LegacyMaxTableBytes)
	h.cfg.Debounce = 100 * time.Millisecond
}

// ownMemoryBytes is the exporter's memory besides a legacy table read: its peak without one is
// 45 MiB at 10,000 Services x 10 endpoints, the API view included (BENCHMARKS.md, "Node cost"),
// and the rest is room for the garbage the runtime has not collected yet.
const ownMemoryBytes = 64 << 20

// legacyMaxTableBytes is the legacy table read limit: the flag's value when given, else what
// the process's cgroup memory limit leaves after ownMemoryBytes (iptlegacy.MaxTableBytesWithin),
// so that a table too large for the container fails its read instead of getting the container
// killed. It logs the limit and where it came from.
func (h *hostRules) legacyMaxTableBytes() int64 {
	if h.cfg.LegacyMaxTableBytes > 0 {
		h.logger.Info("iptables-legacy table read limit", "bytes", h.cfg.LegacyMaxTableBytes, "from", "--netfilter.legacy-max-table-bytes")
		return h.cfg.LegacyMaxTableBytes
	}
	procSelf := h.procSelf
	if procSelf == "" {
		procSelf = "/proc/self"
	}
	mem, err := memlimit.Read(procSelf)
	if err != nil {
		h.logger.Warn("cannot read the memory limit; the iptables-legacy table read limit is the fixed default",
			"bytes", iptlegacy.DefaultMaxTableBytes, "err", err)
		return iptlegacy.DefaultMaxTableBytes
	}
	n := iptlegacy.MaxTableBytesWithin(mem.Bytes, ownMemoryBytes)
	if mem.Bytes == 0 {
		h.logger.Info("iptables-legacy table read limit", "bytes", n, "from", "no memory limit: the fixed default")
		return n
	}
	level := slog.LevelInfo
	if mem.Bytes <= ownMemoryBytes {
		// No legacy table can be read: said at the level of the failures to come.
		level = slog.LevelWarn
	}
	h.logger.Log(context.Background(), level, "iptables-legacy table read limit", "bytes", n,
		"from", fmt.Sprintf("memory limit %d bytes (%s) less the exporter's own %d, over %.2f bytes a table byte read",
			mem.Bytes, mem.Source, int64(ownMemoryBytes), iptlegacy.ReadPeakPerTableByte))
	return n
}

func (h *hostRules) get(procPath string) (*hostrules.Source, error) {
	if h.source == nil {
		// hostrules.Config takes 0 for its default: --netfilter.max-dump-bytes=0 is a mistake,
		// and a legacy table limit of 0 is the one the memory limit gives.
		switch {
		case h.cfg.MaxDumpBytes <= 0:
			return nil, fmt.Errorf("--netfilter.max-dump-bytes must be positive, got %d", h.cfg.MaxDumpBytes)
		case h.cfg.LegacyMaxTableBytes < 0:
			return nil, fmt.Errorf("--netfilter.legacy-max-table-bytes must not be negative, got %d", h.cfg.LegacyMaxTableBytes)
		}
		h.cfg.LegacyMaxTableBytes = h.legacyMaxTableBytes()
		h.cfg.ProcPath = procPath
		s, err := hostrules.New(h.cfg, h.logger.With("component", "netfilter"))
		if err != nil {
			return nil, fmt.Errorf("the netfilter reader: %w", err)
		}
		h.source = s
	}
	return h.source, nil
}

// registrations lists every collector, each adding its own flags to app. paths is filled in by
// the time build runs; the returned apiView holds the API view once a collector asked for it.
func registrations(app *kingpin.Application, paths *Paths) ([]registration, *apiView, *hostRules) {
	api := &apiView{}
	api.cfg.AddFlags(app)
	host := &hostRules{}
	host.addFlags(app)
	var conntrackCfg conntrack.Config
	conntrackCfg.AddFlags(app)
	var nodeCfg node.Config
	nodeCfg.AddFlags(app)
	var rulesCfg rules.Config
	rulesCfg.AddFlags(app)
	var kubeproxyCfg kubeproxy.Config
	kubeproxyCfg.AddFlags(app)
	return []registration{
		registerRunner(app, conntrack.Name, "table fill, per-CPU stats, the event stream and unreplied Service flows, and conntrack's settings (needs CAP_NET_ADMIN).",
			func(l *slog.Logger) (*conntrack.Collector, error) {
				view, err := api.get()
				if err != nil {
					return nil, err
				}
				rules, err := host.get(paths.ProcFS)
				if err != nil {
					return nil, err
				}
				conntrackCfg.ProcPath, conntrackCfg.View, conntrackCfg.Rules = paths.ProcFS, view, rules
				return conntrack.New(conntrackCfg, l)
			}),
		register(app, node.Name, "bridge netfilter sysctls, and whether a conntrack INVALID drop rule is on the forward path (reading the rules needs CAP_NET_ADMIN, and CAP_NET_RAW for iptables-legacy).",
			func(l *slog.Logger) (phcollectors.Collector, error) {
				rules, err := host.get(paths.ProcFS)
				if err != nil {
					return nil, err
				}
				nodeCfg.ProcPath, nodeCfg.Rules = paths.ProcFS, rules
				return node.New(nodeCfg, l)
			}),
		registerRunner(app, rules.Name, "kube-proxy's programmed endpoints against the API, per Service port (needs the API: --kubeconfig or in-cluster; CAP_NET_ADMIN to read the rules, and CAP_NET_RAW for iptables-legacy).",
			func(l *slog.Logger) (*rules.Collector, error) {
				view, err := api.get()
				if err != nil {
					return nil, err
				}
				source, err := host.get(paths.ProcFS)
				if err != nil {
					return nil, err
				}
				rulesCfg.View, rulesCfg.Rules = view, source
				return rules.New(rulesCfg, l)
			}),
		registerRunner(app, kubeproxy.Name, "kube-proxy's list/watch failures from its log (needs read access to the host's /var/log), and its metrics and health endpoints.",
			func(l *slog.Logger) (*kubeproxy.Collector, error) {
				// kube-proxy's syncs tell the netfilter reader when the legacy tables, which
				// the kernel does not announce, may have changed.
				kubeproxyCfg.OnSync = func() {
					if host.source != nil {
						host.source.Hint()
					}
				}
				// The API view computes what kube-proxy programs the way its version does.
				kubeproxyCfg.OnVersion = func(v proxyversion.Version) {
					if api.view != nil {
						api.view.SetKubeProxyVersion(v)
					}
				}
				return kubeproxy.New(kubeproxyCfg, l)
			}),
	}, api, host
}
