//go:build linux

package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/proxyhealth/proxyhealth/bench/internal/benchns"
	"github.com/proxyhealth/proxyhealth/bench/internal/benchrun"
	"github.com/proxyhealth/proxyhealth/bench/internal/nsproc"
	"github.com/proxyhealth/proxyhealth/internal/testsupport/netnsdial"
)

// nsPrefix marks this benchmark's namespaces. bench/conntrack-events removes every ph-bench-*
// namespace it finds at its start, so both take the same lock (/run/ph-bench.lock) and never
// run at once.
const nsPrefix = "ph-bench-rd-"

func newNSName(role string) string { return benchns.NewName(nsPrefix + role + "-") }

// run runs a command with a deadline; its combined output is in the error.
func run(ctx context.Context, stdin []byte, name string, args ...string) (string, error) {
	return nsproc.Output(ctx, 10*time.Minute, stdin, name, args...)
}

// timed is one run of a child process: its wall time, CPU (user and system, from its
// rusage) and peak RSS (rusage maxrss).
type timed struct {
	Wall, User, Sys time.Duration
	MaxRSSKiB       int64
	Out             []byte
}

// runTimed runs name in namespace ns and measures it, through this program's measure
// subcommand: a child's rusage maxrss starts from the peak RSS of the process it was forked
// from (the kernel records the old memory map's high-water mark at exec), and this process
// holds the generated rules; the small measure process is what the child is forked from
// instead. `ip netns exec` does not fork: it enters the namespace and execs name, so the
// rusage is name's own, with the measure process's few MiB as its floor (reported).
func runTimed(ctx context.Context, ns string, stdin []byte, name string, args ...string) (timed, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	self, err := os.Executable()
	if err != nil {
		return timed{}, err
	}
	rf, err := os.CreateTemp("", "ph-bench-rd-rusage-")
	if err != nil {
		return timed{}, err
	}
	rf.Close()
	defer os.Remove(rf.Name())
	argv := append([]string{"measure", rf.Name(), "ip", "netns", "exec", ns, name}, args...)
	if ns == "" {
		argv = append([]string{"measure", rf.Name(), name}, args...)
	}
	cmd := exec.CommandContext(ctx, self, argv...)
	var out, errb bytes.Buffer
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	} else {
		out.Grow(64 << 20)
	}
	cmd.Stdout, cmd.Stderr = &out, &errb
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Run(); err != nil {
		return timed{}, fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, benchrun.Truncate(errb.String()+out.String(), 2000))
	}
	b, err := os.ReadFile(rf.Name())
	if err != nil {
		return timed{}, err
	}
	var t timed
	var wall, user, sys int64
	if _, err := fmt.Sscan(string(b), &wall, &user, &sys, &t.MaxRSSKiB); err != nil {
		return timed{}, fmt.Errorf("reading %s's rusage %q: %w", name, b, err)
	}
	t.Wall, t.User, t.Sys = time.Duration(wall), time.Duration(user), time.Duration(sys)
	t.Out = out.Bytes()
	return t, nil
}

// runMeasure is the measure subcommand: measure FILE CMD ARGS... runs CMD with this process's
// standard streams and writes its wall time, user and system CPU (nanoseconds) and rusage
// maxrss (KiB) to FILE.
func runMeasure(args []string) error {
	if len(args) < 2 {
		return fmt.Errorf("usage: measure FILE CMD [ARGS...]")
	}
	cmd := exec.Command(args[1], args[2:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	start := time.Now()
	err := cmd.Run()
	wall := time.Since(start)
	if err != nil {
		return err
	}
	ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	if !ok {
		return fmt.Errorf("no rusage")
	}
	return os.WriteFile(args[0], []byte(fmt.Sprintf("%d %d %d %d\n", wall.Nanoseconds(),
		time.Duration(ru.Utime.Nano()).Nanoseconds(), time.Duration(ru.Stime.Nano()).Nanoseconds(), ru.Maxrss)), 0o600)
}

// nsGet fetches url from inside namespace ns.
func nsGet(ns, url string) (string, error) {
	c := netnsdial.HTTPClient(ns, 10*time.Second)
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return string(b), fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return string(b), err
}
