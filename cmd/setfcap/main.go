// Command setfcap sets or prints file capabilities, as setcap and getcap do, for the image
// build: the image's last stage has no shell and no libcap tools, and the build stage may be
// replaced by a directory of binaries (make image).
//
//	setfcap SPEC FILE...   gives each FILE the capabilities SPEC ("cap_net_admin,cap_net_raw=p")
//	setfcap -print FILE... prints each FILE's capabilities
package main

import (
	"fmt"
	"os"

	"github.com/proxyhealth/proxyhealth/internal/capability"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "setfcap:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) < 2 {
		return fmt.Errorf("usage: setfcap SPEC FILE... | setfcap -print FILE...")
	}
	if args[0] == "-print" {
		for _, path := range args[1:] {
			f, ok, err := capability.ReadFile(path)
			if err != nil {
				return err
			}
			if !ok {
				fmt.Printf("%s: none\n", path)
				continue
			}
			fmt.Printf("%s %s\n", path, f)
		}
		return nil
	}
	f, err := capability.ParseFile(args[0])
	if err != nil {
		return err
	}
	for _, path := range args[1:] {
		if err := capability.WriteFile(path, f); err != nil {
			return err
		}
		got, ok, err := capability.ReadFile(path)
		if err != nil {
			return err
		}
		if !ok || got != f {
			return fmt.Errorf("%s: has %s after setting %s", path, got, f)
		}
		fmt.Printf("%s %s\n", path, got)
	}
	return nil
}
