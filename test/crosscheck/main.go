// Command crosscheck type-checks packages, and everything they import, for other platforms
// than the machine's, from source: what `GOOS=… GOARCH=… go build` would reject for a
// platform's build tags or its system interfaces, without compiling the whole dependency graph
// once more for each platform (minutes each on a 2-core machine). `make cross` still builds;
// this is the cheaper check `make test` runs for the platforms only the kubectl plugin ships
// to, which, like everything here, is pure Go (no cgo, no assembly of its own).
//
// A module of its own, so that go/packages stays out of the exporter's go.mod; -C names the
// module whose packages it checks:
//
//	cd test/crosscheck && go run . -C ../.. [-platforms darwin/arm64,windows/amd64] ./cmd/kubectl-proxyhealth
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"golang.org/x/tools/go/packages"
)

func main() {
	platforms := flag.String("platforms", "darwin/arm64,windows/amd64", "comma-separated GOOS/GOARCH pairs")
	dir := flag.String("C", ".", "the directory the package patterns are relative to (its module is checked)")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: crosscheck [-C dir] [-platforms os/arch,...] packages...\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	failed := false
	for _, p := range strings.Split(*platforms, ",") {
		goos, goarch, ok := strings.Cut(strings.TrimSpace(p), "/")
		if !ok || goos == "" || goarch == "" {
			fmt.Fprintf(os.Stderr, "crosscheck: platform %q is not GOOS/GOARCH\n", p)
			os.Exit(2)
		}
		n, err := check(*dir, goos, goarch, flag.Args())
		if err != nil {
			fmt.Fprintf(os.Stderr, "crosscheck: %s/%s: %v\n", goos, goarch, err)
			failed = true
			continue
		}
		fmt.Printf("crosscheck: %s/%s: %d packages type-check\n", goos, goarch, n)
	}
	if failed {
		os.Exit(1)
	}
}

// check loads the packages matching patterns and all their dependencies for goos/goarch, and
// type-checks each from source (NeedDeps without NeedExportFile: no compiler runs), with go
// list run in dir. It returns
// how many packages it checked, or an error listing every package error.
func check(dir, goos, goarch string, patterns []string) (int, error) {
	cfg := &packages.Config{
		Mode: packages.NeedName | packages.NeedFiles | packages.NeedImports | packages.NeedDeps |
			packages.NeedSyntax | packages.NeedTypes,
		Dir: dir,
		Env: append(os.Environ(), "GOOS="+goos, "GOARCH="+goarch, "CGO_ENABLED=0"),
	}
	roots, err := packages.Load(cfg, patterns...)
	if err != nil {
		return 0, fmt.Errorf("load: %w", err)
	}
	var errs []string
	n := 0
	packages.Visit(roots, nil, func(p *packages.Package) {
		n++
		for _, e := range p.Errors {
			errs = append(errs, e.Error())
		}
	})
	if len(errs) > 0 {
		return n, fmt.Errorf("%d errors:\n\t%s", len(errs), strings.Join(errs, "\n\t"))
	}
	return n, nil
}
