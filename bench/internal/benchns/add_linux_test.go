package benchns

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/proxyhealth/proxyhealth/internal/testsupport/prereq"
)

// Add makes the namespace with its loopback up.
func TestAdd(t *testing.T) {
	if os.Geteuid() != 0 {
		prereq.Skip(t, "needs root to create a network namespace")
	}
	prefix := fmt.Sprintf("ph-benchns-test-%d-", os.Getpid())
	name := prefix + "add"
	if err := Add(context.Background(), name); err != nil {
		prereq.Skipf(t, "%v", err)
	}
	t.Cleanup(func() {
		if err := Delete(prefix, name); err != nil {
			t.Error(err)
		}
	})
	out, err := exec.Command("ip", "-n", name, "-o", "link", "show", "lo").CombinedOutput()
	if err != nil || !strings.Contains(string(out), ",UP") {
		t.Errorf("lo in %s: %s (%v), want it up", name, out, err)
	}
}
