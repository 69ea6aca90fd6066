package exporter

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strconv"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/prometheus/client_golang/prometheus"

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
	app.Flag("netfilter.legacy-min-read-interval", "Least time between two reads of the iptables-legacy tables (and of IPVS, in kube-proxy's IPVS mode): under churn they are read at most this often, and sooner when a difference from the API has lasted the grace period (it counts as drift only in rules read since).").
		Default("30s").DurationVar(&h.cfg.LegacyMinReadInterval)
	app.Flag("netfilter.resync-interval", "How often the iptables-legacy tables, and IPVS in kube-proxy's IPVS mode, are read again whatever their size said (nf_tables is followed through its notifications, and read whole only when some were lost).").
		Default("5m").DurationVar(&h.cfg.ResyncInterval)
	app.Flag("netfilter.max-dump-bytes", "Largest nf_tables netlink reply read (bytes); a larger one is abandoned and its read reported as failed. kube-proxy's nat table at 10,000 Services x 10 endpoints dumps to about 190 MiB.").
		Default(strconv.FormatInt(nftnl.DefaultMaxDumpBytes, 10)).Int64Var(&h.cfg.MaxDumpBytes)
	app.Flag("netfilter.legacy-max-table-bytes", "Largest iptables-legacy table read (bytes, as the kernel gives its size); a larger one is not read and its read reported as failed. The table is held whole while read: kube-proxy's nat table at 10,000 Services x 10 endpoints is about 183 MiB. 0: what the container's memory limit (or the node's memory, when smaller) leaves after the exporter's own memory, at most 384 MiB.").
		Default("0").Int64Var(&h.cfg.LegacyMaxTableBytes)
	h.cfg.Debounce = 100 * time.Millisecond
}

// ownMemoryBytes is the exporter's memory besides a legacy table read: its peak without one is
// 45 MiB at 10,000 Services x 10 endpoints, the API view included (BENCHMARKS.md, "Node cost"),
// and the rest is room for the garbage the runtime has not collected yet.
const ownMemoryBytes = 64 << 20

// legacyMaxTableBytes is the legacy table read limit: the flag's value when given, else what
// the memory the process may hold leaves after ownMemoryBytes (iptlegacy.MaxTableBytesWithin),
// so that a table too large for the container fails its read instead of getting the container
// killed. That memory is the cgroup's limit or the node's memory, whichever is smaller: a
// limit above the node's memory limits nothing. The result is never above the fixed default.
// It logs the limit and where it came from.
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
	// meminfo beside self: /proc/meminfo, the node's (a container's /proc shows the host's).
	nodeBytes, err := memlimit.MemTotal(filepath.Join(filepath.Dir(procSelf), "meminfo"))
	if err != nil {
		h.logger.Warn("cannot read the node's memory; the iptables-legacy table read limit follows the memory limit alone", "err", err)
	}
	limit, source := mem.Bytes, mem.Source
	if nodeBytes > 0 && (limit == 0 || nodeBytes < limit) {
		limit, source = nodeBytes, "the node's MemTotal"
	}
	n := iptlegacy.MaxTableBytesWithin(limit, ownMemoryBytes)
	if limit == 0 {
		h.logger.Info("iptables-legacy table read limit", "bytes", n, "from", "no memory limit: the fixed default")
		return n
	}
	level := slog.LevelInfo
	if limit <= ownMemoryBytes {
		// No legacy table can be read: said at the level of the failures to come.
		level = slog.LevelWarn
	}
	from := fmt.Sprintf("memory limit %d bytes (%s) less the exporter's own %d, over %.2f bytes a table byte read",
		limit, source, int64(ownMemoryBytes), iptlegacy.ReadPeakPerTableByte)
	if n == iptlegacy.DefaultMaxTableBytes {
		from = fmt.Sprintf("the fixed default, below what memory limit %d bytes (%s) leaves", limit, source)
	}
	h.logger.Log(context.Background(), level, "iptables-legacy table read limit", "bytes", n, "from", from)
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

// collectorFlags is every collector's switch and flags, and the readers they share; build
// makes the enabled collectors once the flags are parsed.
type collectorFlags struct {
	paths *Paths
	api   *apiView
	host  *hostRules

	conntrack conntrack.Config
	node      node.Config
	rules     rules.Config
	kubeproxy kubeproxy.Config

	// wired is every collector, in the order of their switches.
	wired []wiredCollector
}

// wiredCollector is one collector's place in the exporter: its --[no-]collector.<name>
// switch, its flags and how it is built from them and the shared readers. A new collector is
// its own package and one entry in addCollectorFlags.
type wiredCollector struct {
	name     string
	help     string // the switch's help, after "Enable the <name> collector: "
	addFlags func(*kingpin.Application)
	build    func(*slog.Logger) (phcollectors.Collector, error)
	on       *bool // set by the switch
}

// addCollectorFlags adds every collector's flags to app. paths is filled in by the time build
// runs.
func addCollectorFlags(app *kingpin.Application, paths *Paths) *collectorFlags {
	f := &collectorFlags{paths: paths, api: &apiView{}, host: &hostRules{}}
	f.wired = []wiredCollector{
		{
			name:     conntrack.Name,
			help:     "table fill, per-CPU stats, the event stream and unreplied Service flows, and conntrack's settings (needs CAP_NET_ADMIN).",
			addFlags: f.conntrack.AddFlags,
			build:    built(f.buildConntrack),
		},
		{
			name:     node.Name,
			help:     "bridge netfilter sysctls, and whether a conntrack INVALID drop rule is on the forward path (reading the rules needs CAP_NET_ADMIN, and CAP_NET_RAW for iptables-legacy).",
			addFlags: f.node.AddFlags,
			build:    built(f.buildNode),
		},
		{
			name:     rules.Name,
			help:     "kube-proxy's programmed endpoints against the API, per Service port (needs the API: --kubeconfig or in-cluster; CAP_NET_ADMIN to read the rules, and CAP_NET_RAW for iptables-legacy).",
			addFlags: f.rules.AddFlags,
			build:    built(f.buildRules),
		},
		{
			name:     kubeproxy.Name,
			help:     "kube-proxy's list/watch failures from its log (needs read access to the host's /var/log), and its metrics and health endpoints.",
			addFlags: f.kubeproxy.AddFlags,
			build:    built(f.buildKubeProxy),
		},
	}
	f.api.cfg.AddFlags(app)
	f.host.addFlags(app)
	for _, w := range f.wired {
		w.addFlags(app)
	}
	for i := range f.wired {
		w := &f.wired[i]
		w.on = app.Flag("collector."+w.name, "Enable the "+w.name+" collector: "+w.help).Default("true").Bool()
	}
	return f
}

// built adapts a collector package's constructor to wiredCollector.build. A failed build
// returns a nil interface, not an interface holding a nil *C.
func built[C phcollectors.Collector](build func(*slog.Logger) (C, error)) func(*slog.Logger) (phcollectors.Collector, error) {
	return func(l *slog.Logger) (phcollectors.Collector, error) {
		c, err := build(l)
		if err != nil {
			return nil, err
		}
		return c, nil
	}
}

// disabled names the collectors switched off, in the order of their switches.
func (f *collectorFlags) disabled() []string {
	var out []string
	for _, w := range f.wired {
		if !*w.on {
			out = append(out, w.name)
		}
	}
	return out
}

// builtCollectors are the exporter's enabled collectors, made in one place
// (collectorFlags.build). api and host are the readers they share, nil when no enabled
// collector needs them.
type builtCollectors struct {
	collectors []namedCollector // in the order of their switches

	api  *cluster.Cluster
	host *hostrules.Source
}

// build makes every enabled collector, with the API view and the netfilter reader when one of
// them needs it. On an error it returns what it built so far, for Close.
func (f *collectorFlags) build(logger *slog.Logger) (*builtCollectors, error) {
	b := &builtCollectors{}
	for _, w := range f.wired {
		if !*w.on {
			continue
		}
		c, err := w.build(logger.With("collector", w.name))
		if err != nil {
			return b.withReaders(f), &buildError{w.name, err}
		}
		runner, _ := c.(phcollectors.Runner)
		b.collectors = append(b.collectors, namedCollector{name: w.name, collector: c, runner: runner})
	}
	return b.withReaders(f), nil
}

// buildError is a collector that could not be built: a configuration error (a bad flag
// value), not a missing node feature, which Update reports.
type buildError struct {
	collector string
	err       error
}

func (e *buildError) Error() string { return "collector " + e.collector + ": " + e.err.Error() }
func (e *buildError) Unwrap() error { return e.err }

// withReaders sets the shared readers the collectors asked for.
func (b *builtCollectors) withReaders(f *collectorFlags) *builtCollectors {
	b.api, b.host = f.api.view, f.host.source
	return b
}

func (f *collectorFlags) buildConntrack(l *slog.Logger) (*conntrack.Collector, error) {
	view, err := f.api.get()
	if err != nil {
		return nil, err
	}
	rules, err := f.host.get(f.paths.ProcFS)
	if err != nil {
		return nil, err
	}
	f.conntrack.ProcPath, f.conntrack.View, f.conntrack.Rules = f.paths.ProcFS, view, rules
	return conntrack.New(f.conntrack, l)
}

func (f *collectorFlags) buildNode(l *slog.Logger) (*node.Collector, error) {
	rules, err := f.host.get(f.paths.ProcFS)
	if err != nil {
		return nil, err
	}
	f.node.ProcPath, f.node.Rules = f.paths.ProcFS, rules
	return node.New(f.node, l)
}

func (f *collectorFlags) buildRules(l *slog.Logger) (*rules.Collector, error) {
	view, err := f.api.get()
	if err != nil {
		return nil, err
	}
	source, err := f.host.get(f.paths.ProcFS)
	if err != nil {
		return nil, err
	}
	f.rules.View, f.rules.Rules = view, source
	return rules.New(f.rules, l)
}

func (f *collectorFlags) buildKubeProxy(l *slog.Logger) (*kubeproxy.Collector, error) {
	// kube-proxy's syncs tell the netfilter reader when the legacy tables, which the kernel
	// does not announce, may have changed.
	f.kubeproxy.OnSync = func() {
		if f.host.source != nil {
			f.host.source.Hint()
		}
	}
	// The API view computes what kube-proxy programs the way its version does.
	f.kubeproxy.OnVersion = func(v proxyversion.Version) {
		if f.api.view != nil {
			f.api.view.SetKubeProxyVersion(v)
		}
	}
	return kubeproxy.New(f.kubeproxy, l)
}

// startReaders starts the shared readers' background work: following netfilter, and the API
// view's watches.
func (b *builtCollectors) startReaders(ctx context.Context) {
	if b.host != nil {
		go b.host.Run(ctx)
	}
	if b.api != nil {
		go b.api.Run(ctx)
	}
}

// registerReaders adds the shared readers' own metrics to registry: the netfilter reader's
// work and the API view's health, whichever of their users are switched on.
func (b *builtCollectors) registerReaders(registry *prometheus.Registry) {
	if b.host != nil {
		registry.MustRegister(b.host)
	}
	if b.api != nil {
		registry.MustRegister(cluster.NewHealthCollector(b.api))
	}
}

// namedCollector is one enabled collector under its --[no-]collector.<name> switch's name;
// runner is its background work, nil when it has none.
type namedCollector struct {
	name      string
	collector phcollectors.Collector
	runner    phcollectors.Runner
}

// named lists the enabled collectors in the order of their switches.
func (b *builtCollectors) named() []namedCollector { return b.collectors }

// enabled returns the enabled collector of type C, if there is one: for the exporter's parts
// that need one collector's own methods (the verdict's facts, diagnose).
func enabled[C phcollectors.Collector](b *builtCollectors) (C, bool) {
	for _, n := range b.collectors {
		if c, ok := n.collector.(C); ok {
			return c, true
		}
	}
	var zero C
	return zero, false
}

// byName is the enabled collectors by name, for the registry's collector set.
func (b *builtCollectors) byName() map[string]phcollectors.Collector {
	out := map[string]phcollectors.Collector{}
	for _, n := range b.named() {
		out[n.name] = n.collector
	}
	return out
}

// Close puts back what a collector changed on the node (--conntrack.invalid-reasons); it
// may be called more than once.
func (b *builtCollectors) Close(logger *slog.Logger) {
	for _, n := range b.named() {
		if closer, ok := n.collector.(io.Closer); ok {
			if err := closer.Close(); err != nil {
				logger.Error("collector clean-up failed", "collector", n.name, "err", err)
			}
		}
	}
}
