//go:build e2e

package e2e

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"

	"github.com/proxyhealth/proxyhealth/internal/testsupport/netnsdial"
	"github.com/proxyhealth/proxyhealth/internal/testsupport/prereq"
	"github.com/proxyhealth/proxyhealth/test/kubelab"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// The control plane's fixed addresses, all on the node namespace's loopback. The namespace is
// created by the test, so every port is free by construction.
const (
	etcdClientAddr   = "127.0.0.1:2379"
	etcdPeerAddr     = "127.0.0.1:2380"
	apiserverAddr    = "127.0.0.1:6443"
	faultProxyAddr   = "127.0.0.1:6444" // kube-proxy's way to the apiserver
	faultControlAddr = "127.0.0.1:6445" // the fault proxy's commands
	kubeProxyMetrics = "127.0.0.1:10249"
	kubeProxyHealthz = "127.0.0.1:10256"

	serviceCIDR = "10.96.0.0/16"
	clusterCIDR = "10.244.0.0/16"
	labNodeName = "lab-node"
	labNodeZone = "zone-a"
)

// The dual-stack lab's IPv6 ranges and node address (ControlPlaneOptions.DualStack): the
// apiserver takes an IPv6 service range of at most 2^20 addresses; kube-proxy takes a node
// address of each family from the Node object.
const (
	serviceCIDR6 = "fd00:10:96::/112"
	clusterCIDR6 = "fd00:10:244::/56"
	uplinkN6     = "fd00:172:18::2"
)

// requireKubeEnv makes a missing control plane a failure instead of a skip (CI sets it).
const requireKubeEnv = "PROXYHEALTH_REQUIRE_KUBE"

// findKube locates the control plane's binaries, or says what is missing and how to get it.
func findKube() (kubelab.Binaries, error) {
	root, err := repoRoot()
	if err != nil {
		return kubelab.Binaries{}, err
	}
	return kubelab.FindBinaries(root)
}

// requireKube skips (or, with PROXYHEALTH_REQUIRE_KUBE set, fails) when the control plane's
// binaries are missing.
func requireKube(t *testing.T) kubelab.Binaries {
	t.Helper()
	requireLab(t)
	b, err := findKube()
	if err != nil {
		if os.Getenv(requireKubeEnv) != "" {
			t.Fatalf("control-plane lab: %v (%s is set)", err, requireKubeEnv)
		}
		prereq.Skipf(t, "control-plane lab: %v", err)
	}
	return b
}

// ControlPlane is a real etcd, kube-apiserver and (optionally) kube-proxy in a lab's node
// namespace, with a fault proxy between kube-proxy and the apiserver. Every process is stopped
// by pid in cleanup, before the lab's namespaces go.
type ControlPlane struct {
	t    *testing.T
	Lab  *Lab
	Bins kubelab.Binaries
	Dir  string // certificates, tokens, kubeconfigs, etcd data

	// Client is an admin client (system:masters) that talks to the apiserver directly, from
	// the test process, through sockets opened in the node namespace (nsDialer).
	Client kubernetes.Interface
	// AdminKubeconfig and ProxyKubeconfig are kubeconfig files for processes started inside
	// the node namespace: admin straight to the apiserver; kube-proxy's user through the fault
	// proxy.
	AdminKubeconfig, ProxyKubeconfig string
	AdminToken, ProxyToken           string

	Etcd, APIServer, FaultProxy, KubeProxy *proc

	// DualStack is ControlPlaneOptions.DualStack.
	DualStack bool
}

// ControlPlaneOptions shape StartControlPlane.
type ControlPlaneOptions struct {
	// NoKubeProxy leaves kube-proxy out; start it later with StartKubeProxy.
	NoKubeProxy bool
	// KubeProxy options; see StartKubeProxy.
	KubeProxy KubeProxyOptions
	// DualStack gives the cluster both IP families: service and cluster ranges of each, and a
	// Node with an InternalIP and a pod range of each, so kube-proxy programs both.
	DualStack bool
	// AdmissionPolicies turns the ValidatingAdmissionPolicy admission plugin on, which the lab
	// otherwise leaves off with the other plugins it does not need.
	AdmissionPolicies bool
}

// StartControlPlane starts etcd and kube-apiserver in l's node namespace, waits for /readyz,
// creates the lab's Node object (InternalIP uplinkN, zone label) and, unless told otherwise,
// starts the fault proxy and kube-proxy and waits for kube-proxy's first sync.
func StartControlPlane(t *testing.T, l *Lab, opts ControlPlaneOptions) *ControlPlane {
	t.Helper()
	bins := requireKube(t)
	start := time.Now()
	cp := &ControlPlane{t: t, Lab: l, Bins: bins, Dir: t.TempDir(), DualStack: opts.DualStack}
	cp.AdminToken, cp.ProxyToken = randomToken(t), randomToken(t)
	cp.writeCredentials()

	cp.Etcd = l.Start(l.Node, "etcd", bins.Etcd,
		"--name", "lab",
		"--data-dir", filepath.Join(cp.Dir, "etcd"),
		"--listen-client-urls", "http://"+etcdClientAddr,
		"--advertise-client-urls", "http://"+etcdClientAddr,
		"--listen-peer-urls", "http://"+etcdPeerAddr,
		"--initial-advertise-peer-urls", "http://"+etcdPeerAddr,
		"--initial-cluster", "lab=http://"+etcdPeerAddr,
		"--heartbeat-interval", "50",
		"--election-timeout", "500",
		"--snapshot-count", "100000",
		"--log-level", "warn",
		"--logger", "zap",
	)

	cp.APIServer = l.Start(l.Node, "kube-apiserver", bins.APIServer,
		"--etcd-servers", "http://"+etcdClientAddr,
		"--bind-address", "127.0.0.1",
		"--secure-port", strings.Split(apiserverAddr, ":")[1],
		// The node namespace has no default route to pick an address from; the uplink is what
		// the kubernetes Service's endpoint then points at.
		"--advertise-address", uplinkN,
		"--cert-dir", filepath.Join(cp.Dir, "apiserver-certs"),
		"--token-auth-file", filepath.Join(cp.Dir, "tokens.csv"),
		"--service-account-key-file", filepath.Join(cp.Dir, "sa.pub"),
		"--service-account-signing-key-file", filepath.Join(cp.Dir, "sa.key"),
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--authorization-mode", "RBAC",
		"--service-cluster-ip-range", cp.cidrs(serviceCIDR, serviceCIDR6),
		"--enable-priority-and-fairness=false",
		"--disable-admission-plugins", disabledAdmissionPlugins(opts),
		"--profiling=false",
		"--v", "1",
	)

	cfg := &rest.Config{
		Host:            "https://" + apiserverAddr,
		BearerToken:     cp.AdminToken,
		TLSClientConfig: rest.TLSClientConfig{Insecure: true},
		Dial:            netnsdial.Dialer(l.Node),
		QPS:             100,
		Burst:           200,
		Timeout:         10 * time.Second * waitScale,
		// Deprecation warnings are expected (the lab writes old shapes on purpose).
		WarningHandler: rest.NoWarnings{},
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cp.Client = client

	waitFor(t, 90*time.Second, "kube-apiserver /readyz", func() (bool, string) {
		if cp.APIServer.Exited() || cp.Etcd.Exited() {
			t.Fatalf("etcd or kube-apiserver exited during startup")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second*waitScale)
		defer cancel()
		body, err := client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err != nil {
			return false, fmt.Sprintf("%v: %s", err, body)
		}
		return true, ""
	})
	// The system namespaces come from a controller that runs after readyz can pass.
	waitFor(t, 30*time.Second, "namespaces default and kube-system", func() (bool, string) {
		for _, ns := range []string{"default", "kube-system"} {
			if _, err := client.CoreV1().Namespaces().Get(context.Background(), ns, metav1.GetOptions{}); err != nil {
				return false, err.Error()
			}
		}
		return true, ""
	})
	cp.createNode()
	if cp.DualStack {
		// kube-proxy programs IPv6 only where the kernel has it on (it reads
		// net.ipv6.conf.all.disable_ipv6); the lab turned it off in every namespace. The node
		// namespace gets it back, with the Node's IPv6 address on its uplink.
		l.MustExec(l.Node, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=0", "net.ipv6.conf.default.disable_ipv6=0")
		l.ip(l.Node, "addr", "add", uplinkN6+"/64", "dev", "eth1", "nodad")
	}
	t.Logf("control plane (etcd, kube-apiserver) ready in %s", time.Since(start).Round(time.Millisecond))

	cp.FaultProxy = l.Start(l.Node, "fault-proxy", labtoolBin, "fault-proxy", faultProxyAddr,
		"--to", apiserverAddr, "--control", faultControlAddr)
	waitFor(t, 5*time.Second, "fault proxy ready", func() (bool, string) {
		b, _ := os.ReadFile(cp.FaultProxy.log)
		return strings.Contains(string(b), "ready"), string(b)
	})

	if !opts.NoKubeProxy {
		cp.StartKubeProxy(opts.KubeProxy)
	}
	return cp
}

// disabledAdmissionPlugins are the admission plugins the lab turns off: those it does not need,
// but ValidatingAdmissionPolicy where opts ask for it.
func disabledAdmissionPlugins(opts ControlPlaneOptions) string {
	plugins := []string{"ServiceAccount", "MutatingAdmissionWebhook", "ValidatingAdmissionWebhook", "ValidatingAdmissionPolicy",
		"MutatingAdmissionPolicy", "ResourceQuota", "LimitRanger", "StorageObjectInUseProtection", "PersistentVolumeClaimResize",
		"RuntimeClass", "DefaultIngressClass"}
	if opts.AdmissionPolicies {
		plugins = slices.DeleteFunc(plugins, func(p string) bool { return p == "ValidatingAdmissionPolicy" })
	}
	return strings.Join(plugins, ",")
}

// cidrs is the IPv4 range alone, or both ranges (IPv4 first) for a dual-stack lab.
func (cp *ControlPlane) cidrs(v4, v6 string) string {
	if cp.DualStack {
		return v4 + "," + v6
	}
	return v4
}

func randomToken(t *testing.T) string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b[:])
}

// writeCredentials writes the token file (admin in system:masters; kube-proxy as
// system:kube-proxy, which the apiserver's bootstrap policy binds to the ClusterRole
// system:node-proxier), the service-account key pair and both kubeconfigs.
func (cp *ControlPlane) writeCredentials() {
	t := cp.t
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(cp.Dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	write("tokens.csv", fmt.Sprintf("%s,admin,admin,\"system:masters\"\n%s,system:kube-proxy,kube-proxy,\n",
		cp.AdminToken, cp.ProxyToken), 0o600)

	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	write("sa.key", string(pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})), 0o600)
	write("sa.pub", string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub})), 0o644)

	cp.AdminKubeconfig = write("admin.kubeconfig", kubelab.KubeconfigYAML(apiserverAddr, "admin", cp.AdminToken), 0o600)
	cp.ProxyKubeconfig = write("kube-proxy.kubeconfig", kubelab.KubeconfigYAML(faultProxyAddr, "kube-proxy", cp.ProxyToken), 0o600)
}

// createNode creates the lab's Node with an InternalIP in its status (kube-proxy waits for it)
// and a zone label (topology hints).
func (cp *ControlPlane) createNode() {
	t := cp.t
	ctx := context.Background()
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: labNodeName, Labels: map[string]string{
			"kubernetes.io/hostname":        labNodeName,
			"kubernetes.io/os":              "linux",
			"topology.kubernetes.io/zone":   labNodeZone,
			"topology.kubernetes.io/region": "lab",
		}},
		Spec: corev1.NodeSpec{PodCIDR: "10.244.1.0/24", PodCIDRs: []string{"10.244.1.0/24"}},
	}
	if cp.DualStack {
		node.Spec.PodCIDRs = append(node.Spec.PodCIDRs, "fd00:10:244:1::/64")
	}
	created, err := cp.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating node: %v", err)
	}
	created.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: uplinkN}}
	if cp.DualStack {
		created.Status.Addresses = append(created.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: uplinkN6})
	}
	created.Status.Addresses = append(created.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeHostName, Address: labNodeName})
	created.Status.Conditions = []corev1.NodeCondition{{
		Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "Lab",
		LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now(),
	}}
	if _, err := cp.Client.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("setting node status: %v", err)
	}
}

// KubeProxyOptions shape StartKubeProxy.
type KubeProxyOptions struct {
	// DefaultHTTP2Timeouts keeps client-go's HTTP/2 health check at its defaults (a PING after
	// 30 s without a frame, connection dropped 15 s later). By default the lab shortens them to
	// 5 s and 3 s (HTTP2_READ_IDLE_TIMEOUT_SECONDS, HTTP2_PING_TIMEOUT_SECONDS), so a dead
	// connection is noticed in about 8 s instead of 45 s; the failure is the same.
	DefaultHTTP2Timeouts bool
	// Mode is the proxy mode; "" is iptables.
	Mode string
	// IPTablesBackend is the iptables backend kube-proxy writes with in iptables mode:
	// "legacy", or "" for the node's default (iptables-nft here).
	IPTablesBackend string
	// ExtraArgs are appended to kube-proxy's command line.
	ExtraArgs []string
	// ToolsFirst is a directory put first on kube-proxy's PATH: wrappers of the tools it runs
	// (iptables-restore, nft) that the lab makes fail.
	ToolsFirst string
	// NoWaitFirstSync returns once kube-proxy is started, without waiting for its first sync
	// (which a failing tool never lets happen).
	NoWaitFirstSync bool
}

// StartKubeProxy starts kube-proxy in the node namespace, connected through the fault proxy,
// and waits until it has programmed the default/kubernetes Service (its first sync).
func (cp *ControlPlane) StartKubeProxy(opts KubeProxyOptions) {
	t := cp.t
	mode := opts.Mode
	if mode == "" {
		mode = "iptables"
	}
	args := []string{"env"}
	save := "iptables-save"
	path := os.Getenv("PATH")
	if opts.IPTablesBackend != "" {
		shim, err := kubelab.IPTablesShim(cp.Dir, opts.IPTablesBackend)
		if err != nil {
			t.Fatalf("iptables-%s for kube-proxy: %v", opts.IPTablesBackend, err)
		}
		path = shim + ":" + path
		save = "iptables-" + opts.IPTablesBackend + "-save"
	}
	if opts.ToolsFirst != "" {
		path = opts.ToolsFirst + ":" + path
	}
	if path != os.Getenv("PATH") {
		args = append(args, "PATH="+path)
	}
	if !opts.DefaultHTTP2Timeouts {
		args = append(args, "HTTP2_READ_IDLE_TIMEOUT_SECONDS=5", "HTTP2_PING_TIMEOUT_SECONDS=3")
	}
	args = append(args, cp.Bins.Proxy,
		"--kubeconfig", cp.ProxyKubeconfig,
		"--hostname-override", labNodeName,
		"--proxy-mode", mode,
		"--cluster-cidr", cp.cidrs(clusterCIDR, clusterCIDR6),
		// In a non-root network namespace nf_conntrack_max cannot be set; 0 leaves it.
		"--conntrack-max-per-core=0",
		// Leave the lab's short conntrack timers alone.
		"--conntrack-tcp-timeout-established=0",
		"--conntrack-tcp-timeout-close-wait=0",
		"--metrics-bind-address", kubeProxyMetrics,
		"--healthz-bind-address", kubeProxyHealthz,
		// IPVS mode takes its own flags for these, and ignores the iptables ones.
		"--"+syncFlagPrefix(mode)+"-min-sync-period=0",
		"--"+syncFlagPrefix(mode)+"-sync-period=30s",
		"--v", "2",
	)
	args = append(args, opts.ExtraArgs...)
	start := time.Now()
	cp.KubeProxy = cp.Lab.Start(cp.Lab.Node, "kube-proxy", args...)
	if mode == "iptables" && !opts.NoWaitFirstSync {
		want, _ := iptablesServiceChains("default/kubernetes:https", "tcp")
		waitFor(t, 60*time.Second, "kube-proxy's first sync (default/kubernetes programmed)", func() (bool, string) {
			if cp.KubeProxy.Exited() {
				t.Fatalf("kube-proxy exited")
			}
			nat, _ := cp.Lab.Exec(cp.Lab.Node, save, "-t", "nat")
			return strings.Contains(nat, "-j "+want), ""
		})
		t.Logf("kube-proxy programmed its first sync in %s", time.Since(start).Round(time.Millisecond))
	}
	if mode == "ipvs" && !opts.NoWaitFirstSync {
		cp.WaitVirtualServer(60*time.Second, kubernetesVirtualServer, []string{uplinkN + ":6443"})
		t.Logf("kube-proxy programmed its first sync in %s", time.Since(start).Round(time.Millisecond))
	}
}

// syncFlagPrefix is the prefix of kube-proxy's sync period flags in mode: --ipvs-sync-period
// in IPVS mode, --iptables-sync-period in the others.
func syncFlagPrefix(mode string) string {
	if mode == "ipvs" {
		return "ipvs"
	}
	return "iptables"
}

// faultCommand sends a command (blackhole, heal, reset, state) to the fault proxy and returns
// its state line.
func (cp *ControlPlane) faultCommand(cmd string) string {
	t := cp.t
	t.Helper()
	resp, err := netnsdial.HTTPClient(cp.Lab.Node, 5*time.Second*waitScale).Get("http://" + faultControlAddr + "/" + cmd)
	if err != nil {
		t.Fatalf("fault proxy %s: %v", cmd, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return strings.TrimSpace(string(b))
}

// Blackhole makes kube-proxy's connections to the apiserver dead: open, but silent.
func (cp *ControlPlane) Blackhole() string { cp.t.Helper(); return cp.faultCommand("blackhole") }

// Heal makes the fault proxy forward again.
func (cp *ControlPlane) Heal() string { cp.t.Helper(); return cp.faultCommand("heal") }

// ResetConnections closes every connection through the fault proxy.
func (cp *ControlPlane) ResetConnections() string { cp.t.Helper(); return cp.faultCommand("reset") }

// KubeProxyLog returns kube-proxy's output so far.
func (cp *ControlPlane) KubeProxyLog() string {
	b, _ := os.ReadFile(cp.KubeProxy.log)
	return string(b)
}

// KubeProxyGet fetches a path from kube-proxy's metrics (10249) or healthz (10256) server.
func (cp *ControlPlane) KubeProxyGet(addr, path string) (int, string, error) {
	resp, err := netnsdial.HTTPClient(cp.Lab.Node, 5*time.Second*waitScale).Get("http://" + addr + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// IptablesSave returns `iptables-save -t table` of the node namespace.
func (cp *ControlPlane) IptablesSave(table string) string {
	cp.t.Helper()
	return cp.Lab.MustExec(cp.Lab.Node, "iptables-save", "-t", table)
}

// Ip6tablesSave returns `ip6tables-save -t table` of the node namespace.
func (cp *ControlPlane) Ip6tablesSave(table string) string {
	cp.t.Helper()
	return cp.Lab.MustExec(cp.Lab.Node, "ip6tables-save", "-t", table)
}

// ServicePortEndpoints reads from an `iptables-save -t nat` dump the endpoints (ip:port, sorted)
// that kube-proxy programmed in the cluster chain of one service port, named the way kube-proxy
// names it ("namespace/name:port", protocol lower case). found is false when KUBE-SERVICES does
// not jump to that chain.
func ServicePortEndpoints(nat, portName, protocol string) (eps []string, found bool) {
	svc, _ := iptablesServiceChains(portName, protocol)
	return chainEndpoints(nat, svc)
}

// LocalServicePortEndpoints is ServicePortEndpoints for the local chain (KUBE-SVL-*), which
// internalTrafficPolicy: Local (and externalTrafficPolicy: Local) fill with this node's
// endpoints.
func LocalServicePortEndpoints(nat, portName, protocol string) (eps []string, found bool) {
	_, svl := iptablesServiceChains(portName, protocol)
	return chainEndpoints(nat, svl)
}

var dnatRE = regexp.MustCompile(`-j DNAT --to-destination (\S+)`)

func chainEndpoints(nat, chain string) ([]string, bool) {
	var seps []string
	found := false
	for _, line := range strings.Split(nat, "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || f[0] != "-A" {
			continue
		}
		if strings.HasSuffix(line, "-j "+chain) && (f[1] == "KUBE-SERVICES" || strings.HasPrefix(f[1], "KUBE-EXT-")) {
			found = true
		}
		if f[1] == chain && strings.Contains(line, "-j KUBE-SEP-") {
			seps = append(seps, f[len(f)-1])
		}
	}
	eps := []string{}
	for _, sep := range seps {
		for _, line := range strings.Split(nat, "\n") {
			if strings.HasPrefix(line, "-A "+sep+" ") {
				if m := dnatRE.FindStringSubmatch(line); m != nil {
					eps = append(eps, m[1])
				}
			}
		}
	}
	sort.Strings(eps)
	return eps, found
}

// WaitServicePortEndpoints polls the node's nat table until the service port's cluster chain
// holds exactly want (any order) and returns the dump that matched.
func (cp *ControlPlane) WaitServicePortEndpoints(timeout time.Duration, portName, protocol string, want []string) string {
	cp.t.Helper()
	return cp.waitServicePortEndpoints(timeout, false, portName, protocol, want)
}

// WaitServicePortEndpoints6 is WaitServicePortEndpoints for the IPv6 nat table (ip6tables),
// want as "[ip]:port".
func (cp *ControlPlane) WaitServicePortEndpoints6(timeout time.Duration, portName, protocol string, want []string) string {
	cp.t.Helper()
	return cp.waitServicePortEndpoints(timeout, true, portName, protocol, want)
}

func (cp *ControlPlane) waitServicePortEndpoints(timeout time.Duration, ipv6 bool, portName, protocol string, want []string) string {
	cp.t.Helper()
	want = sortedCopy(want)
	family := "IPv4"
	if ipv6 {
		family = "IPv6"
	}
	var nat string
	waitFor(cp.t, timeout, fmt.Sprintf("%s/%s programmed with %d %s endpoints", portName, protocol, len(want), family), func() (bool, string) {
		if cp.KubeProxy != nil && cp.KubeProxy.Exited() {
			cp.t.Fatalf("kube-proxy exited")
		}
		if ipv6 {
			nat = cp.Ip6tablesSave("nat")
		} else {
			nat = cp.IptablesSave("nat")
		}
		got, found := ServicePortEndpoints(nat, portName, protocol)
		return found && equalStrings(got, want), fmt.Sprintf("found=%v endpoints=%v", found, got)
	})
	return nat
}

func sortedCopy(s []string) []string {
	c := append([]string(nil), s...)
	sort.Strings(c)
	return c
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Object helpers for scenarios. There is no controller manager: the test writes Services and
// EndpointSlices itself.

// LabEndpoint is one endpoint of an EndpointSlice the test writes.
type LabEndpoint struct {
	IP       string
	NodeName string // "" for none
	Zone     string
	NotReady bool
}

// EnsureNamespace creates a namespace if it does not exist.
func (cp *ControlPlane) EnsureNamespace(name string) {
	cp.t.Helper()
	_, err := cp.Client.CoreV1().Namespaces().Create(context.Background(),
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !strings.Contains(err.Error(), "already exists") {
		cp.t.Fatalf("creating namespace %s: %v", name, err)
	}
}

// CreateService creates svc (its namespace too, if needed).
func (cp *ControlPlane) CreateService(svc *corev1.Service) *corev1.Service {
	cp.t.Helper()
	cp.EnsureNamespace(svc.Namespace)
	out, err := cp.Client.CoreV1().Services(svc.Namespace).Create(context.Background(), svc, metav1.CreateOptions{})
	if err != nil {
		cp.t.Fatalf("creating service %s/%s: %v", svc.Namespace, svc.Name, err)
	}
	return out
}

// EndpointSlice builds an EndpointSlice of service ns/svc with the given ports and endpoints,
// labelled the way the endpointslice controller labels its slices. Its address type is IPv6
// when the first endpoint's address is, else IPv4 (a slice holds one family).
func EndpointSlice(ns, svc, name string, ports []discoveryv1.EndpointPort, eps []LabEndpoint) *discoveryv1.EndpointSlice {
	addrType := discoveryv1.AddressTypeIPv4
	if len(eps) > 0 && strings.Contains(eps[0].IP, ":") {
		addrType = discoveryv1.AddressTypeIPv6
	}
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{
			discoveryv1.LabelServiceName: svc,
			discoveryv1.LabelManagedBy:   "proxyhealth-e2e",
		}},
		AddressType: addrType,
		Ports:       ports,
	}
	for _, e := range eps {
		ready := !e.NotReady
		ep := discoveryv1.Endpoint{
			Addresses:  []string{e.IP},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready, Serving: &ready, Terminating: ptrTo(false)},
		}
		if e.NodeName != "" {
			ep.NodeName = ptrTo(e.NodeName)
		}
		if e.Zone != "" {
			ep.Zone = ptrTo(e.Zone)
		}
		s.Endpoints = append(s.Endpoints, ep)
	}
	return s
}

// SlicePort is one EndpointSlice port.
func SlicePort(name string, proto corev1.Protocol, port int32) discoveryv1.EndpointPort {
	return discoveryv1.EndpointPort{Name: ptrTo(name), Protocol: ptrTo(proto), Port: ptrTo(port)}
}

func ptrTo[T any](v T) *T { return &v }

// ApplySlice creates the EndpointSlice, or replaces its ports and endpoints if it exists.
func (cp *ControlPlane) ApplySlice(s *discoveryv1.EndpointSlice) *discoveryv1.EndpointSlice {
	cp.t.Helper()
	ctx := context.Background()
	api := cp.Client.DiscoveryV1().EndpointSlices(s.Namespace)
	cur, err := api.Get(ctx, s.Name, metav1.GetOptions{})
	if err != nil {
		out, err := api.Create(ctx, s, metav1.CreateOptions{})
		if err != nil {
			cp.t.Fatalf("creating EndpointSlice %s/%s: %v", s.Namespace, s.Name, err)
		}
		return out
	}
	cur.Ports, cur.Endpoints, cur.Labels = s.Ports, s.Endpoints, s.Labels
	out, err := api.Update(ctx, cur, metav1.UpdateOptions{})
	if err != nil {
		cp.t.Fatalf("updating EndpointSlice %s/%s: %v", s.Namespace, s.Name, err)
	}
	return out
}

// tokenKubeconfig writes file (in the control plane's directory): a kubeconfig for server with
// a token of ServiceAccount ns/sa (TokenRequest), for an exporter in the node namespace.
func (cp *ControlPlane) tokenKubeconfig(t *testing.T, ns, sa, file, server string) string {
	t.Helper()
	tok, err := cp.Client.CoreV1().ServiceAccounts(ns).CreateToken(context.Background(), sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptrTo(int64(3600))},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("requesting a token for %s/%s: %v", ns, sa, err)
	}
	path := filepath.Join(cp.Dir, file)
	if err := os.WriteFile(path, []byte(kubelab.KubeconfigYAML(server, sa, tok.Status.Token)), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
