// Command probe raises its capabilities as proxyhealth's main does and prints its capability
// sets, for TestRaiseFromFileCapabilities.
package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/proxyhealth/proxyhealth/internal/capability"
)

func main() {
	before, _ := capability.Current()
	eff, err := capability.Raise()
	fmt.Printf("before=%s\neffective=%s\nerr=%v\n", before.Effective, eff, err)
	// Every thread, not only this one.
	tasks, _ := os.ReadDir("/proc/self/task")
	for _, t := range tasks {
		b, _ := os.ReadFile("/proc/self/task/" + t.Name() + "/status")
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "CapEff:") {
				fmt.Printf("thread %s\n", strings.TrimSpace(strings.TrimPrefix(l, "CapEff:")))
			}
		}
	}
}
