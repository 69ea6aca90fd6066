//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/proxyhealth/proxyhealth/internal/capability"
	"github.com/proxyhealth/proxyhealth/internal/testsupport/prereq"
)

// requireImageEnv makes TestImage fail, not skip, when podman is missing (.ci/run sets it).
const requireImageEnv = "PROXYHEALTH_REQUIRE_IMAGE"

// imageFirstPort is the first of the ports the image scenarios' exporters listen on.
const imageFirstPort = 19900

// podman runs podman with runc and cgroupfs: crun fails on this machine's cgroup v1 hierarchy,
// and there is no systemd to manage cgroups.
func podman(args ...string) *exec.Cmd {
	return exec.Command("podman", append([]string{"--runtime", "runc", "--cgroup-manager=cgroupfs"}, args...)...)
}

// podmanUlimits are limits within the test process's own: podman's defaults (1048576 files,
// 4194304 processes) are above what some sandboxes allow, and runc then cannot start the
// container.
func podmanUlimits(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, l := range []struct {
		name     string
		resource int
		max      uint64
	}{{"nofile", unix.RLIMIT_NOFILE, 65536}, {"nproc", unix.RLIMIT_NPROC, 4096}} {
		var r unix.Rlimit
		if err := unix.Getrlimit(l.resource, &r); err != nil {
			t.Fatal(err)
		}
		v := min(r.Cur, l.max)
		out = append(out, "--ulimit", fmt.Sprintf("%s=%d:%d", l.name, v, v))
	}
	return out
}

// requirePodman skips (or fails, with PROXYHEALTH_REQUIRE_IMAGE set) when podman or runc is
// missing.
func requirePodman(t *testing.T) {
	t.Helper()
	for _, tool := range []string{"podman", "runc"} {
		if _, err := exec.LookPath(tool); err != nil {
			msg := fmt.Sprintf("the image test needs %s (apt-get install -y podman runc)", tool)
			if os.Getenv(requireImageEnv) != "" {
				t.Fatalf("%s; %s is set", msg, requireImageEnv)
			}
			prereq.Skip(t, msg)
		}
	}
}

// buildImage builds the image with make image, as a user would, under a tag of this run, and
// removes it at the end. It returns the tag.
func buildImage(t *testing.T) string {
	t.Helper()
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	tag := fmt.Sprintf("localhost/proxyhealth:e2e-%d", os.Getpid())
	start := time.Now()
	cmd := exec.Command("make", "image", "IMAGE="+tag, "IMAGE_CONTEXT="+filepath.Join(t.TempDir(), "image"), "CONTAINER_ENGINE=podman")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make image: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		if out, err := podman("rmi", "-f", tag).CombinedOutput(); err != nil {
			t.Logf("removing %s: %v\n%s", tag, err, out)
		}
	})
	t.Logf("make image: %s in %s", tag, time.Since(start).Round(time.Second))
	return tag
}

// TestImage builds the image (make image) and runs it with podman and runc in a lab node's
// network namespace, under the DaemonSet's securityContext read from deploy/base: its user, its
// capabilities, a read-only root filesystem, no privilege escalation, its volumes, env and
// args. With the manifest's capabilities every collector succeeds; without NET_RAW only the
// iptables-legacy reads fail (node, rules), with their reason; without NET_ADMIN conntrack and
// every nf_tables read fail, and the node's sysctls are still served; without DAC_READ_SEARCH
// the legacy table list and kube-proxy's log cannot be read. The container always starts.
//
// podman puts a non-root container's added capabilities in the ambient set too, which
// Kubernetes runtimes do not: the exporter's empty ambient set shows it got them through its
// file capabilities (an exec of a file with file capabilities clears it), as it must in
// Kubernetes; TestDeployCapabilities runs the Kubernetes way without podman.
func TestImage(t *testing.T) {
	requirePodman(t)
	requireKube(t)
	requireLab(t)
	ds := deployedDaemonSet(t)
	podSC, _, granted := deployedContainer(t)
	fileCaps := imageFileCaps(t, granted)
	tag := buildImage(t)
	checkImage(t, tag, fileCaps, podSC)

	n := newCapsNode(t)
	cases := []*capsCase{{name: "manifest", caps: granted}}
	for _, drop := range granted {
		var rest []string
		for _, c := range granted {
			if c != drop {
				rest = append(rest, c)
			}
		}
		cases = append(cases, &capsCase{name: "without_" + drop, caps: rest, without: drop})
	}
	for i, cc := range cases {
		port := imageFirstPort + i
		name := fmt.Sprintf("ph-e2e-%d-%s-%s", os.Getpid(), n.l.ID, strings.ReplaceAll(cc.name, "_", "-"))
		args := podmanRunArgs(t, ds, tag, name, n, port, cc.without,
			// The lab's API, through the kubeconfig of the exporter's ServiceAccount (in a
			// cluster: the in-cluster config); the lab's short intervals.
			"--kubeconfig=/etc/proxyhealth/kubeconfig",
			"--api.fresh-within=5s", "--api.probe-interval=1s",
			"--rules.check-interval=1s", "--node.rules-check-interval=1s",
			"--conntrack.service-refresh-interval=1s",
		)
		t.Cleanup(func() { _ = podman("rm", "-f", "-t", "2", name).Run() })
		cc.p = n.l.start(podman(args...), "image-"+cc.name)
		cc.e = &Exporter{l: n.l, p: cc.p, URL: fmt.Sprintf("http://127.0.0.1:%d/metrics", port), Name: "image/" + cc.name}
		cc.container = name
	}

	for _, cc := range cases {
		t.Run(cc.name, func(t *testing.T) {
			waitFor(t, 30*time.Second, cc.name+" /metrics", func() (bool, string) {
				if cc.p.Exited() {
					out, _ := os.ReadFile(cc.p.log)
					t.Fatalf("the container exited:\n%s", out)
				}
				_, err := n.l.Get(n.l.Node, cc.e.URL)
				return err == nil, fmt.Sprint(err)
			})
			out, err := podman("inspect", "--format", "{{.State.Pid}}", cc.container).Output()
			if err != nil {
				t.Fatalf("podman inspect %s: %v", cc.container, err)
			}
			pid, err := strconv.Atoi(strings.TrimSpace(string(out)))
			if err != nil {
				t.Fatalf("podman inspect %s: pid %q", cc.container, out)
			}
			status := checkProcessCaps(t, pid, cc.caps)
			for _, line := range []string{"CapAmb:\t0000000000000000", "NoNewPrivs:\t1"} {
				if !strings.Contains(status, line+"\n") {
					t.Fatalf("want %q in the exporter's status:\n%s", line, status)
				}
			}

			s := pollSuccess(t, cc.e, wantSuccess(cc.without))
			logs := func() string { b, _ := os.ReadFile(cc.p.log); return string(b) }
			switch cc.without {
			case "":
				checkBuildInfo(t, s)
				checkValue(t, s, viewFresh, nil, 1)
				checkValue(t, s, "proxyhealth_kubeproxy_log_files_followed", nil, 1)
				checkValue(t, s, "proxyhealth_proxy_mode", map[string]string{"mode": "iptables"}, 1)
				checkValue(t, s, dropRule, nil, 0)
			case "net_raw":
				// The legacy tables fail, named with the capability; everything else is read.
				for _, c := range []string{"node", "rules"} {
					line := failureLine(logs(), c)
					if !strings.Contains(line, "CAP_NET_RAW") {
						t.Errorf("the %s collector's failure does not name CAP_NET_RAW: %q", c, line)
					}
					t.Logf("%s", line)
				}
				checkValue(t, s, viewFresh, nil, 1)
			case "net_admin":
				// The node's sysctls are still served.
				checkValue(t, s, "proxyhealth_bridge_nf_call_iptables", nil, 1)
				checkValue(t, s, "proxyhealth_conntrack_tcp_be_liberal", nil, 0)
				for _, c := range []string{"conntrack", "rules"} {
					line := failureLine(logs(), c)
					if !strings.Contains(line, "CAP_NET_ADMIN") {
						t.Errorf("the %s collector's failure does not name CAP_NET_ADMIN: %q", c, line)
					}
					t.Logf("%s", line)
				}
			}
			t.Logf("%s:\n%s", cc.name, s.Series(success))
		})
	}
}

// checkBuildInfo checks that the image's exporter reports the version make image stamped: the
// commit's revision and a version.
func checkBuildInfo(t *testing.T, s Scrape) {
	t.Helper()
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("git", "rev-parse", "HEAD")
	cmd.Dir = root
	head, err := cmd.Output()
	if err != nil {
		prereq.Skipf(t, "no git revision to compare with: %v", err)
	}
	fam := s["proxyhealth_build_info"]
	if fam == nil || len(fam.Metric) != 1 {
		t.Fatalf("proxyhealth_build_info: %s", s.Series("proxyhealth_build_info"))
	}
	labels := map[string]string{}
	for _, l := range fam.Metric[0].Label {
		labels[l.GetName()] = l.GetValue()
	}
	if labels["revision"] != strings.TrimSpace(string(head)) || labels["version"] == "" || labels["version"] == "(devel)" {
		t.Errorf("proxyhealth_build_info %v: want revision %s and a version", labels, strings.TrimSpace(string(head)))
	}
}

// failureLine returns the log's first "collector failed" line of collector c.
func failureLine(log, c string) string {
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, "collector failed") && strings.Contains(line, "collector="+c+" ") {
			return line
		}
	}
	return ""
}

// checkImage checks what the image holds: one file, the exporter, with the Dockerfile's file
// capabilities, run as the DaemonSet's user; and reports its size.
func checkImage(t *testing.T, tag string, want capability.File, podSC *corev1.PodSecurityContext) {
	t.Helper()
	out, err := podman("image", "inspect", "--format", "{{.Size}} {{.Config.User}} {{json .Config.Entrypoint}}", tag).Output()
	if err != nil {
		t.Fatalf("podman image inspect: %v", err)
	}
	f := strings.Fields(string(out))
	size, _ := strconv.ParseInt(f[0], 10, 64)
	t.Logf("image %s: %d bytes (%.1f MB), user %s, entrypoint %s", tag, size, float64(size)/1e6, f[1], f[2])
	if wantUser := fmt.Sprintf("%d:%d", *podSC.RunAsUser, *podSC.RunAsGroup); f[1] != wantUser {
		t.Errorf("the image runs as %q, the DaemonSet as %q", f[1], wantUser)
	}
	if f[2] != `["/proxyhealth"]` {
		t.Errorf("entrypoint %s", f[2])
	}
	mnt, err := podman("image", "mount", tag).Output()
	if err != nil {
		t.Fatalf("podman image mount: %v", err)
	}
	t.Cleanup(func() { _ = podman("image", "unmount", tag).Run() })
	dir := strings.TrimSpace(string(mnt))
	var files []string
	err = filepath.Walk(dir, func(path string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if !info.IsDir() {
			rel, _ := filepath.Rel(dir, path)
			files = append(files, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 1 || files[0] != "proxyhealth" {
		t.Errorf("the image holds %v, want the exporter alone", files)
	}
	got, ok, err := capability.ReadFile(filepath.Join(dir, "proxyhealth"))
	if err != nil || !ok || got != want {
		t.Fatalf("the image's exporter has file capabilities %v (%v, %v), want %s", got, ok, err, want)
	}
}

// varRE matches a $(VAR) reference in a container's args.
var varRE = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// podmanRunArgs turns the DaemonSet's pod into podman run arguments for a container named
// name, in the lab node's network namespace (the pod's host network), with the capability
// without left out of those the DaemonSet adds and the exporter on port. Volumes: a hostPath
// is the same path under n.hostRoot, an emptyDir a tmpfs. A setting the translation does not
// know fails the test, so that a change to the manifest cannot pass unseen.
func podmanRunArgs(t *testing.T, ds appsv1.DaemonSet, image, name string, n *capsNode, port int, without string, extra ...string) []string {
	t.Helper()
	spec := ds.Spec.Template.Spec
	c := spec.Containers[0]
	if !spec.HostNetwork {
		t.Fatal("the DaemonSet does not use the host network: the test runs it in a lab node's")
	}
	args := []string{"run", "--rm", "--name", name, "--pull=never",
		"--network", "ns:/run/netns/" + n.l.Node,
		// Kubernetes mounts nothing writable on a read-only root that the pod does not ask for.
		"--read-only-tmpfs=false",
	}
	args = append(args, podmanUlimits(t)...)

	// Security: the container's settings over the pod's.
	sc := c.SecurityContext
	uid, gid := spec.SecurityContext.RunAsUser, spec.SecurityContext.RunAsGroup
	if sc.RunAsUser != nil {
		uid = sc.RunAsUser
	}
	if sc.RunAsGroup != nil {
		gid = sc.RunAsGroup
	}
	if uid == nil || gid == nil {
		t.Fatal("the DaemonSet sets no user and group")
	}
	args = append(args, "--user", fmt.Sprintf("%d:%d", *uid, *gid))
	if sc.ReadOnlyRootFilesystem != nil && *sc.ReadOnlyRootFilesystem {
		args = append(args, "--read-only")
	}
	if sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation {
		args = append(args, "--security-opt", "no-new-privileges")
	}
	if sc.Privileged != nil && *sc.Privileged {
		t.Fatal("the DaemonSet's container is privileged")
	}
	seccomp := spec.SecurityContext.SeccompProfile
	if sc.SeccompProfile != nil {
		seccomp = sc.SeccompProfile
	}
	switch {
	case seccomp == nil || seccomp.Type == corev1.SeccompProfileTypeUnconfined:
		args = append(args, "--security-opt", "seccomp=unconfined")
	case seccomp.Type == corev1.SeccompProfileTypeRuntimeDefault:
		// podman's default profile
	default:
		t.Fatalf("seccomp profile %s not translated", seccomp.Type)
	}
	for _, d := range sc.Capabilities.Drop {
		args = append(args, "--cap-drop", string(d))
	}
	for _, a := range sc.Capabilities.Add {
		if !strings.EqualFold(string(a), without) {
			args = append(args, "--cap-add", string(a))
		}
	}

	// Volumes.
	vols := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		vols[v.Name] = v
	}
	for _, m := range c.VolumeMounts {
		v, ok := vols[m.Name]
		switch {
		case !ok:
			t.Fatalf("volume mount %s has no volume", m.Name)
		case v.HostPath != nil:
			src := filepath.Join(n.hostRoot, v.HostPath.Path)
			if _, err := os.Stat(src); err != nil {
				t.Fatalf("hostPath %s: %v", v.HostPath.Path, err)
			}
			opt := src + ":" + m.MountPath
			if m.ReadOnly {
				opt += ":ro"
			}
			args = append(args, "-v", opt)
		case v.EmptyDir != nil:
			args = append(args, "--tmpfs", m.MountPath)
		default:
			t.Fatalf("volume %s: only hostPath and emptyDir are translated", m.Name)
		}
	}
	args = append(args, "-v", n.kubeconfig+":/etc/proxyhealth/kubeconfig:ro")

	// Env: the downward API's node name is the lab node's.
	env := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName":
			env[e.Name] = labNodeName
		default:
			t.Fatalf("env %s: value source not translated", e.Name)
		}
		args = append(args, "-e", e.Name+"="+env[e.Name])
	}

	args = append(args, image)
	if len(c.Command) > 0 {
		t.Fatal("the DaemonSet overrides the image's entrypoint")
	}
	// The DaemonSet's args, $(VAR) expanded as the kubelet does; the listen address is the
	// scenario's own (several run in one namespace).
	listen := false
	for _, a := range c.Args {
		a = varRE.ReplaceAllStringFunc(a, func(ref string) string {
			if v, ok := env[ref[2:len(ref)-1]]; ok {
				return v
			}
			return ref
		})
		if strings.HasPrefix(a, "--web.listen-address=") {
			a, listen = fmt.Sprintf("--web.listen-address=127.0.0.1:%d", port), true
		}
		args = append(args, a)
	}
	if !listen {
		args = append(args, fmt.Sprintf("--web.listen-address=127.0.0.1:%d", port))
	}
	return append(args, extra...)
}
