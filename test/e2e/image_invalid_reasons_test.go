//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// The ports of TestImageInvalidReasons's containers, in its lab node's namespace.
const (
	imageInvalidReasonsPort = 19886
	imageReadOnlyProcPort   = 19887
)

// TestImageInvalidReasons runs the image as the chart's invalidReasons.enabled deploys it, with
// podman and runc in a lab node's network namespace under the DaemonSet's securityContext (user
// exporterUID, NET_ADMIN through the image's file capabilities, a read-only root): the host's
// /proc/sys/net/netfilter, and nothing else of its /proc, mounted writable at
// /host/proc/sys/net/netfilter with --conntrack.invalid-reasons.netfilter-dir pointing there,
// and a state directory at /run/proxyhealth that its init container, run as the chart runs it,
// makes the exporter's user's. The exporter sets
// conntrack's log settings of the node's namespace through it, names INVALID packets by reason
// and Service, and puts the settings back when the container is stopped. Without that mount the runtime's
// read-only /proc/sys refuses the settings, and the exporter says so and what to do.
func TestImageInvalidReasons(t *testing.T) {
	requirePodman(t)
	requireLab(t)
	l := newLab(t)
	before := l.invalidLogSettings()
	ds := deployedDaemonSet(t)
	tag := buildImage(t)

	// The node: its own / (kube-proxy's log directory and /proc are the real ones), and a
	// kubeconfig file the translation mounts, unused here (no API: the lab's rules name the
	// Services).
	tmp, err := os.MkdirTemp("", "ph-e2e-image-invalid-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	share := mkdirMode(t, tmp, "share", 0o755)
	n := &capsNode{l: l, share: share, kubeconfig: filepath.Join(share, "kubeconfig"), hostRoot: "/"}
	if err := os.WriteFile(n.kubeconfig, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(name string, port int, extra ...string) (*proc, *Exporter, string) {
		t.Helper()
		container := fmt.Sprintf("ph-e2e-%d-%s-%s", os.Getpid(), l.ID, name)
		args := podmanRunArgs(t, ds, tag, container, n, port, "", extra...)
		t.Cleanup(func() { _ = podman("rm", "-f", "-t", "2", container).Run() })
		p := l.start(podman(args...), "image-"+name)
		e := &Exporter{l: l, p: p, URL: fmt.Sprintf("http://127.0.0.1:%d/metrics", port), Name: "image/" + name}
		waitFor(t, 30*time.Second, name+" /metrics", func() (bool, string) {
			if p.Exited() {
				out, _ := os.ReadFile(p.log)
				t.Fatalf("the container exited:\n%s", out)
			}
			_, err := l.Get(l.Node, e.URL)
			return err == nil, fmt.Sprint(err)
		})
		return p, e, container
	}

	t.Run("readonly_proc_sys", func(t *testing.T) {
		// The flag alone: the settings under the container's own /proc/sys cannot be written.
		p, _, container := run("readonly-proc", imageReadOnlyProcPort, "--conntrack.invalid-reasons", "--conntrack.invalid-reasons.state-dir=")
		waitFor(t, 10*time.Second, "the exporter to say /proc/sys is read-only", func() (bool, string) {
			b, _ := os.ReadFile(p.log)
			return strings.Contains(string(b), "read-only file system (in a container /proc/sys is read-only: mount the host's /proc/sys/net/netfilter writable and point --conntrack.invalid-reasons.netfilter-dir at it)"), string(b)
		})
		if got := l.invalidLogSettings(); got != before {
			t.Errorf("settings %s, want the node's %s untouched", got, before)
		}
		if err := podman("stop", "-t", "10", container).Run(); err != nil {
			t.Errorf("podman stop: %v", err)
		}
	})

	t.Run("host_netfilter_writable", func(t *testing.T) {
		// What the chart's invalidReasons.enabled adds to the DaemonSet.
		ds := *ds.DeepCopy()
		spec := &ds.Spec.Template.Spec
		// The state directory as the kubelet creates it (root's, 0755), then its init container
		// as the chart runs it: the image as root with CHOWN alone, a read-only root, no new
		// privileges.
		stateDir := filepath.Join(tmp, "state")
		if err := os.Mkdir(stateDir, 0o755); err != nil {
			t.Fatal(err)
		}
		initArgs := append([]string{"run", "--rm", "--network=none"}, podmanUlimits(t)...)
		initArgs = append(initArgs, "--user=0:0", "--cap-drop=all", "--cap-add=CHOWN", "--read-only",
			"--security-opt=no-new-privileges", "-v", stateDir+":/run/proxyhealth", tag,
			"prepare-state-dir", "--conntrack.invalid-reasons.state-dir=/run/proxyhealth", fmt.Sprintf("--owner=%[1]d:%[1]d", exporterUID))
		if out, err := podman(initArgs...).CombinedOutput(); err != nil {
			t.Fatalf("the state directory's init container: %v\n%s", err, out)
		}
		if fi, err := os.Stat(stateDir); err != nil || fi.Mode() != os.ModeDir|0o700 ||
			fi.Sys().(*syscall.Stat_t).Uid != exporterUID || fi.Sys().(*syscall.Stat_t).Gid != exporterUID {
			t.Fatalf("the state directory after its init container: %v, %v; want 0700 of %d:%d", fi.Mode(), err, exporterUID, exporterUID)
		}
		spec.Volumes = append(spec.Volumes, corev1.Volume{Name: "host-netfilter-sysctl",
			VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/proc/sys/net/netfilter"}}},
			corev1.Volume{Name: "invalid-reasons-state", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: stateDir}}})
		c := &spec.Containers[0]
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: "host-netfilter-sysctl", MountPath: "/host/proc/sys/net/netfilter"},
			corev1.VolumeMount{Name: "invalid-reasons-state", MountPath: "/run/proxyhealth"})
		c.Args = append(c.Args, "--conntrack.invalid-reasons", "--conntrack.invalid-reasons.state-dir=/run/proxyhealth",
			"--conntrack.invalid-reasons.netfilter-dir=/host/proc/sys/net/netfilter")
		container := fmt.Sprintf("ph-e2e-%d-%s-%s", os.Getpid(), l.ID, "host-proc")
		args := podmanRunArgs(t, ds, tag, container, n, imageInvalidReasonsPort, "")
		t.Cleanup(func() { _ = podman("rm", "-f", "-t", "2", container).Run() })
		p := l.start(podman(args...), "image-host-proc")
		e := &Exporter{l: l, p: p, URL: fmt.Sprintf("http://127.0.0.1:%d/metrics", imageInvalidReasonsPort), Name: "image/host-proc"}

		waitFor(t, 30*time.Second, "the containerised exporter to set conntrack's log settings", func() (bool, string) {
			if p.Exited() {
				out, _ := os.ReadFile(p.log)
				t.Fatalf("the container exited:\n%s", out)
			}
			got := l.invalidLogSettings()
			return got == "255 nfnetlink_log nfnetlink_log", got
		})
		l.SendInvalid(l.A, webVIP+":80", 5)
		tcpFlags := map[string]string{"reason": "tcp_flags", "service_namespace": "lab", "service_name": "web"}
		e.Poll(t, 10*time.Second, "tcp_flags 5 of lab/web", nil, func(s Scrape) (bool, string) {
			v, _, _ := s.Value(invalidReasonTotal, tcpFlags)
			return v == 5, s.Series(invalidReasonTotal)
		})

		// podman stop sends SIGTERM, as the kubelet does.
		if out, err := podman("stop", "-t", "10", container).CombinedOutput(); err != nil {
			t.Fatalf("podman stop: %v\n%s", err, out)
		}
		b, _ := os.ReadFile(p.log)
		if got := l.invalidLogSettings(); got != before || !strings.Contains(string(b), "conntrack's INVALID log settings put back") {
			t.Errorf("settings after the container stopped: %s, want the old %s; its log:\n%s", got, before, b)
		}
	})
}
