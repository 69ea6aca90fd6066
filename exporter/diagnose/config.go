// Package diagnose is `proxyhealth diagnose`: its flags and exit codes, one look at the node
// over a window (Diagnosis), and the printing of what it found. The exporter builds the
// collectors it looks through and hands their readings over as a Diagnosis's functions.
package diagnose

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/prometheus/common/promslog"

	"github.com/proxyhealth/proxyhealth/internal/verdict"
)

// Exit codes of diagnose: the verdict's (verdict.Verdict.ExitCode), the plugin's too; it exits
// as for an unknown verdict when it cannot diagnose at all.
const (
	ExitNoFinding      = verdict.ExitHealthy
	ExitWarnings       = verdict.ExitWarnings
	ExitCritical       = verdict.ExitCritical
	ExitCannotDiagnose = verdict.ExitUnknown
)

// Help is the diagnose command's help.
const Help = `Judge this node once, locally, without a running exporter, and print the findings: the same causes, evidence and runbooks as the exporter's /status. It reads the node's counters twice, --window apart, and counts a difference between kube-proxy's rules and the API as stale rules only when it lasted the whole window. Exit code, as the verdict: 0 healthy (no finding), 1 warning (only warnings), 2 critical (a critical finding), 3 unknown: it could not diagnose (usage, privileges), or a cause could not be checked and nothing critical was found (the message says why).`

// Config is diagnose's own flags; the exporter's flags (kubeconfig, node name, kube-proxy
// endpoints and log, collectors) apply as well.
type Config struct {
	Window      time.Duration
	Output      string
	Service     string
	LogSince    time.Duration
	SyncTimeout time.Duration
}

// AddFlags adds diagnose's flags to its command.
func AddFlags(cmd *kingpin.CmdClause) *Config {
	c := &Config{}
	cmd.Flag("window", "How long to watch: counters are read at its start and end, and a difference between kube-proxy's rules and the API must last all of it to count as stale rules rather than sync lag.").
		Default("15s").DurationVar(&c.Window)
	cmd.Flag("output", "Output format: text, or json in the /status schema.").Default("text").EnumVar(&c.Output, "text", "json")
	cmd.Flag("service", "Show this Service side by side, per port: the endpoints the API wants on this node and those kube-proxy programmed, by address, and its unreplied flows (NAMESPACE/NAME).").
		PlaceHolder("NAMESPACE/NAME").StringVar(&c.Service)
	cmd.Flag("log-since", "How far back kube-proxy's log is read for list/watch failures (the last 16 MiB of each file at most).").
		Default("1h").DurationVar(&c.LogSince)
	cmd.Flag("sync-timeout", "How long to wait for the API view to sync and the node's rules to be read before the window starts.").
		Default("30s").DurationVar(&c.SyncTimeout)
	return c
}

// Validate tells the first bad flag value.
func (c *Config) Validate() error {
	switch {
	case c.Window < 0:
		return errors.New("--window must not be negative")
	case c.LogSince <= 0:
		return errors.New("--log-since must be positive")
	case c.SyncTimeout < 0:
		return errors.New("--sync-timeout must not be negative")
	}
	if c.Service != "" {
		if _, _, err := SplitService(c.Service); err != nil {
			return err
		}
	}
	return nil
}

// SplitService splits --service's NAMESPACE/NAME.
func SplitService(s string) (namespace, name string, err error) {
	namespace, name, ok := strings.Cut(s, "/")
	if !ok || namespace == "" || name == "" || strings.Contains(name, "/") {
		return "", "", fmt.Errorf("--service %q: want NAMESPACE/NAME", s)
	}
	return namespace, name, nil
}

// Wanted tells whether the command line asks for diagnose, for the exit code of a
// command line that does not parse.
func Wanted(args []string) bool {
	for _, a := range args {
		if a == "diagnose" {
			return true
		}
		if a == "--" {
			break
		}
	}
	return false
}

// Logger logs to stderr, errors only unless --log.level was given: the
// findings are the output.
func Logger(args []string, cfg *promslog.Config) *slog.Logger {
	given := slices.ContainsFunc(args, func(a string) bool { return a == "--log.level" || strings.HasPrefix(a, "--log.level=") })
	if !given {
		cfg.Level = promslog.NewLevel()
		_ = cfg.Level.Set("error")
	}
	cfg.Writer = os.Stderr
	return promslog.New(cfg)
}
