package exporter

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ticonntrack "github.com/ti-mo/conntrack"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyhealth/proxyhealth/collectors/conntrack"
	"github.com/proxyhealth/proxyhealth/internal/cluster"
	"github.com/proxyhealth/proxyhealth/internal/hostrules"
	"github.com/proxyhealth/proxyhealth/internal/iptlegacy"
	"github.com/proxyhealth/proxyhealth/internal/nftnl"
	"github.com/proxyhealth/proxyhealth/internal/ruleset"
	"github.com/proxyhealth/proxyhealth/internal/testsupport/fixture"
)

// The fixtures the golden scrape reads instead of a node, a kernel and an API server. Captures
// are read where they already are, beside the tests of the collector they belong to.
const (
	procFixture        = "../collectors/node/testdata/proc-full"
	rulesCaptureDir    = "../collectors/rules/testdata/kube-proxy-v1.36.3/"
	nftRulesCaptureDir = "../collectors/rules/testdata/kube-proxy-v1.36.3-nftables/"
	// The kernel's answers to the exporter's netfilter readers, recorded by their kernel tests
	// with the captures loaded: nftnl's netlink replies, iptlegacy's tables.
	nftReplays       = "../internal/nftnl/testdata/"
	legacyRecordings = "../internal/iptlegacy/testdata/"
	kubeProxyDataDir = "../collectors/kubeproxy/testdata/"
)

// fixedClock is every collector's clock: it stands still until the test moves it.
type fixedClock struct{ ns atomic.Int64 }

func (c *fixedClock) set(t time.Time) { c.ns.Store(t.UnixNano()) }
func (c *fixedClock) now() time.Time  { return time.Unix(0, c.ns.Load()).UTC() }

// goldenAPIView is the exporter's API view: the API objects kube-proxy v1.36.3 programmed the
// rules captured in captureDir from, changed since by what kube-proxy missed while its watches were dead
// (incident 3): lab/backend's pod 10.244.3.3 was deleted and two pods were added, and
// kube-dns's pod on node-b, 10.244.3.30, was deleted. The view is synced and heard from the
// API server 5 s before the scrape.
func goldenAPIView(t *testing.T, captureDir string, heard time.Time) fixture.View {
	t.Helper()
	objs, err := fixture.ReadAPIObjects(captureDir + "api-objects.json")
	if err != nil {
		t.Fatal(err)
	}
	changed := 0
	for i := range objs.EndpointSlices {
		s := &objs.EndpointSlices[i]
		switch s.Namespace + "/" + s.Labels[discoveryv1.LabelServiceName] {
		case "lab/backend":
			s.Endpoints = deleteEndpoint(t, s.Endpoints, "10.244.3.3")
			for _, ip := range []string{"10.244.3.14", "10.244.3.15"} {
				ep := *s.Endpoints[0].DeepCopy()
				ep.Addresses = []string{ip}
				s.Endpoints = append(s.Endpoints, ep)
			}
			changed++
		case "kube-system/kube-dns":
			s.Endpoints = deleteEndpoint(t, s.Endpoints, "10.244.3.30")
			changed++
		}
	}
	if changed != 2 {
		t.Fatalf("changed %d EndpointSlices of the capture, want lab/backend's and kube-dns's", changed)
	}
	return fixture.View{Snap: &cluster.Snapshot{Ports: objs.Ports(), Synced: true, Fresh: true, LastHeard: heard, Generation: 1}}
}

func deleteEndpoint(t *testing.T, eps []discoveryv1.Endpoint, ip string) []discoveryv1.Endpoint {
	t.Helper()
	out := slices.DeleteFunc(eps, func(e discoveryv1.Endpoint) bool { return slices.Contains(e.Addresses, ip) })
	if len(out) != len(eps)-1 {
		t.Fatalf("endpoint %s not in the capture", ip)
	}
	return out
}

// goldenRules is the node's netfilter state as internal/hostrules would have read it once.
type goldenRules struct{ st *hostrules.State }

func (g goldenRules) State() *hostrules.State    { return g.st }
func (g goldenRules) Subscribe() <-chan struct{} { return make(chan struct{}) }

// nodeRules is the node's netfilter state, read at at, with kube-proxy in iptables mode with
// the iptables-nft backend, decoded from the kernel's recorded answers by the readers the
// exporter runs (internal/nftnl, internal/iptlegacy): kube-proxy's real v1.36.3 nat table
// (the recording of rulesCaptureDir's iptables-save-nat.txt loaded by iptables-nft), and the
// forward path: kube-proxy's filter table in iptables-nft (its KUBE-FORWARD drop, with
// nfacct), an empty legacy filter table, and no native nftables forward chain.
func nodeRules(t *testing.T, at time.Time) goldenRules {
	t.Helper()
	table := replayProxyTable(t, nftReplays+"kube-proxy-v1.36.3-nat.replay.json", "nat")
	viaNFT, native := replayForward(t, nftReplays+"graph-iptables-iptables-nft-save-kube-proxy.replay.json")
	legacy := recordedLegacyFilter(t, legacyRecordings+"node-legacy-empty.filter.blob")
	if legacy.InvalidDropPath() != nil || viaNFT.InvalidDropPath() == nil || len(native) != 0 {
		t.Fatal("INVALID drop paths: want only kube-proxy's, in iptables-nft")
	}
	return goldenRules{&hostrules.State{At: at, Seq: 1, Mode: hostrules.ModeIPTables, Backend: hostrules.BackendIPTablesNFT,
		Proxy: map[bool]*ruleset.ProxyTable{false: table},
		Forward: []hostrules.Forward{
			{Backend: hostrules.BackendLegacy, Graphs: []*ruleset.Graph{legacy}},
			{Backend: hostrules.BackendIPTablesNFT, Graphs: []*ruleset.Graph{viaNFT}},
			{Backend: hostrules.BackendNFTables},
		}}}
}

// nftNodeRules is the node's netfilter state, read at at, with kube-proxy in nftables mode,
// decoded as nodeRules' is: its real v1.36.3 table (the recording of nftRulesCaptureDir's table
// loaded by nft), and a forward path without an INVALID drop: an empty legacy filter table, no
// iptables-nft table, and kube-proxy's own forward chain (filter-forward), which drops no
// INVALID packets (kube-proxy's nftables mode adds no such drop).
func nftNodeRules(t *testing.T, at time.Time) goldenRules {
	t.Helper()
	table := replayProxyTable(t, nftReplays+"kube-proxy-v1.36.3-nftables.replay.json", "kube-proxy")
	viaNFT, native := replayForward(t, nftReplays+"graph-nft-kube-proxy-v1.36.3.replay.json")
	empty := recordedLegacyFilter(t, legacyRecordings+"node-legacy-empty.filter.blob")
	if viaNFT != nil || len(native) != 1 || native[0].Name != "ip kube-proxy" {
		t.Fatalf("forward path: iptables-nft %v, native %v; want only kube-proxy's table", viaNFT, native)
	}
	if empty.InvalidDropPath() != nil || native[0].InvalidDropPath() != nil {
		t.Fatal("INVALID drop paths: want none")
	}
	return goldenRules{&hostrules.State{At: at, Seq: 1, Mode: hostrules.ModeNFTables, Backend: hostrules.BackendNFTables,
		Proxy: map[bool]*ruleset.ProxyTable{false: table},
		Forward: []hostrules.Forward{
			{Backend: hostrules.BackendLegacy, Graphs: []*ruleset.Graph{empty}},
			{Backend: hostrules.BackendIPTablesNFT},
			{Backend: hostrules.BackendNFTables, Graphs: native},
		}}}
}

// replayProxyTable is kube-proxy's IPv4 table name (iptables-nft's "nat", or "kube-proxy" of
// nftables mode) as nftnl's Follower reads it whole, from a recording of the kernel's replies.
func replayProxyTable(t *testing.T, recording, name string) *ruleset.ProxyTable {
	t.Helper()
	r, err := nftnl.NewReplay(readFile(t, recording))
	if err != nil {
		t.Fatalf("%s: %v", recording, err)
	}
	table, err := r.ProxyTable(context.Background(), nftnl.Table{Family: unix.NFPROTO_IPV4, Name: name})
	if err != nil || table == nil {
		t.Fatalf("%s: table %v, %v", recording, table, err)
	}
	return table
}

// replayForward is the forward path as nftnl's ForwardReader reads it, from a recording of the
// kernel's replies, split by backend as internal/hostrules splits it: iptables-nft's IPv4
// filter table (nil without one), and the native nftables tables.
func replayForward(t *testing.T, recording string) (viaNFT *ruleset.Graph, native []*ruleset.Graph) {
	t.Helper()
	r, err := nftnl.NewReplay(readFile(t, recording))
	if err != nil {
		t.Fatalf("%s: %v", recording, err)
	}
	graphs, err := r.Forward(context.Background())
	if err != nil {
		t.Fatalf("%s: %v", recording, err)
	}
	for _, g := range graphs {
		switch g.Name {
		case "iptables-nft filter":
			viaNFT = g
		case "ip6tables-nft filter":
		default:
			native = append(native, g)
		}
	}
	return viaNFT, native
}

// recordedLegacyFilter is an IPv4 legacy filter table as internal/iptlegacy decodes it, from a
// recording of the kernel's answer.
func recordedLegacyFilter(t *testing.T, recording string) *ruleset.Graph {
	t.Helper()
	g, err := iptlegacy.DecodeRecordedFilter(readFile(t, recording), false)
	if err != nil {
		t.Fatalf("%s: %v", recording, err)
	}
	return g
}

func readFile(t *testing.T, file string) []byte {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// kubeProxy serves kube-proxy's endpoints on loopback as they answered in the lab while its API
// connection was dead: its metrics (last sync before the failure) and a healthy /livez.
func kubeProxy(t *testing.T) *httptest.Server {
	t.Helper()
	metrics, err := os.ReadFile(kubeProxyDataDir + "kube-proxy-v1.36.3-metrics-stale.txt")
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		w.Write(metrics)
	})
	mux.HandleFunc("/livez", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "ok") })
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

// kubeProxyLog is a kube-proxy pod log under a fixture /var/log/pods: pattern is its
// --kubeproxy.log-path glob. The file starts empty; write appends the real reflector failures
// (cri.log: kube-proxy v1.36.3's watches failing, as the container runtime writes them).
func kubeProxyLog(t *testing.T) (pattern string, write func() (lines int)) {
	t.Helper()
	root := t.TempDir()
	dir := filepath.Join(root, "var/log/pods/kube-system_kube-proxy-x7k2p_6f1c2a80-2a35-4c52-9d7e-3f1f4bd3c1a0/kube-proxy")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "0.log")
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	lines, err := os.ReadFile(kubeProxyDataDir + "cri.log")
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, "var/log/pods/kube-system_kube-proxy-*/kube-proxy/*.log"), func() int {
		f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.Write(lines); err != nil {
			t.Fatal(err)
		}
		return bytes.Count(lines, []byte("\n"))
	}
}

// conntrackKernel is the kernel as the conntrack collector sees it: the per-CPU statistics, the
// table and the events of testdata/conntrack-*.txt, and the node's network: eth0 172.18.0.2 and
// the pod bridge cni0 10.244.1.1/24 (the prefixes conntrack's localNet reads from them). The
// events wait until release is called.
type conntrackKernel struct {
	stats  []ticonntrack.Stats
	global ticonntrack.StatsGlobal
	table  [][]byte
	events *eventStream
	// invalid is conntrack's INVALID log (invalidLogFixture), released with the events.
	invalid *eventStream
}

func newConntrackKernel(t *testing.T) *conntrackKernel {
	t.Helper()
	open := func(file string) *os.File {
		f, err := os.Open(file)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	k := &conntrackKernel{events: &eventStream{release: make(chan struct{}), delivered: make(chan struct{}), closed: make(chan struct{})}}
	var err error
	if k.stats, err = fixture.ConntrackStats(open("testdata/conntrack-stats.txt")); err != nil {
		t.Fatal(err)
	}
	if k.table, err = fixture.ConntrackMessages(open("testdata/conntrack-table.txt")); err != nil {
		t.Fatal(err)
	}
	if k.events.msgs, err = fixture.ConntrackMessages(open("testdata/conntrack-events.txt")); err != nil {
		t.Fatal(err)
	}
	limit, err := os.ReadFile(procFixture + "/sys/net/netfilter/nf_conntrack_max")
	if err != nil {
		t.Fatal(err)
	}
	max, err := strconv.ParseUint(strings.TrimSpace(string(limit)), 10, 32)
	if err != nil {
		t.Fatal(err)
	}
	k.global = ticonntrack.StatsGlobal{Entries: uint32(len(k.table)), MaxEntries: uint32(max)}
	return k
}

func (k *conntrackKernel) Stats() ([]ticonntrack.Stats, ticonntrack.StatsGlobal, error) {
	return k.stats, k.global, nil
}

func (k *conntrackKernel) Subscribe(int) (conntrack.EventStream, error) {
	if !k.events.subscribed.CompareAndSwap(false, true) {
		return nil, errors.New("the fixture serves one subscription")
	}
	return k.events, nil
}

func (k *conntrackKernel) LogInvalid(int) (conntrack.EventStream, error) {
	if k.invalid == nil || !k.invalid.subscribed.CompareAndSwap(false, true) {
		return nil, errors.New("the fixture serves one INVALID log reader")
	}
	return k.invalid, nil
}

func (k *conntrackKernel) Dump(fn func([]byte) error) error {
	for _, m := range k.table {
		if err := fn(m); err != nil {
			return err
		}
	}
	return nil
}

func (k *conntrackKernel) LocalNetwork() (bridges, local []netip.Prefix, err error) {
	cni0 := netip.MustParsePrefix("10.244.1.0/24")
	return []netip.Prefix{cni0}, []netip.Prefix{
		netip.MustParsePrefix("172.18.0.2/32"), netip.MustParsePrefix("10.244.1.1/32"), cni0,
	}, nil
}

// release lets the events flow and waits until every one has been handled.
func (k *conntrackKernel) release(t *testing.T) {
	t.Helper()
	close(k.events.release)
	select {
	case <-k.events.delivered:
	case <-time.After(10 * time.Second):
		t.Fatal("the conntrack events were not received")
	}
	if k.invalid != nil {
		select {
		case <-k.invalid.delivered:
		case <-time.After(10 * time.Second):
			t.Fatal("conntrack's INVALID log was not received")
		}
	}
}

// eventStream delivers its messages once released, and then waits for Close.
type eventStream struct {
	msgs       [][]byte
	subscribed atomic.Bool
	release    chan struct{}
	delivered  chan struct{}
	closed     chan struct{}
	once       sync.Once
}

func (s *eventStream) Receive(fn func([]byte) error) error {
	select {
	case <-s.release:
	case <-s.closed:
		return errors.New("closed")
	}
	for _, m := range s.msgs {
		if err := fn(m); err != nil {
			return err
		}
	}
	close(s.delivered)
	<-s.closed
	return errors.New("closed")
}

func (s *eventStream) Drops() (uint32, error) { return 0, nil }
func (s *eventStream) Close() error           { s.once.Do(func() { close(s.closed) }); return nil }

// invalidLogFixture is conntrack's INVALID log as nfnetlink_log sends it on NFLOG group 0,
// delivered with the conntrack events (release):
// a SYN+FIN from a pod to lab/backend's cluster IP, an out-of-window segment from its first
// endpoint back to the pod (incident 2), a TCP segment that would open a flow to kube-dns
// without a SYN (a third Service: over --conntrack.max-service-series=2), and a UDP datagram
// with a bad checksum to no Service. The log's sequence numbers skip one: a lost packet.
func invalidLogFixture(t *testing.T, snap *cluster.Snapshot, release chan struct{}) *eventStream {
	t.Helper()
	var backend netip.AddrPort
	for _, p := range snap.Ports {
		if p.Name.Namespace == "lab" && p.Name.Name == "backend" && len(p.ClusterEndpoints) > 0 {
			backend = p.ClusterEndpoints[0]
		}
	}
	if !backend.IsValid() {
		t.Fatal("no endpoint of lab/backend in the API view")
	}
	pod := netip.MustParseAddr("10.244.1.5")
	msgs := [][]byte{
		nflogPacket("nf_ct_proto_6: invalid tcp flag combination ", 6, netip.AddrPortFrom(pod, 41000), netip.MustParseAddrPort("10.96.0.50:80"), 0),
		nflogPacket("nf_ct_proto_6: SEQ is over upper bound 2296793663 (over the window of the receiver) ", 6, backend, netip.AddrPortFrom(pod, 41001), 1),
		nflogPacket("nf_ct_proto_6: invalid new ", 6, netip.AddrPortFrom(pod, 41002), netip.MustParseAddrPort("10.96.0.10:53"), 3),
		nflogPacket("nf_ct_proto_17: bad checksum ", 17, netip.AddrPortFrom(pod, 41003), netip.MustParseAddrPort("10.244.9.9:9"), 4),
	}
	return &eventStream{msgs: msgs, release: release, delivered: make(chan struct{}), closed: make(chan struct{})}
}

// nflogPacket is one NFLOG packet message (NFULNL_MSG_PACKET) of an IPv4 packet from src to
// dst: the prefix, the IP and transport headers, and the log's sequence number.
func nflogPacket(prefix string, proto uint8, src, dst netip.AddrPort, seq uint32) []byte {
	pkt := make([]byte, 24)
	pkt[0] = 0x45
	pkt[9] = proto
	copy(pkt[12:16], src.Addr().AsSlice())
	copy(pkt[16:20], dst.Addr().AsSlice())
	binary.BigEndian.PutUint16(pkt[20:22], src.Port())
	binary.BigEndian.PutUint16(pkt[22:24], dst.Port())
	attr := func(b []byte, typ uint16, v []byte) []byte {
		b = binary.NativeEndian.AppendUint16(b, uint16(4+len(v)))
		b = binary.NativeEndian.AppendUint16(b, typ)
		b = append(b, v...)
		for len(b)%4 != 0 {
			b = append(b, 0)
		}
		return b
	}
	const nfulaPayload, nfulaPrefix, nfulaSeq = 9, 10, 12
	b := make([]byte, 20)
	binary.NativeEndian.PutUint16(b[4:6], 4<<8) // NFNL_SUBSYS_ULOG, NFULNL_MSG_PACKET
	b[16] = 2                                   // AF_INET
	b = attr(b, nfulaPrefix, append([]byte(prefix), 0))
	b = attr(b, nfulaPayload, pkt)
	b = attr(b, nfulaSeq, binary.BigEndian.AppendUint32(nil, seq))
	binary.NativeEndian.PutUint32(b[0:4], uint32(len(b)))
	return b
}

// goldenProcfs is procFixture copied, with conntrack's log settings as a node has them
// before --conntrack.invalid-reasons sets them (the collector writes them).
func goldenProcfs(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.CopyFS(dir, os.DirFS(procFixture)); err != nil {
		t.Fatal(err)
	}
	nf := filepath.Join(dir, "sys", "net", "netfilter")
	if err := os.MkdirAll(filepath.Join(nf, "nf_log"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, v := range map[string]string{"nf_conntrack_log_invalid": "0\n", "nf_log/2": "NONE\n", "nf_log/10": "NONE\n"} {
		if err := os.WriteFile(filepath.Join(nf, name), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// acceptingAPI is an API server that has the Node and Service asked for and accepts every
// patch and Event: the node condition publisher's golden series.
type acceptingAPI struct{}

func (acceptingAPI) GetNode(_ context.Context, name string) (*corev1.Node, error) {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, nil
}

func (acceptingAPI) PatchNodeStatus(context.Context, string, []byte) error { return nil }

func (acceptingAPI) GetService(_ context.Context, namespace, name string) (*corev1.Service, error) {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}, nil
}

func (acceptingAPI) CreateEvent(context.Context, *corev1.Event) error { return nil }

func (acceptingAPI) UpdateConfigMap(context.Context, *corev1.ConfigMap) error { return nil }

func (acceptingAPI) CreateConfigMap(context.Context, *corev1.ConfigMap) error { return nil }
