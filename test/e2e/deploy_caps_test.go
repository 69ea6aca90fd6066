//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/proxyhealth/proxyhealth/internal/capability"
	"github.com/proxyhealth/proxyhealth/internal/testsupport/prereq"
)

// The capabilities the collectors need, found by running them without each one.
var collectors = []string{"conntrack", "node", "rules", "kubeproxy"}

// capsFirstPort is the first of the ports the capability scenarios' exporters listen on.
const capsFirstPort = 19880

// deployedDaemonSet reads deploy/base/daemonset.yaml: the tests run the exporter with exactly
// what the manifest grants.
func deployedDaemonSet(t *testing.T) appsv1.DaemonSet {
	t.Helper()
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "deploy", "base", "daemonset.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var ds appsv1.DaemonSet
	if err := yaml.UnmarshalStrict(b, &ds); err != nil {
		t.Fatalf("deploy/base/daemonset.yaml: %v", err)
	}
	if len(ds.Spec.Template.Spec.Containers) != 1 {
		t.Fatalf("deploy/base/daemonset.yaml: want one container, have %d", len(ds.Spec.Template.Spec.Containers))
	}
	return ds
}

// exporterUID is the user and group the image, the chart and deploy/ run the exporter as: the
// project's own rather than 65534 (nobody), which many other images on a node run as, so that
// no other workload's processes share the exporter's user and with it its /proc access.
const exporterUID = 9869

// deployedContainer returns the DaemonSet's pod security settings and its container, after
// checking the least privilege deploy/README.md describes: a non-root user, every capability
// dropped but those added, a read-only root filesystem, no privilege escalation. It returns
// the added capabilities in capability's lower-case spelling (net_admin).
func deployedContainer(t *testing.T) (*corev1.PodSecurityContext, corev1.Container, []string) {
	t.Helper()
	ds := deployedDaemonSet(t)
	podSC, c := ds.Spec.Template.Spec.SecurityContext, ds.Spec.Template.Spec.Containers[0]
	sc := c.SecurityContext
	switch {
	case podSC == nil || podSC.RunAsUser == nil || *podSC.RunAsUser != exporterUID || podSC.RunAsGroup == nil || *podSC.RunAsGroup != exporterUID || podSC.RunAsNonRoot == nil || !*podSC.RunAsNonRoot:
		t.Fatalf("the pod does not run as the non-root user and group %d: %+v", exporterUID, podSC)
	case sc == nil || sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}):
		t.Fatalf("the container does not drop ALL capabilities: %+v", sc)
	case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
		t.Fatal("the container's root filesystem is not read-only")
	case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
		t.Fatal("the container allows privilege escalation")
	}
	var granted []string
	for _, c := range sc.Capabilities.Add {
		granted = append(granted, strings.ToLower(string(c)))
	}
	return podSC, c, granted
}

// setfcapRE matches the Dockerfile's step that sets the exporter's file capabilities:
// RUN ["/setfcap", "SPEC", "/proxyhealth"].
var setfcapRE = regexp.MustCompile(`RUN \["/setfcap", "([^"]+)", "([^"]+)"\]`)

// imageFileCaps returns the file capabilities the Dockerfile gives the exporter, and checks
// that they are the DaemonSet's and in the permitted set only: a capability the container was
// not given must not fail the exec.
func imageFileCaps(t *testing.T, granted []string) capability.File {
	t.Helper()
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	m := setfcapRE.FindAllStringSubmatch(string(b), -1)
	if len(m) != 1 || m[0][2] != "/proxyhealth" {
		t.Fatalf("the Dockerfile does not set the exporter's file capabilities in one step: %q", m)
	}
	f, err := capability.ParseFile(m[0][1])
	if err != nil {
		t.Fatalf("the Dockerfile's file capabilities: %v", err)
	}
	if f.Effective || f.Inheritable != 0 {
		t.Fatalf("the Dockerfile's file capabilities %s are not permitted-only", f)
	}
	want, err := capability.Parse(strings.Join(granted, ","))
	if err != nil {
		t.Fatal(err)
	}
	if f.Permitted != want {
		t.Fatalf("the Dockerfile's file capabilities %s are not the DaemonSet's %s", f, want)
	}
	return f
}

// capsNode is a lab node set up like one the DaemonSet runs on: kube-proxy's rules in the
// legacy backend (the one that needs the most capabilities), a real apiserver, the exporter's
// read-only ServiceAccount, and kube-proxy's log readable by root only.
type capsNode struct {
	l          *Lab
	cp         *ControlPlane
	share      string // a directory tree anyone may enter
	kubeconfig string // the ServiceAccount's kubeconfig, world-readable
	hostRoot   string // stands for the host's / (its var/log holds kube-proxy's pod log)
}

func newCapsNode(t *testing.T) *capsNode {
	t.Helper()
	l := newLabRules(t, labRawRules)
	// kube-proxy's rules in the legacy backend, as on a node whose kube-proxy uses it.
	l.MustExecInput(l.Node, kubeProxyRules(), "iptables-legacy-restore")
	cp := StartControlPlane(t, l, ControlPlaneOptions{NoKubeProxy: true})

	// Files the exporter reads, readable as the kubelet and the container runtime leave them:
	// the ServiceAccount's kubeconfig world-readable (the projected token is), kube-proxy's log
	// root's with mode 0640 under directories anyone may enter.
	// (t.TempDir's parent is root's only.)
	tmp, err := os.MkdirTemp("", "ph-e2e-caps-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	n := &capsNode{l: l, cp: cp, share: mkdirMode(t, tmp, "share", 0o755)}
	n.kubeconfig = filepath.Join(n.share, "kubeconfig")
	b, err := os.ReadFile(cp.readOnlyKubeconfig("proxyhealth-caps.kubeconfig", apiserverAddr))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(n.kubeconfig, b, 0o644); err != nil {
		t.Fatal(err)
	}
	n.hostRoot = mkdirMode(t, n.share, "host", 0o755)
	podLogs := mkdirMode(t, n.hostRoot, "var/log/pods/kube-system_kube-proxy-lab_0000/kube-proxy", 0o755)
	logLine := `2026-01-02T03:04:05.000000000Z stderr F I0102 03:04:05.000000       1 proxier.go:800] "SyncProxyRules complete"` + "\n"
	if err := os.WriteFile(filepath.Join(podLogs, "0.log"), []byte(logLine), 0o640); err != nil {
		t.Fatal(err)
	}
	return n
}

// wantSuccess is collector_success per collector when the capability without is missing ("":
// none).
func wantSuccess(without string) map[string]float64 {
	want := map[string]float64{}
	for _, c := range collectors {
		want[c] = 1
	}
	for _, c := range capsNeededBy[without] {
		want[c] = 0
	}
	return want
}

// pollSuccess scrapes e until collector_success is want for every collector and has held for
// ten scrapes in a row. Collectors report after their first background pass (1 s intervals in
// these tests) and the API view's first sync; ten scrapes are 2 s, two more passes.
func pollSuccess(t *testing.T, e *Exporter, want map[string]float64) Scrape {
	t.Helper()
	held := 0
	return e.Poll(t, 30*time.Second, fmt.Sprintf("collector success %v held for 2 s", want), nil, func(s Scrape) (bool, string) {
		for c, v := range want {
			got, ok, err := s.Value(success, map[string]string{"collector": c})
			if err != nil || !ok || got != v {
				held = 0
				return false, s.Series(success) + s.Series(viewFresh)
			}
		}
		held++
		return held >= 10, ""
	})
}

// capsCase is one exporter run with a set of capabilities.
type capsCase struct {
	name      string
	mode      string // "ambient" or "filecaps"
	caps      []string
	without   string // the capability left out, "" for the manifest's set
	container string // TestImage: the podman container's name
	e         *Exporter
	p         *proc
}

// TestDeployCapabilities proves the DaemonSet's least privilege on a lab node: the exporter as
// the manifest's user with exactly the capabilities the manifest adds and a read-only root
// filesystem, kube-proxy's rules in the legacy backend, kube-proxy's log readable by root only,
// and a real apiserver. Every collector succeeds; without any one of the capabilities the
// collectors that need it fail, and the others keep serving. Two ways of holding the
// capabilities:
//
//   - ambient: the capabilities ambient (setpriv), as a runtime that sets the ambient set would
//     give them (podman does for a non-root user);
//   - filecaps: what runc does for a non-root Kubernetes container (capexec: bounding,
//     permitted and effective only, none ambient, no_new_privs) with the Dockerfile's file
//     capabilities (permitted only) on a copy of the exporter, which raises them itself. A
//     capability missing from the container is then missing from the exporter; the exec
//     still succeeds.
//
// TestImage runs the image itself the same way under podman.
func TestDeployCapabilities(t *testing.T) {
	requireKube(t)
	requireExporter(t)
	for _, tool := range []string{"unshare", "setpriv", "iptables-legacy-restore"} {
		if _, err := exec.LookPath(tool); err != nil {
			prereq.Skipf(t, "%s not found (apt-get install -y util-linux iptables)", tool)
		}
	}
	podSC, _, granted := deployedContainer(t)
	t.Logf("the manifest grants %v as user %d", granted, *podSC.RunAsUser)
	fileCaps := imageFileCaps(t, granted)

	n := newCapsNode(t)
	l := n.l
	logGlob := filepath.Join(n.hostRoot, "var/log/pods/kube-system_kube-proxy-*/kube-proxy/*.log")

	// The image's exporter with the Dockerfile's file capabilities.
	capBin := mkdirMode(t, n.share, "bin", 0o755)
	capExporter := filepath.Join(capBin, "proxyhealth")
	mustRun(t, "cp", exporterBin, capExporter)
	if err := capability.WriteFile(capExporter, fileCaps); err != nil {
		t.Fatal(err)
	}
	capexec := filepath.Join(binDir, "capexec")
	root, _ := repoRoot()
	if out, err := goBuild(root, capexec, "-tags", "e2e", "./test/e2e/capexec"); err != nil {
		t.Fatalf("building capexec: %v\n%s", err, out)
	}

	var cases []*capsCase
	for _, mode := range []string{"ambient", "filecaps"} {
		cases = append(cases, &capsCase{name: mode + "/manifest", mode: mode, caps: granted})
		for _, drop := range granted {
			var rest []string
			for _, c := range granted {
				if c != drop {
					rest = append(rest, c)
				}
			}
			cases = append(cases, &capsCase{name: mode + "/without_" + drop, mode: mode, caps: rest, without: drop})
		}
	}
	for i, cc := range cases {
		port := capsFirstPort + i
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		// The container: a read-only root filesystem.
		args := []string{"netns", "exec", l.Node, "unshare", "--mount", "--propagation", "private", "sh", "-c",
			`mount -o remount,bind,ro / && exec "$@"`, "container"}
		capList := strings.Join(cc.caps, ",")
		exporter := exporterBin
		switch cc.mode {
		case "ambient":
			sets := "-all"
			for _, c := range cc.caps {
				sets += ",+" + c
			}
			args = append(args, "setpriv", fmt.Sprintf("--reuid=%d", exporterUID), fmt.Sprintf("--regid=%d", exporterUID), "--clear-groups",
				"--inh-caps="+sets, "--ambient-caps="+sets, "--bounding-set="+sets)
		case "filecaps":
			args = append(args, capexec, "-uid", strconv.Itoa(exporterUID), "-gid", strconv.Itoa(exporterUID), "-caps", capList, "--")
			exporter = capExporter
		}
		args = append(args, exporter,
			"--web.listen-address="+addr,
			"--log.level=info",
			"--kubeconfig="+n.kubeconfig,
			"--node-name="+labNodeName,
			"--api.fresh-within=5s", "--api.probe-interval=1s",
			"--rules.check-interval=1s", "--node.rules-check-interval=1s",
			"--conntrack.service-refresh-interval=1s",
			"--kubeproxy.log-path="+logGlob,
		)
		cc.p = l.start(exec.Command("ip", args...), "proxyhealth-"+strings.ReplaceAll(cc.name, "/", "-"))
		cc.e = &Exporter{l: l, p: cc.p, URL: "http://" + addr + "/metrics", Name: cc.name}
	}

	for _, cc := range cases {
		t.Run(cc.name, func(t *testing.T) {
			waitFor(t, 15*time.Second, cc.name+" /metrics", func() (bool, string) {
				if cc.p.Exited() {
					out, _ := os.ReadFile(cc.p.log)
					t.Fatalf("exporter exited:\n%s", out)
				}
				_, err := l.Get(l.Node, cc.e.URL)
				return err == nil, fmt.Sprint(err)
			})
			checkProcessCaps(t, cc.p.cmd.Process.Pid, cc.caps)
			s := pollSuccess(t, cc.e, wantSuccess(cc.without))
			if cc.without == "" {
				checkValue(t, s, viewFresh, nil, 1)
				checkValue(t, s, "proxyhealth_kubeproxy_log_files_followed", nil, 1)
				checkValue(t, s, "proxyhealth_proxy_mode", map[string]string{"mode": "iptables"}, 1)
				checkValue(t, s, dropRule, nil, 0)
			}
			t.Logf("%s:\n%s", cc.name, s.Series(success))
		})
	}
}

// capsNeededBy names, per capability, the collectors that fail without it here.
var capsNeededBy = map[string][]string{
	// conntrack netlink; nf_tables netlink (the iptables-nft backend and native nftables) for
	// the INVALID drop rule (node) and kube-proxy's rules (rules).
	"net_admin": {"conntrack", "node", "rules"},
	// The raw socket the iptables-legacy tables are read through: the legacy filter table
	// (node) and nat table (rules). The conntrack collector's Service map from the legacy
	// KUBE-SERVICES is unreadable too, but it names Services from the API view as well, so it
	// logs that and still succeeds.
	"net_raw": {"node", "rules"},
	// /proc/net/ip_tables_names (whether a legacy table exists: node, rules) and kube-proxy's
	// log (kubeproxy).
	"dac_read_search": {"node", "rules", "kubeproxy"},
}

// checkProcessCaps checks a running exporter's credentials, user exporterUID and exactly caps
// effective, and returns its /proc status.
func checkProcessCaps(t *testing.T, pid int, caps []string) string {
	t.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	want, err := capability.Parse(strings.Join(caps, ","))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{fmt.Sprintf("Uid:\t%[1]d\t%[1]d\t%[1]d\t%[1]d", exporterUID), fmt.Sprintf("CapEff:\t%016x", uint64(want))} {
		if !strings.Contains(string(status), line+"\n") {
			t.Fatalf("want %q in the exporter's status:\n%s", line, status)
		}
	}
	return string(status)
}

// mkdirMode creates dir/rel with mode on every element it creates below dir.
func mkdirMode(t *testing.T, dir, rel string, mode os.FileMode) string {
	t.Helper()
	if err := os.Chmod(dir, mode); err != nil {
		t.Fatal(err)
	}
	p := dir
	for _, part := range strings.Split(rel, "/") {
		p = filepath.Join(p, part)
		if err := os.Mkdir(p, mode); err != nil && !os.IsExist(err) {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
	}
	return p
}
