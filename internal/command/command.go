// Package command runs the outside programs proxyhealth reads the node with (iptables-save,
// nft), so that a failure says why: the program's own words from its standard error.
package command

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
)

// Runner runs a command and returns its standard output. Collectors take one so that tests
// can inject fakes or run the real binaries inside a network namespace.
type Runner func(ctx context.Context, name string, args ...string) ([]byte, error)

// Run runs name with args. The error of a command that ran and failed carries the first lines
// of its standard error (e.g. "Permission denied (you must be root)"); one stopped by ctx says
// so. Callers add which command it was.
func Run(ctx context.Context, name string, args ...string) ([]byte, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%w (%v)", ctx.Err(), err)
		}
		if msg := strings.TrimSpace(stderr.String()); msg != "" {
			return nil, fmt.Errorf("%w: %s", err, firstLines(msg, 3))
		}
		return nil, err
	}
	return stdout.Bytes(), nil
}

func firstLines(s string, n int) string {
	lines := strings.SplitN(s, "\n", n+1)
	if len(lines) > n {
		lines = lines[:n]
	}
	return strings.Join(lines, "; ")
}
