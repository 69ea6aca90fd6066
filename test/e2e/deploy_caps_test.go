//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// The capabilities the collectors need, found by running them without each one.
var collectors = []string{"conntrack", "node", "rules", "kubeproxy"}

// capsFirstPort is the first of the ports the capability scenarios' exporters listen on.
const capsFirstPort = 19880

// deployedContainer reads the exporter's container and pod security settings from
// deploy/base/daemonset.yaml: the test runs the exporter with exactly what the manifest grants.
func deployedContainer(t *testing.T) (*corev1.PodSecurityContext, corev1.Container) {
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
	return ds.Spec.Template.Spec.SecurityContext, ds.Spec.Template.Spec.Containers[0]
}

// setcapRE matches the Dockerfile's `setcap <caps>+ep <path>` lines.
var setcapRE = regexp.MustCompile(`setcap\s+(\S+)\+ep\s+(\S+)`)

// imageFileCaps returns the file capabilities the Dockerfile sets, by path in the image.
func imageFileCaps(t *testing.T) map[string]string {
	t.Helper()
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, m := range setcapRE.FindAllStringSubmatch(string(b), -1) {
		out[m[2]] = m[1]
	}
	if len(out) == 0 {
		t.Fatal("the Dockerfile sets no file capabilities")
	}
	return out
}

// capsCase is one exporter run with a set of capabilities.
type capsCase struct {
	name    string
	mode    string // "ambient" or "filecaps"
	caps    []string
	without string // the capability left out, "" for the manifest's set
	e       *Exporter
	p       *proc
}

// TestDeployCapabilities proves the DaemonSet's least privilege on a lab node: the exporter as
// the manifest's user with exactly the capabilities the manifest adds, a read-only root
// filesystem and a private writable /run (the manifest's emptyDir), kube-proxy's rules in the
// legacy backend (the one that needs the most), kube-proxy's log readable by root only, and a
// real apiserver. Every collector succeeds; without any one of the capabilities the collectors
// that need it fail. Two ways of holding the capabilities:
//
//   - ambient: the capabilities ambient (setpriv), as a runtime that sets the ambient set would
//     give them; the iptables and nft binaries are the system's;
//   - filecaps: what runc does for a non-root container (capexec: bounding, permitted and
//     effective only, no_new_privs) with the Dockerfile's file capabilities applied to copies
//     of the exporter and of the iptables and nft binaries (this machine is Debian bookworm,
//     like the image). There a missing capability makes the exec itself fail: the container
//     does not start.
func TestDeployCapabilities(t *testing.T) {
	requireKube(t)
	requireExporter(t)
	for _, tool := range []string{"setcap", "unshare", "iptables-legacy-restore"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not found (apt-get install -y libcap2-bin util-linux iptables)", tool)
		}
	}
	podSC, c := deployedContainer(t)
	sc := c.SecurityContext
	switch {
	case podSC == nil || podSC.RunAsUser == nil || *podSC.RunAsUser != 65534 || podSC.RunAsNonRoot == nil || !*podSC.RunAsNonRoot:
		t.Fatalf("the pod does not run as non-root user 65534: %+v", podSC)
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
	t.Logf("the manifest grants %v as user %d", granted, *podSC.RunAsUser)
	fileCaps := imageFileCaps(t)

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
	share := mkdirMode(t, tmp, "share", 0o755)
	kubeconfig := filepath.Join(share, "kubeconfig")
	b, err := os.ReadFile(cp.readOnlyKubeconfig("proxyhealth-caps.kubeconfig", apiserverAddr))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(kubeconfig, b, 0o644); err != nil {
		t.Fatal(err)
	}
	podLogs := mkdirMode(t, share, "var/log/pods/kube-system_kube-proxy-lab_0000/kube-proxy", 0o755)
	logLine := `2026-01-02T03:04:05.000000000Z stderr F I0102 03:04:05.000000       1 proxier.go:800] "SyncProxyRules complete"` + "\n"
	if err := os.WriteFile(filepath.Join(podLogs, "0.log"), []byte(logLine), 0o640); err != nil {
		t.Fatal(err)
	}
	logGlob := filepath.Join(share, "var/log/pods/kube-system_kube-proxy-*/kube-proxy/*.log")

	// The image's binaries with the Dockerfile's file capabilities, alone on PATH.
	capBin := mkdirMode(t, share, "bin", 0o755)
	imageBins := map[string]string{
		"/usr/local/bin/proxyhealth":     exporterBin,
		"/usr/sbin/xtables-legacy-multi": "/usr/sbin/xtables-legacy-multi",
		"/usr/sbin/xtables-nft-multi":    "/usr/sbin/xtables-nft-multi",
		"/usr/sbin/nft":                  "/usr/sbin/nft",
	}
	for imagePath, src := range imageBins {
		spec, ok := fileCaps[imagePath]
		if !ok {
			t.Fatalf("the Dockerfile sets no file capabilities on %s", imagePath)
		}
		dst := filepath.Join(capBin, filepath.Base(imagePath))
		mustRun(t, "cp", src, dst)
		mustRun(t, "setcap", spec+"+ep", dst)
	}
	for _, link := range []string{"iptables-legacy", "iptables-legacy-save", "ip6tables-legacy", "ip6tables-legacy-save"} {
		if err := os.Symlink("xtables-legacy-multi", filepath.Join(capBin, link)); err != nil {
			t.Fatal(err)
		}
	}
	for _, link := range []string{"iptables-nft", "iptables-nft-save", "ip6tables-nft", "ip6tables-nft-save"} {
		if err := os.Symlink("xtables-nft-multi", filepath.Join(capBin, link)); err != nil {
			t.Fatal(err)
		}
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
		// The container: a read-only root filesystem and a private, writable /run.
		args := []string{"netns", "exec", l.Node, "unshare", "--mount", "--propagation", "private", "sh", "-c",
			`mount -o remount,bind,ro / && mount -t tmpfs -o mode=1777,size=1m run /run && exec "$@"`, "container"}
		capList := strings.Join(cc.caps, ",")
		exporter := exporterBin
		switch cc.mode {
		case "ambient":
			sets := "-all"
			for _, c := range cc.caps {
				sets += ",+" + c
			}
			args = append(args, "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
				"--inh-caps="+sets, "--ambient-caps="+sets, "--bounding-set="+sets)
		case "filecaps":
			args = append(args, "env", "PATH="+capBin, capexec, "-uid", "65534", "-gid", "65534", "-caps", capList, "--")
			exporter = filepath.Join(capBin, "proxyhealth")
		}
		args = append(args, exporter,
			"--web.listen-address="+addr,
			"--log.level=info",
			"--kubeconfig="+kubeconfig,
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
			if cc.mode == "filecaps" && cc.without != "" {
				// The exporter's file capabilities cannot all be had: exec fails.
				select {
				case <-cc.p.done:
				case <-time.After(10 * time.Second):
					t.Fatalf("the exporter started without %s; want exec refused (file capabilities %s)", cc.without, fileCaps["/usr/local/bin/proxyhealth"])
				}
				out, _ := os.ReadFile(cc.p.log)
				if !strings.Contains(string(out), "operation not permitted") {
					t.Fatalf("want exec refused with EPERM, got:\n%s", out)
				}
				t.Logf("without %s the container does not start: %s", cc.without, strings.TrimSpace(string(out)))
				return
			}
			waitFor(t, 15*time.Second, cc.name+" /metrics", func() (bool, string) {
				if cc.p.Exited() {
					out, _ := os.ReadFile(cc.p.log)
					t.Fatalf("exporter exited:\n%s", out)
				}
				_, err := l.Get(l.Node, cc.e.URL)
				return err == nil, fmt.Sprint(err)
			})
			checkProcessCaps(t, cc)
			want := map[string]float64{}
			for _, c := range collectors {
				want[c] = 1
			}
			for _, c := range capsNeededBy[cc.without] {
				want[c] = 0
			}
			// Collectors report after their first background pass (1 s intervals here) and the
			// API view's first sync; a state must then hold for ten scrapes in a row (2 s, two more passes).
			held := 0
			s := cc.e.Poll(t, 30*time.Second, fmt.Sprintf("collector success %v held for 2 s", want), nil, func(s Scrape) (bool, string) {
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
	// conntrack netlink; every iptables and nft read.
	"net_admin": {"conntrack", "node", "rules"},
	// iptables-legacy-save: the legacy filter table (node) and nat table (rules). The conntrack
	// collector's Service map from the legacy KUBE-SERVICES is unreadable too, but it names
	// Services from the API view as well, so it logs that and still succeeds.
	"net_raw": {"node", "rules"},
	// /proc/net/ip_tables_names (whether a legacy table exists: node, rules) and kube-proxy's
	// log (kubeproxy).
	"dac_read_search": {"node", "rules", "kubeproxy"},
}

// checkProcessCaps checks the running exporter's credentials: user 65534 and exactly the
// case's capabilities effective.
func checkProcessCaps(t *testing.T, cc *capsCase) {
	t.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", cc.p.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	var want uint64
	for _, c := range cc.caps {
		want |= 1 << map[string]uint{"dac_read_search": 2, "net_admin": 12, "net_raw": 13}[c]
	}
	for _, line := range []string{"Uid:\t65534\t65534\t65534\t65534", fmt.Sprintf("CapEff:\t%016x", want)} {
		if !strings.Contains(string(status), line+"\n") {
			t.Fatalf("want %q in the exporter's status:\n%s", line, status)
		}
	}
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
