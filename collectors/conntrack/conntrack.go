// Package conntrack is the conntrack collector: the kernel's table fill and per-CPU statistics
// read over netlink at scrape time, and a background listener on the conntrack event stream
// that counts events and follows DNAT'ed flows (kube-proxy's Service traffic) to find those
// that end, or stay, unreplied: the trace of incident 1 (bridged replies that escape
// netfilter) and of endpoints that are gone. It also reports conntrack's own settings that
// decide what it sees and marks INVALID (incident 2): TCP window liberality and the event
// setting, read from procfs on every scrape.
//
// The statistics come through github.com/ti-mo/conntrack; the event stream is decoded by the
// package's own decoder (decode.go), 20 to 30 times faster than ti-mo/conntrack's and
// allocation-free on the same kernel messages (BENCHMARKS.md, "Conntrack event decoding").
package conntrack

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/prometheus/client_golang/prometheus"

	phcollectors "github.com/proxyhealth/proxyhealth/collectors"
	"github.com/proxyhealth/proxyhealth/internal/cluster"
	"github.com/proxyhealth/proxyhealth/internal/metricdesc"
	"github.com/proxyhealth/proxyhealth/internal/periodic"
	"github.com/proxyhealth/proxyhealth/internal/sysctl"
)

// Name is the collector's name (--[no-]collector.conntrack).
const Name = "conntrack"

// Config holds the collector's settings; AddFlags binds them to command-line flags.
type Config struct {
	ProcPath string // filled by the exporter from --path.procfs
	// View is the exporter's view of the Kubernetes API, the preferred source of Service
	// attribution; nil without one (kube-proxy's rules are read instead).
	View cluster.View
	// Rules is the node's netfilter state, the source of Service attribution while there is
	// no synced API view; nil leaves flows unattributed then.
	Rules Rules

	UnrepliedAfter         time.Duration
	MaxTrackedFlows        int
	MaxServiceSeries       int
	SocketBufferBytes      int
	ServiceRefreshInterval time.Duration
	ResyncMinInterval      time.Duration
	// TableStats exports the series node_exporter's conntrack collector also exports (see
	// nodeExporterOverlap); off, they are read still (the verdict judges from them) but not
	// exported.
	TableStats bool
	// InvalidReasons reads conntrack's INVALID log from NFLOG group 0 (see invalidLog).
	InvalidReasons bool
	// InvalidReasonsStateDir keeps the node's own values of the settings InvalidReasons
	// changes, for the next start should this process end without putting them back
	// (invalidState); "" keeps none.
	InvalidReasonsStateDir string
	// InvalidReasonsNetfilterDir is where InvalidReasons writes its settings; "" is
	// ProcPath's sys/net/netfilter.
	InvalidReasonsNetfilterDir string
	// InvalidReasonsMaxRate is the INVALID log's rate, in packets per second, above which it
	// is read in windows (invalidFloodBound); 0 reads every packet at any rate.
	InvalidReasonsMaxRate int
	// SilentCheckInterval is how often the flows that predate the listener are looked for in
	// the table (AddFlags sets it; not a flag); zero never looks.
	SilentCheckInterval time.Duration

	// Kernel replaces the kernel's conntrack netlink and rtnetlink; nil reads this network
	// namespace's (see Kernel).
	Kernel Kernel
	// Now is the clock flows are timed by; nil means time.Now. A field rather than a setting,
	// with no default in AddFlags: it exists only so that tests can fix the time.
	Now func() time.Time
}

// invalidLogNetfilterDir is where the INVALID log's settings are written.
func (c *Config) invalidLogNetfilterDir() string {
	if c.InvalidReasonsNetfilterDir != "" {
		return c.InvalidReasonsNetfilterDir
	}
	return filepath.Join(c.ProcPath, sysctl.NetfilterDir)
}

// AddFlags registers the collector's flags on app.
func (c *Config) AddFlags(app *kingpin.Application) {
	app.Flag("conntrack.unreplied-after", "A DNAT'ed flow counts in proxyhealth_conntrack_open_unreplied_flows once it has gone this long without a reply.").
		Default("3s").DurationVar(&c.UnrepliedAfter)
	// 57344 is the most a Go map of 2^16 slots holds (7/8 of them): one flow more and the
	// whole set doubles, to 5 MiB where this many take 3.7 (BenchmarkTrackerFull).
	app.Flag("conntrack.max-tracked-flows", "Most unreplied DNAT'ed flows followed at once; more are counted in proxyhealth_conntrack_untracked_flows_total. Bounds memory whatever the flow rate: about 64 bytes a flow.").
		Default("57344").IntVar(&c.MaxTrackedFlows)
	app.Flag("conntrack.max-service-series", "Most per-service label sets of the unreplied-flow series; flows beyond it are counted in the *_unlisted series.").
		Default("100").IntVar(&c.MaxServiceSeries)
	app.Flag("conntrack.socket-buffer-bytes", "Receive buffer of the conntrack event socket; a larger one rides out bursts without losing events.").
		Default("33554432").IntVar(&c.SocketBufferBytes)
	app.Flag("conntrack.service-refresh-interval", "How often the map from Service address to Service and the node's bridges and pod routes are re-read.").
		Default("60s").DurationVar(&c.ServiceRefreshInterval)
	app.Flag("conntrack.resync-min-interval", "Least time between two re-reads of the conntrack table after the kernel dropped events for the listener.").
		Default("30s").DurationVar(&c.ResyncMinInterval)
	app.Flag("conntrack.table-stats", "Export the conntrack table's size and the kernel's per-CPU conntrack statistics that node_exporter's conntrack collector also exports (as node_nf_conntrack_*); --no-conntrack.table-stats where node_exporter runs too. proxyhealth's own alerts and dashboards read these series.").
		Default("true").BoolVar(&c.TableStats)
	app.Flag("conntrack.invalid-reasons", "Name the kernel's reason and the Service of each packet conntrack marks INVALID (proxyhealth_conntrack_invalid_reason_packets_total), from conntrack's own log: sets net.netfilter.nf_conntrack_log_invalid=255 and the nf_log backend of IPv4 and IPv6 to nfnetlink_log in the exporter's network namespace, and reads NFLOG group 0, which takes one reader per namespace: another user of group 0 (ulogd, an NFLOG rule without a group) keeps it, and this part fails until it is free. The old values are saved in --conntrack.invalid-reasons.state-dir before any changes, and put back on exit (SIGTERM included); after a crash, the next start takes the saved values as the node's and puts them back on its exit.").
		Default("false").BoolVar(&c.InvalidReasons)
	app.Flag("conntrack.invalid-reasons.state-dir", "A directory of the node's (a hostPath: it must outlive the container) where --conntrack.invalid-reasons keeps the node's own values of the settings it changes, in a file only the exporter's user can read, from before the first change until they are put back: a SIGKILL, an OOM kill or a panic cannot lose them. The part fails if the file cannot be written. Empty: keep none (a crash leaves the settings changed, and the next start puts them back to log nothing).").
		Default("/run/proxyhealth").StringVar(&c.InvalidReasonsStateDir)
	app.Flag("conntrack.invalid-reasons.netfilter-dir", "The netfilter sysctl directory --conntrack.invalid-reasons writes its settings in, a mount of the host's /proc/sys/net/netfilter, writable: a container's own /proc/sys is read-only, and this is all of the host's /proc the part needs (its files are those of the network namespace of the process that opens them, the node's with hostNetwork). Empty: --path.procfs's sys/net/netfilter.").
		Default("").StringVar(&c.InvalidReasonsNetfilterDir)
	app.Flag("conntrack.invalid-reasons.max-rate", "The rate of conntrack's INVALID log, in packets per second, above which --conntrack.invalid-reasons stops reading every packet (each costs the exporter a few microseconds, and anyone who can send a Service SYN+FIN segments sets the rate): it then listens at most 1s in every 10s, and less once a window has read max-rate packets, leaving NFLOG group 0 unbound in between, until a window runs under the rate. The counts are then a sample: proxyhealth_conntrack_invalid_log_listened_seconds_total says over what share of the time. 0: read every packet at any rate.").
		Default("10000").IntVar(&c.InvalidReasonsMaxRate)
	// Not a flag: start-up flows end within conntrack's timeouts (2 minutes for an unanswered
	// SYN); checking them every 10s keeps the open gauge within that of the truth.
	c.SilentCheckInterval = 10 * time.Second
}

func (c *Config) validate() error {
	return errors.Join(
		phcollectors.NotEmpty("path.procfs", c.ProcPath),
		phcollectors.Positive("conntrack.unreplied-after", c.UnrepliedAfter),
		phcollectors.Positive("conntrack.max-tracked-flows", c.MaxTrackedFlows),
		phcollectors.NotNegative("conntrack.max-service-series", c.MaxServiceSeries),
		phcollectors.Positive("conntrack.socket-buffer-bytes", c.SocketBufferBytes),
		phcollectors.Positive("conntrack.service-refresh-interval", c.ServiceRefreshInterval),
		phcollectors.NotNegative("conntrack.resync-min-interval", c.ResyncMinInterval),
		phcollectors.NotNegative("conntrack.invalid-reasons.max-rate", c.InvalidReasonsMaxRate),
	)
}

// Collector is the conntrack collector.
type Collector struct {
	cfg      Config
	logger   *slog.Logger
	tracker  *flowTracker
	services *rulesServices
	invalid  *invalidLog // nil without --conntrack.invalid-reasons
	// The kernel's interfaces, replaced in tests.
	stats      func() (tableStats, error)
	openEvents func(bufBytes int) (eventSource, error)
	dump       func(fn func(*flowEvent)) error
	loadNet    func() (*localNet, error)
	now        func() time.Time

	events        [eventDestroy + 1]atomic.Uint64
	receiveErrors atomic.Uint64
	resyncs       atomic.Uint64
	view          atomic.Pointer[attributionView]

	mu        sync.Mutex
	sock      eventSource // the live event socket, for its drop count
	lostBase  uint64      // drops of sockets already replaced
	listenErr error       // why the event listener is not running, nil while it is
}

// New builds the collector. It opens nothing: the event socket is opened by Run, and a
// missing capability or kernel feature is reported by Update, not here.
func New(cfg Config, logger *slog.Logger) (*Collector, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	c := &Collector{
		cfg:        cfg,
		logger:     logger,
		tracker:    newFlowTracker(cfg.MaxTrackedFlows, cfg.MaxServiceSeries),
		services:   newRulesServices(cfg.Rules, logger, cfg.InvalidReasons),
		stats:      readStats,
		openEvents: func(n int) (eventSource, error) { return openEventSocket(n) },
		dump:       dumpTable,
		loadNet:    loadLocalNet,
		now:        time.Now,
	}
	if cfg.InvalidReasons {
		c.invalid = newInvalidLog(&c.cfg, logger, c.view.Load)
	}
	if cfg.Kernel != nil {
		c.useKernel(cfg.Kernel)
	}
	if cfg.Now != nil {
		c.now = cfg.Now
	}
	c.view.Store(&attributionView{services: emptyServiceMap{}, endpoints: emptyServiceMap{}, net: &localNet{}})
	return c, nil
}

// Close puts back the node settings --conntrack.invalid-reasons changed, at once: the exporter
// calls it on its way out, since Run's own clean-up may not get to run before the process
// ends.
func (c *Collector) Close() error {
	if c.invalid != nil {
		c.invalid.restore()
	}
	return nil
}

var _ phcollectors.Runner = (*Collector)(nil)

// Run follows the conntrack event stream until ctx is done, re-subscribing after any receive
// error, and keeps the Service map and the local network view fresh.
func (c *Collector) Run(ctx context.Context) {
	c.warnIfEventsOff()
	if c.invalid != nil {
		// Run returns once the node's settings are back.
		invalidDone := make(chan struct{})
		go func() { c.invalid.run(ctx); close(invalidDone) }()
		defer func() { <-invalidDone }()
	}
	go c.refreshViewLoop(ctx)
	if c.cfg.SilentCheckInterval > 0 {
		go periodic.Every(ctx, c.cfg.SilentCheckInterval, c.checkSilent)
	}
	c.listenLoop(ctx)
}

// checkSilent re-reads the table while flows found at start-up are tracked, since those send
// no events (see flowSilent).
func (c *Collector) checkSilent() {
	if !c.tracker.hasSilent() {
		return
	}
	if err := c.tracker.checkSilent(c.dump); err != nil {
		c.logger.Debug("re-reading the conntrack table for flows that predate the listener failed", "err", err)
	}
}

func (c *Collector) warnIfEventsOff() {
	if v, exists, err := sysctl.ReadInt(filepath.Join(c.cfg.ProcPath, sysctl.ConntrackEvents)); err == nil && exists && v == 0 {
		c.logger.Warn("net.netfilter.nf_conntrack_events is 0: the kernel sends no conntrack events, so unreplied flows cannot be seen (table stats still work)")
	}
}

func (c *Collector) setListenErr(err error) {
	c.mu.Lock()
	c.listenErr = err
	c.mu.Unlock()
}

// adopt makes sock the live socket and closes the one it replaces, in that order, so that no
// moment passes without a subscribed socket (with nf_conntrack_events=2 the kernel stops
// generating events for flows while nobody listens).
func (c *Collector) adopt(sock eventSource) {
	c.mu.Lock()
	old := c.sock
	if old != nil {
		if d, err := old.drops(); err == nil {
			c.lostBase += uint64(d)
		}
	}
	c.sock = sock
	c.mu.Unlock()
	if old != nil {
		old.Close()
	}
}

func (c *Collector) listenLoop(ctx context.Context) {
	const maxBackoff = 30 * time.Second
	backoff := time.Second
	first := true // no listener of ours existed before this socket
	for ctx.Err() == nil {
		sock, err := c.openEvents(c.cfg.SocketBufferBytes)
		if err != nil {
			c.setListenErr(err)
			select {
			case <-ctx.Done():
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, maxBackoff)
			continue
		}
		c.adopt(sock)
		// The socket is subscribed before the table is read, so a flow that changes during the
		// dump is seen in the dump, in the queued events, or both; never in neither.
		if err := c.resync(first); err != nil {
			c.setListenErr(fmt.Errorf("seed flow tracking from the conntrack table: %w", err))
		} else {
			c.setListenErr(nil)
		}
		first = false
		backoff = time.Second
		err = c.consume(ctx, sock)
		if ctx.Err() != nil {
			break
		}
		c.receiveErrors.Add(1)
		c.logger.Warn("conntrack event stream failed; opening a new socket and re-reading the table", "err", err)
	}
	c.mu.Lock()
	sock := c.sock
	c.sock = nil
	c.mu.Unlock()
	if sock != nil {
		sock.Close()
	}
}

// resync re-reads the table and replaces the tracked flows with its unreplied DNAT'ed ones.
func (c *Collector) resync(newAreSilent bool) error {
	if err := c.tracker.resync(c.dump, c.now().UnixNano(), newAreSilent); err != nil {
		return err
	}
	c.resyncs.Add(1)
	return nil
}

// consume reads events from sock until it fails or ctx is done.
func (c *Collector) consume(ctx context.Context, sock eventSource) error {
	stop := context.AfterFunc(ctx, func() { sock.Close() })
	defer stop()

	const dropCheckInterval = 5 * time.Second
	var (
		ev            flowEvent
		sinceCheck    int
		lastCheck     = time.Now()
		lastResync    = time.Now()
		dropsAtResync uint32
	)
	// checkDrops re-reads the table when the kernel dropped events for us: lost events leave
	// tracking wrong (a missed reply or end). At most once per ResyncMinInterval, so that a
	// sustained overload is not made worse; only looked at every few thousand events and
	// seconds, since drops only happen under load.
	checkDrops := func() {
		now := time.Now()
		if now.Sub(lastCheck) < dropCheckInterval {
			return
		}
		lastCheck = now
		drops, err := sock.drops()
		if err == nil && drops > dropsAtResync && now.Sub(lastResync) >= c.cfg.ResyncMinInterval {
			dropsAtResync, lastResync = drops, now
			if err := c.resync(false); err != nil {
				c.logger.Warn("re-reading the conntrack table after lost events failed", "err", err)
			}
		}
	}
	return sock.receiveBatches(func(msg []byte) error {
		c.handleMessage(msg, &ev)
		if sinceCheck++; sinceCheck >= 4096 {
			sinceCheck = 0
			checkDrops()
		}
		return nil
	})
}

// handleMessage decodes one event message into ev (the caller's, reused) and applies it: the
// per-event work of the listener (BenchmarkHandleMessage).
func (c *Collector) handleMessage(msg []byte, ev *flowEvent) {
	if err := decodeFlowMessage(msg, ev); err != nil {
		if !errors.Is(err, errNotConntrack) {
			// One undecodable message loses one event, not the stream.
			c.receiveErrors.Add(1)
			c.logger.Debug("skipping undecodable conntrack event", "err", err)
		}
		return
	}
	c.events[ev.typ].Add(1)
	c.tracker.handle(ev, c.now().UnixNano(), c.view.Load())
}

// eventSource is the subscribed event socket as the listener uses it.
type eventSource interface {
	// receiveBatches calls fn with each message until fn or the socket fails.
	receiveBatches(fn func(msg []byte) error) error
	drops() (uint32, error)
	Close() error
}

// attributionView is the current Service map and local network, swapped as a whole.
type attributionView struct {
	services ServiceMap
	// endpoints maps each endpoint (address, port, protocol) to a Service it serves; built
	// only for --conntrack.invalid-reasons, empty otherwise.
	endpoints ServiceMap
	net       *localNet
}

// nodePortService names the Service whose node port addr:port is, when addr is one of this
// node's addresses. The port is looked up first: most ports are no node port.
func (v *attributionView) nodePortService(addr netip.Addr, port uint16, proto uint8) (Service, bool) {
	svc, ok := v.services.LookupNodePort(addr, port, proto)
	if !ok || !v.net.isNodeAddr(addr.Unmap()) {
		return Service{}, false
	}
	return svc, true
}

// invalidPacketService names the Service an INVALID packet belongs to, whichever way it went:
// to or from a Service's cluster IP or external IP (the client's side, before DNAT), from or
// to one of its endpoints (the endpoint's side: incident 2's out-of-window packets come from
// the endpoint, not NATed back), or to one of its node ports. A node port is looked up last,
// and only as the destination: it is a port number on the node's own addresses, which the
// node's own connections and masqueraded replies also use (node ports are allocated outside
// Linux's ephemeral ports by default, not necessarily). The zero Service when nothing
// matches.
func (v *attributionView) invalidPacketService(t *tuple) Service {
	if svc, ok := v.services.Lookup(t.dst, t.dstPort, t.proto); ok {
		return svc
	}
	if svc, ok := v.services.Lookup(t.src, t.srcPort, t.proto); ok {
		return svc
	}
	if v.endpoints != nil {
		if svc, ok := v.endpoints.Lookup(t.src, t.srcPort, t.proto); ok {
			return svc
		}
		if svc, ok := v.endpoints.Lookup(t.dst, t.dstPort, t.proto); ok {
			return svc
		}
	}
	svc, _ := v.nodePortService(t.dst, t.dstPort, t.proto)
	return svc
}

// attribute names the series of an unreplied flow by its original destination: the Service
// address the client used, node ports included (kube-proxy DNATs those too).
func (v *attributionView) attribute(orig, reply *tuple) seriesKey {
	svc, ok := v.services.Lookup(orig.dst, orig.dstPort, orig.proto)
	if !ok {
		svc, ok = v.nodePortService(orig.dst, orig.dstPort, orig.proto)
	}
	if !ok {
		return seriesKey{proto: orig.proto, reason: reasonNoService}
	}
	return seriesKey{svc: svc, proto: orig.proto, reason: v.net.classify(orig.src, reply.src)}
}

// refreshViewLoop keeps the attribution view current: the node's bridges and routes every
// ServiceRefreshInterval, and the Service map whenever its source publishes anew (told by its
// notification, then a comparison of generations): the API view once synced, before that (or
// without one) kube-proxy's rules as internal/hostrules last read them.
func (c *Collector) refreshViewLoop(ctx context.Context) {
	slow := time.NewTicker(c.cfg.ServiceRefreshInterval)
	defer slow.Stop()
	// A new read of the rules, or a new generation of the API view, is taken at once when
	// its source tells of one. A view without notifications (a fixed one) is read once.
	var rulesChanged, viewChanged <-chan struct{}
	if sub, ok := c.cfg.Rules.(interface{ Subscribe() <-chan struct{} }); ok {
		rulesChanged = sub.Subscribe()
	}
	if n, ok := c.cfg.View.(cluster.Notifier); ok {
		viewChanged = n.Subscribe()
	}
	var (
		lastNetErr    string
		ln            *localNet
		fromRules     ServiceMap = emptyServiceMap{}
		rulesEndpoint ServiceMap = emptyServiceMap{}
		lastGen       uint64
		fromAPI       ServiceMap
		apiEndpoints  ServiceMap             = emptyServiceMap{}
		fromPorts     []*cluster.ServicePort // the ports fromAPI was built from
		usingAPI      bool
		dirty         = true // the view must be stored anew
	)
	reload := func() {
		var err error
		if ln, err = c.loadNet(); err != nil {
			if err.Error() != lastNetErr {
				c.logger.Warn("cannot read the node's bridges and routes; endpoints will be classed remote", "err", err)
			}
			lastNetErr = err.Error()
			ln = &localNet{}
		} else {
			lastNetErr = ""
		}
		dirty = true
	}
	reload()
	for {
		if c.cfg.View == nil || !c.cfg.View.Snapshot().Synced {
			if m, eps, changed := c.services.load(); changed {
				fromRules, rulesEndpoint, dirty = m, eps, true
			}
		}
		services, endpoints, api := fromRules, rulesEndpoint, false
		if c.cfg.View != nil {
			if snap := c.cfg.View.Snapshot(); snap.Synced {
				if fromAPI == nil || snap.Generation != lastGen {
					if fromAPI == nil || !sameServices(fromPorts, snap.Ports) {
						fromAPI, dirty = apiServiceMap(snap), true
					}
					// Endpoints change far more often than Services; their map is built
					// only for the INVALID log, which needs it.
					if c.cfg.InvalidReasons {
						apiEndpoints, dirty = apiEndpointMap(snap), true
					}
					fromPorts, lastGen = snap.Ports, snap.Generation
				}
				services, endpoints, api = fromAPI, apiEndpoints, true
			}
		}
		if dirty || api != usingAPI {
			c.view.Store(&attributionView{services: services, endpoints: endpoints, net: ln})
			dirty, usingAPI = false, api
		}
		select {
		case <-ctx.Done():
			return
		case <-slow.C:
			reload()
		case <-viewChanged:
		case <-rulesChanged:
		}
	}
}

var (
	entriesDesc      = metricdesc.New("conntrack", "entries", "Entries in the conntrack table (netlink global stats; the same as nf_conntrack_count).")
	entriesLimitDesc = metricdesc.New("conntrack", "entries_limit", "Size of the conntrack table (netlink global stats; nf_conntrack_max).")
	// The kernel's per-CPU statistics (netlink CTA_STATS_*; conntrack -S), summed over CPUs.
	// nodeExporterOverlap marks the series node_exporter's conntrack collector (collector/
	// conntrack_linux.go) also exports, from /proc/sys/net/netfilter and /proc/net/stat/
	// nf_conntrack: the same kernel counters, as gauges named node_nf_conntrack_entries,
	// node_nf_conntrack_entries_limit and node_nf_conntrack_stat_<stat>. Config.TableStats
	// switches them off; error has no node_exporter twin and stays.
	cpuStatDescs = []struct {
		desc                *prometheus.Desc
		value               func(*cpuStats) uint64
		nodeExporterOverlap bool
	}{
		{metricdesc.New("conntrack", "invalid_packets_total", "Packets conntrack could not track and marked INVALID (kernel per-CPU stat invalid, summed). Unless dropped, such a reply leaves the node un-NATed."), func(s *cpuStats) uint64 { return s.invalid }, true},
		{metricdesc.New("conntrack", "insert_failed_total", "Entries that could not be inserted, e.g. a clash of two racing packets (kernel stat insert_failed)."), func(s *cpuStats) uint64 { return s.insertFailed }, true},
		{metricdesc.New("conntrack", "drop_total", "Packets dropped because a new entry could not be created, e.g. the table was full (kernel stat drop)."), func(s *cpuStats) uint64 { return s.drop }, true},
		{metricdesc.New("conntrack", "early_drop_total", "Entries evicted early to make room in a full table (kernel stat early_drop)."), func(s *cpuStats) uint64 { return s.earlyDrop }, true},
		{metricdesc.New("conntrack", "found_total", "Lookups that found an existing entry (kernel stat found; always 0 on recent kernels)."), func(s *cpuStats) uint64 { return s.found }, true},
		{metricdesc.New("conntrack", "ignore_total", "Packets conntrack did not look at, e.g. already tracked or untracked (kernel stat ignore)."), func(s *cpuStats) uint64 { return s.ignore }, true},
		{metricdesc.New("conntrack", "insert_total", "Entries inserted (kernel stat insert; always 0 on recent kernels)."), func(s *cpuStats) uint64 { return s.insert }, true},
		{metricdesc.New("conntrack", "error_total", "ICMP error packets that could not be matched to an entry (kernel stat error)."), func(s *cpuStats) uint64 { return s.error }, false},
		{metricdesc.New("conntrack", "search_restart_total", "Table lookups restarted because the table was resized (kernel stat search_restart)."), func(s *cpuStats) uint64 { return s.searchRestart }, true},
	}

	eventsDesc = metricdesc.New("conntrack", "events_total",
		"Conntrack events received from the kernel's event stream (netlink groups NEW, UPDATE, DESTROY), by event.", "event")
	eventsLostDesc        = metricdesc.New("conntrack", "events_lost_total", "Conntrack events the kernel dropped for the exporter's socket because its buffer was full (the socket's sk_drops, the Drops column of /proc/net/netlink), over all sockets this process opened.")
	receiveErrorsDesc     = metricdesc.New("conntrack", "receive_errors_total", "Errors receiving or decoding the conntrack event stream; after a receive error the exporter opens a new socket and re-reads the table.")
	resyncsDesc           = metricdesc.New("conntrack", "table_resyncs_total", "Times the exporter re-read the conntrack table to re-seed flow tracking (at start, after a receive error, after lost events).")
	untrackedDesc         = metricdesc.New("conntrack", "untracked_flows_total", "New unreplied DNAT'ed flows not followed because --conntrack.max-tracked-flows were already followed; they still count when they end unreplied.")
	trackedDesc           = metricdesc.New("conntrack", "tracked_flows", "Unreplied DNAT'ed flows being followed right now.")
	serviceLabels         = []string{"service_namespace", "service_name", "service_port", "protocol", "reason"}
	unrepliedDesc         = metricdesc.New("conntrack", "unreplied_flows_total", "DNAT'ed flows (Service traffic) that ended without ever seeing a reply (conntrack DESTROY without SEEN_REPLY), by Service port and where the endpoint was: same_bridge (client and endpoint on one local bridge: check bridge-nf-call-iptables), local_endpoint, remote_endpoint, no_service.", serviceLabels...)
	openUnrepliedDesc     = metricdesc.New("conntrack", "open_unreplied_flows", "DNAT'ed flows open right now that have had no reply for longer than --conntrack.unreplied-after, by Service port and reason (as proxyhealth_conntrack_unreplied_flows_total).", serviceLabels...)
	overflowLabels        = []string{"protocol", "reason"}
	unrepliedUnlistedDesc = metricdesc.New("conntrack", "unreplied_flows_unlisted_total", "Unreplied flows of Service ports left out of the per-service series by --conntrack.max-service-series.", overflowLabels...)
	openUnlistedDesc      = metricdesc.New("conntrack", "open_unreplied_flows_unlisted", "Open unreplied flows of Service ports left out of the per-service series by --conntrack.max-service-series.", overflowLabels...)
	tcpBeLiberalDesc      = metricdesc.New("conntrack", "tcp_be_liberal", "net.netfilter.nf_conntrack_tcp_be_liberal, read from <procfs>/sys/net/netfilter/nf_conntrack_tcp_be_liberal: 1 when conntrack does not mark out-of-window TCP packets INVALID.")
	eventsSettingDesc     = metricdesc.New("conntrack", "events_setting", "net.netfilter.nf_conntrack_events, read from <procfs>/sys/net/netfilter/nf_conntrack_events: 0 off (the conntrack event listener sees nothing), 1 on, 2 on while a listener exists.")
	invalidReasonDesc     = metricdesc.New("conntrack", "invalid_reason_packets_total", "With --conntrack.invalid-reasons: packets conntrack marked INVALID and logged, from its log on NFLOG group 0, by the kernel's reason (tcp_flags, checksum, invalid_new, icmp_type, seq_over_window, seq_under_window, ack_over_window, ack_under_window, ignored, other) and the Service whose address or endpoint the packet carried (empty when none). Not every INVALID packet is logged and some logged ones (ignored) are not counted INVALID: proxyhealth_conntrack_invalid_packets_total stays the total.", "reason", "service_namespace", "service_name")
	invalidUnlistedDesc   = metricdesc.New("conntrack", "invalid_reason_packets_unlisted_total", "With --conntrack.invalid-reasons: logged INVALID packets of Services left out of proxyhealth_conntrack_invalid_reason_packets_total by --conntrack.max-service-series, by reason.", "reason")
	invalidLostDesc       = metricdesc.New("conntrack", "invalid_reason_packets_lost_total", "With --conntrack.invalid-reasons: logged INVALID packets that never reached the exporter (gaps in the log's sequence numbers: the socket's buffer was full) or could not be decoded.")
	invalidListenedDesc   = metricdesc.New("conntrack", "invalid_log_listened_seconds_total", "With --conntrack.invalid-reasons: seconds NFLOG group 0 was bound and read. Its rate is the share of the time the INVALID log's counts cover: 1 while every packet is read, less while the log runs above --conntrack.invalid-reasons.max-rate and is read in windows.")
	invalidSamplingDesc   = metricdesc.New("conntrack", "invalid_log_sampling", "With --conntrack.invalid-reasons: 1 while conntrack's INVALID log runs above --conntrack.invalid-reasons.max-rate and is read in windows (its counts are a sample), 0 while every packet is read.")
	invalidForeignDesc    = metricdesc.New("conntrack", "invalid_log_foreign_messages_total", "With --conntrack.invalid-reasons: messages read from NFLOG group 0 that are not conntrack's INVALID log (no nf_ct_proto_N prefix: an NFLOG rule without --nflog-group, a conntrack helper's drop), counted here and in no INVALID series.")
	servicesKnownDesc     = metricdesc.New("conntrack", "service_ports_known", "Service addresses (cluster IP, port, protocol) the exporter can attribute flows to, from its API view or, without a synced one, from kube-proxy's KUBE-SERVICES rules; 0 means every flow is no_service.")
)

// Describe sends every descriptor Update may use.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{entriesDesc, entriesLimitDesc, eventsDesc, eventsLostDesc, receiveErrorsDesc,
		resyncsDesc, untrackedDesc, trackedDesc, unrepliedDesc, openUnrepliedDesc, unrepliedUnlistedDesc,
		openUnlistedDesc, servicesKnownDesc, tcpBeLiberalDesc, eventsSettingDesc, invalidReasonDesc, invalidUnlistedDesc,
		invalidLostDesc, invalidForeignDesc, invalidListenedDesc, invalidSamplingDesc} {
		ch <- d
	}
	for _, d := range cpuStatDescs {
		ch <- d.desc
	}
}

// Update reads the kernel's statistics and conntrack's settings, and publishes the event
// listener's counters and the tracked flows. It fails when the statistics or the settings
// cannot be read or the listener is not running.
func (c *Collector) Update(ch chan<- prometheus.Metric) error {
	var errs []error
	if err := c.updateSettings(ch); err != nil {
		errs = append(errs, err)
	}
	if st, err := c.stats(); err != nil {
		errs = append(errs, err)
	} else {
		// entries and entries_limit overlap node_exporter's too.
		if c.cfg.TableStats {
			ch <- prometheus.MustNewConstMetric(entriesDesc, prometheus.GaugeValue, float64(st.entries))
			ch <- prometheus.MustNewConstMetric(entriesLimitDesc, prometheus.GaugeValue, float64(st.limit))
		}
		for _, d := range cpuStatDescs {
			if d.nodeExporterOverlap && !c.cfg.TableStats {
				continue
			}
			ch <- prometheus.MustNewConstMetric(d.desc, prometheus.CounterValue, float64(d.value(&st.cpu)))
		}
	}

	for t := eventNew; t <= eventDestroy; t++ {
		ch <- prometheus.MustNewConstMetric(eventsDesc, prometheus.CounterValue, float64(c.events[t].Load()), t.String())
	}
	c.mu.Lock()
	lost := c.lostBase
	if c.sock != nil {
		if d, err := c.sock.drops(); err == nil {
			lost += uint64(d)
		} else {
			errs = append(errs, err)
		}
	}
	listenErr := c.listenErr
	c.mu.Unlock()
	if listenErr != nil {
		errs = append(errs, listenErr)
	}
	ch <- prometheus.MustNewConstMetric(eventsLostDesc, prometheus.CounterValue, float64(lost))
	ch <- prometheus.MustNewConstMetric(receiveErrorsDesc, prometheus.CounterValue, float64(c.receiveErrors.Load()))
	ch <- prometheus.MustNewConstMetric(resyncsDesc, prometheus.CounterValue, float64(c.resyncs.Load()))

	if c.invalid != nil {
		if err := c.updateInvalid(ch); err != nil {
			errs = append(errs, err)
		}
	}

	view := c.view.Load()
	ch <- prometheus.MustNewConstMetric(servicesKnownDesc, prometheus.GaugeValue, float64(view.services.Len()))
	now := c.now()
	c.tracker.prune(now, view)
	snap := c.tracker.snapshot(now.Add(-c.cfg.UnrepliedAfter).UnixNano(), view)
	ch <- prometheus.MustNewConstMetric(trackedDesc, prometheus.GaugeValue, float64(snap.tracked))
	ch <- prometheus.MustNewConstMetric(untrackedDesc, prometheus.CounterValue, float64(snap.untracked))
	for _, s := range snap.unreplied {
		ch <- prometheus.MustNewConstMetric(unrepliedDesc, prometheus.CounterValue, float64(s.value), s.key.labels()...)
	}
	for _, s := range snap.open {
		ch <- prometheus.MustNewConstMetric(openUnrepliedDesc, prometheus.GaugeValue, float64(s.value), s.key.labels()...)
	}
	for _, s := range snap.unlisted {
		ch <- prometheus.MustNewConstMetric(unrepliedUnlistedDesc, prometheus.CounterValue, float64(s.value), protocolName(s.key.proto), s.key.reason.String())
	}
	for _, s := range snap.openUnlisted {
		ch <- prometheus.MustNewConstMetric(openUnlistedDesc, prometheus.GaugeValue, float64(s.value), protocolName(s.key.proto), s.key.reason.String())
	}
	return errors.Join(errs...)
}

// updateInvalid sends the INVALID log's counters, and why it is not running, if it is not.
func (c *Collector) updateInvalid(ch chan<- prometheus.Metric) error {
	s := c.invalid.snapshot()
	for k, v := range s.counts {
		ch <- prometheus.MustNewConstMetric(invalidReasonDesc, prometheus.CounterValue, float64(v), k.reason.String(), k.namespace, k.name)
	}
	for r, v := range s.unlisted {
		if v > 0 {
			ch <- prometheus.MustNewConstMetric(invalidUnlistedDesc, prometheus.CounterValue, float64(v), invalidReason(r).String())
		}
	}
	ch <- prometheus.MustNewConstMetric(invalidLostDesc, prometheus.CounterValue, float64(s.lost))
	ch <- prometheus.MustNewConstMetric(invalidForeignDesc, prometheus.CounterValue, float64(s.foreign))
	ch <- prometheus.MustNewConstMetric(invalidListenedDesc, prometheus.CounterValue, s.listened.Seconds())
	sampling := 0.0
	if s.sampling {
		sampling = 1
	}
	ch <- prometheus.MustNewConstMetric(invalidSamplingDesc, prometheus.GaugeValue, sampling)
	return s.err
}

func (k seriesKey) labels() []string {
	port := ""
	if k.svc.Port != 0 {
		port = strconv.Itoa(int(k.svc.Port))
	}
	return []string{k.svc.Namespace, k.svc.Name, port, protocolName(k.proto), k.reason.String()}
}

// updateSettings sends conntrack's settings as the kernel has them now.
func (c *Collector) updateSettings(ch chan<- prometheus.Metric) error {
	var (
		errs    []error
		missing []string
	)
	for _, s := range []struct {
		desc *prometheus.Desc
		path string
	}{
		{tcpBeLiberalDesc, sysctl.ConntrackTCPBeLiberal},
		{eventsSettingDesc, sysctl.ConntrackEvents},
	} {
		v, exists, err := sysctl.ReadInt(filepath.Join(c.cfg.ProcPath, s.path))
		switch {
		case err != nil:
			errs = append(errs, err)
		case !exists:
			missing = append(missing, filepath.Base(s.path))
		default:
			ch <- prometheus.MustNewConstMetric(s.desc, prometheus.GaugeValue, float64(v))
		}
	}
	if len(missing) > 0 {
		errs = append(errs, fmt.Errorf("conntrack sysctls not found under %s (%s): is nf_conntrack loaded?",
			filepath.Join(c.cfg.ProcPath, sysctl.NetfilterDir), strings.Join(missing, ", ")))
	}
	return errors.Join(errs...)
}
