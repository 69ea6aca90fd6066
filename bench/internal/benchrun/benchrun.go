// Package benchrun is the frame every benchmark program runs in: a context that ends on the
// first interrupt, timestamped progress lines, the machine a report names, and the report
// printed (and saved) even when the run failed part way.
package benchrun

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/proxyhealth/proxyhealth/bench/internal/benchns"
)

// Logf writes one progress line, stamped with the time of day, to stderr.
func Logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

// SignalContext returns a context that ends on SIGINT, SIGTERM or SIGHUP, logging the signal
// and then stopping (what the program does next, e.g. "stopping and cleaning up"). stop
// releases the signals.
func SignalContext(stopping string) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	go func() {
		if s, ok := <-sigs; ok {
			Logf("%v: %s", s, stopping)
			cancel()
		}
	}()
	return ctx, func() { signal.Stop(sigs); cancel() }
}

// Finish prints the report (empty when there is none), also writes it to out when out is
// set, reports err as prog's, and returns the exit code: 130 when ctx was interrupted, 1 on
// any other failure, 0 otherwise.
func Finish(ctx context.Context, prog, report, out string, err error) int {
	if report != "" {
		fmt.Print(report)
		if out != "" {
			if werr := os.WriteFile(out, []byte(report), 0o644); werr != nil {
				fmt.Fprintln(os.Stderr, werr)
				return 1
			}
		}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", prog, err)
		if ctx.Err() != nil {
			return 130
		}
		return 1
	}
	return 0
}

// Machine says when, where and from what a report was made; reports embed it in their
// header.
type Machine struct {
	Date, Kernel, CPU string
	Cores             int
	Cmdline, Commit   string
}

// Describe fills in a Machine for a run of argv from the repository at repo.
func Describe(repo string, argv []string) Machine {
	return Machine{
		Date:    time.Now().UTC().Format(time.RFC3339),
		Kernel:  strings.TrimSpace(ReadFile("/proc/sys/kernel/osrelease")),
		CPU:     benchns.CPUModel(),
		Cores:   benchns.NumCPU(),
		Cmdline: strings.Join(argv, " "),
		Commit:  Git(repo, "describe", "--always", "--dirty"),
	}
}

// FindRepo finds the proxyhealth repository upwards from the working directory.
func FindRepo() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && bytes.Contains(b, []byte("module github.com/proxyhealth/proxyhealth\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("proxyhealth repository not found upwards from the working directory; pass --repo")
		}
		dir = parent
	}
}

// Git runs git in repo and returns its trimmed output, or "unknown": a report still prints
// without it.
func Git(repo string, args ...string) string {
	cmd := exec.Command("git", args...)
	cmd.Dir = repo
	out, err := cmd.Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
}

// ReadFile returns the file's content, or "" when it cannot be read (a /proc file of a
// process that has just exited, say).
func ReadFile(p string) string {
	b, _ := os.ReadFile(p)
	return string(b)
}

// WaitFor polls cond every 500ms until it holds, cond fails, ctx ends or timeout passes; the
// timeout error quotes cond's last detail.
func WaitFor(ctx context.Context, timeout time.Duration, what string, cond func() (ok bool, detail string, err error)) error {
	deadline := time.Now().Add(timeout)
	for {
		ok, detail, err := cond()
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s waiting for %s (last: %s)", timeout, what, Truncate(detail, 500))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// Truncate shortens s to n bytes, marking the cut.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// Program is a benchmark program, for Main.
type Program struct {
	Name     string // in messages, e.g. "apiview fanout"
	WhyRoot  string // why it must run as root, e.g. "it creates a network namespace"
	Stopping string // what it does on a signal, e.g. "stopping and cleaning up"
}

// Main runs run as program p: it refuses to run without root, runs run in a SignalContext,
// and ends as Finish does with the report run returns, printed even when run failed.
func Main(p Program, out string, run func(ctx context.Context) (report string, err error)) int {
	if os.Geteuid() != 0 {
		fmt.Fprintf(os.Stderr, "%s must run as root (%s)\n", p.Name, p.WhyRoot)
		return 2
	}
	ctx, stop := SignalContext(p.Stopping)
	defer stop()
	report, err := run(ctx)
	return Finish(ctx, p.Name, report, out, err)
}
