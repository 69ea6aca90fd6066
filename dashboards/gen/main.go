// Command gen writes proxyhealth's Grafana dashboards, as committed under dashboards/:
//
//	go run ./dashboards/gen            # from the repository root
//	go run ./dashboards/gen -out DIR
//
// The dashboards are code so that every panel gets the same variables, selectors and
// conventions; `go test ./dashboards/gen` fails when the committed JSON is not what this
// writes.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
)

func main() {
	out := flag.String("out", "dashboards", "directory to write the dashboards to")
	flag.Parse()
	if err := write(*out); err != nil {
		fmt.Fprintln(os.Stderr, "gen:", err)
		os.Exit(1)
	}
}

func write(dir string) error {
	files := Files()
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		b, err := files[name].JSON()
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}
