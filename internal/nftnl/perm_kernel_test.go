package nftnl

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"testing"

	"github.com/proxyhealth/proxyhealth/internal/nftnl/nftnltest"
	"github.com/proxyhealth/proxyhealth/internal/testsupport/prereq"
)

const noCapEnv = "PROXYHEALTH_NFTNL_NOCAP"

// Without CAP_NET_ADMIN every read fails with ErrPermission, not a bare errno or an empty
// result: the test binary re-runs this test with the capability dropped from its bounding set.
func TestKernelNoCapability(t *testing.T) {
	if os.Getenv(noCapEnv) == "1" {
		ctx := context.Background()
		if _, err := Generation(ctx); !errors.Is(err, ErrPermission) {
			t.Errorf("Generation: %v, want ErrPermission", err)
		}
		if _, err := ReadIPTablesNAT(ctx, false, Limits{}); !errors.Is(err, ErrPermission) {
			t.Errorf("ReadIPTablesNAT: %v, want ErrPermission", err)
		}
		if _, err := ReadKubeProxyNFT(ctx, false, Limits{}); !errors.Is(err, ErrPermission) {
			t.Errorf("ReadKubeProxyNFT: %v, want ErrPermission", err)
		} else {
			t.Logf("error text: %v", err)
		}
		var fr ForwardReader
		if _, err := fr.Read(ctx, nil); !errors.Is(err, ErrPermission) {
			t.Errorf("ForwardReader.Read: %v, want ErrPermission", err)
		}
		if _, err := Watch(ctx, nil); !errors.Is(err, ErrPermission) {
			t.Errorf("Watch: %v, want ErrPermission", err)
		}
		return
	}
	needNetns(t)
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		prereq.Skip(t, "setpriv not installed")
	}
	nftnltest.Flush(t)
	nftnltest.LoadIPTablesSave(t, readFile(t, natCapture), false)
	cmd := exec.Command(setpriv, "--bounding-set=-net_admin", "--inh-caps=-net_admin", "--",
		os.Args[0], "-test.run=^TestKernelNoCapability$", "-test.v")
	cmd.Env = append(os.Environ(), noCapEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("without CAP_NET_ADMIN: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}
