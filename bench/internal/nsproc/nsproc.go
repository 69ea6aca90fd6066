//go:build linux

// Package nsproc runs the benchmarks' long-lived processes (etcd, kube-apiserver, kube-proxy,
// the exporter) inside a network namespace, each with its output in a log file, and reads
// their memory.
package nsproc

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// stopGrace is how long Stop waits after SIGTERM before it kills.
const stopGrace = 5 * time.Second

// Proc is one process started by Start.
type Proc struct {
	Name string
	Cmd  *exec.Cmd
	Log  string // its stdout and stderr
	done chan struct{}
}

// Start runs args in namespace ns with its output in dir/name.log; `ip netns exec` execs it,
// so the pid is its own. With no namespace, args runs as it is (for a wrapper that enters the
// namespace itself).
func Start(ns, dir, name string, args ...string) (*Proc, error) {
	p := &Proc{Name: name, Log: filepath.Join(dir, name+".log"), done: make(chan struct{})}
	f, err := os.Create(p.Log)
	if err != nil {
		return nil, err
	}
	if ns == "" {
		p.Cmd = exec.Command(args[0], args[1:]...)
	} else {
		p.Cmd = exec.Command("ip", append([]string{"netns", "exec", ns}, args...)...)
	}
	p.Cmd.Stdout, p.Cmd.Stderr = f, f
	// No Pdeathsig: it fires when the OS thread that started the child exits, and dialing into
	// a namespace makes the runtime discard threads. What outlives the benchmark is killed with
	// the namespace at the next run's start.
	p.Cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.Cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	go func() { _ = p.Cmd.Wait(); f.Close(); close(p.done) }()
	return p, nil
}

// Done is closed once the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Exited says whether the process has exited.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Pid is the process's id.
func (p *Proc) Pid() int { return p.Cmd.Process.Pid }

// Stop ends the process: SIGTERM, then SIGKILL after a grace period. A nil or exited Proc is
// left alone.
func (p *Proc) Stop() {
	if p == nil || p.Exited() {
		return
	}
	_ = p.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(stopGrace):
		_ = p.Cmd.Process.Kill()
		<-p.done
	}
}

// Tail is the end of the process's log, for error messages.
func (p *Proc) Tail() string {
	b, _ := os.ReadFile(p.Log)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// Memory is a process's resident memory at one moment, in KiB.
type Memory struct{ RSSKiB, HWMKiB int64 }

// Max is the larger of each figure of m and o.
func (m Memory) Max(o Memory) Memory {
	return Memory{max(m.RSSKiB, o.RSSKiB), max(m.HWMKiB, o.HWMKiB)}
}

// Memory is the process's memory now; zero once it has exited.
func (p *Proc) Memory() Memory {
	m, _ := Status(p.Pid())
	return m
}

// Status reads VmRSS and VmHWM of process pid.
func Status(pid int) (Memory, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return Memory{}, err
	}
	var m Memory
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		switch f[0] {
		case "VmRSS:":
			m.RSSKiB, _ = strconv.ParseInt(f[1], 10, 64)
		case "VmHWM:":
			m.HWMKiB, _ = strconv.ParseInt(f[1], 10, 64)
		}
	}
	return m, nil
}

// Output runs a short command (ip, iptables-restore, ...) to its end, within timeout, with
// stdin when it is not nil; its combined output is returned, and quoted in the error.
func Output(ctx context.Context, timeout time.Duration, stdin []byte, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.CombinedOutput()
	if err != nil {
		msg := strings.TrimSpace(string(out))
		if len(msg) > 2000 {
			msg = msg[:2000] + "..."
		}
		return string(out), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, msg)
	}
	return string(out), nil
}
