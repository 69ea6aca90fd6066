package hostrules

import (
	"os"
	"testing"

	"github.com/proxyhealth/proxyhealth/internal/nftnl/nftnltest"
)

// TestMain re-runs the package's tests inside a network namespace of their own when it can
// (root and unshare(1)), so the kernel tests change rules only there.
func TestMain(m *testing.M) {
	nftnltest.ReexecInNetns()
	os.Exit(m.Run())
}
