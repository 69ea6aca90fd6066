//go:build linux

// Command conntrack-events is a load benchmark of the conntrack event stream: it makes the
// kernel emit conntrack NEW/DESTROY events at stepped rates inside a network namespace of its
// own and measures, in alternating phases of the same run, how proxyhealth's conntrack
// collector and `conntrack -E` (conntrack-tools) keep up: events handled, CPU per event, events
// the kernel dropped for the consumer's socket, and peak RSS. It must run as root. See
// README.md.
//
// Subcommands: run (the default), gen (the flow generator, run inside the namespace) and get
// (an HTTP GET, run inside the namespace to scrape the exporter).
package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"time"
)

func main() {
	args := os.Args[1:]
	sub := "run"
	if len(args) > 0 && len(args[0]) > 0 && args[0][0] != '-' {
		sub, args = args[0], args[1:]
	}
	var err error
	switch sub {
	case "run":
		os.Exit(runMain(args))
	case "gen":
		err = runGen(args)
	case "get":
		err = runGet(args)
	case "reap":
		err = runReap(args)
	default:
		err = fmt.Errorf("unknown subcommand %q (run, gen, get, reap)", sub)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "conntrack-events %s: %v\n", sub, err)
		os.Exit(1)
	}
}

// runGet prints the body of one HTTP GET.
func runGet(args []string) error {
	if len(args) != 1 {
		return fmt.Errorf("usage: get URL")
	}
	c := &http.Client{Timeout: 15 * time.Second}
	resp, err := c.Get(args[0])
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", args[0], resp.Status)
	}
	_, err = io.Copy(os.Stdout, resp.Body)
	return err
}
