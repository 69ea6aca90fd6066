package hostrules

import (
	"fmt"
	"os"
	"os/exec"
	"testing"
)

const inNetnsEnv = "PROXYHEALTH_TEST_NETNS"

// TestMain re-runs the package's tests inside a new network namespace when it can (root and
// unshare(1) present), so the kernel tests change rules only there.
func TestMain(m *testing.M) {
	if os.Getenv(inNetnsEnv) == "" && os.Geteuid() == 0 {
		if unshare, err := exec.LookPath("unshare"); err == nil {
			cmd := exec.Command(unshare, append([]string{"--net", "--", os.Args[0]}, os.Args[1:]...)...)
			cmd.Env = append(os.Environ(), inNetnsEnv+"=1")
			cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
			if err := cmd.Run(); err != nil {
				if ee, ok := err.(*exec.ExitError); ok {
					os.Exit(ee.ExitCode())
				}
				fmt.Fprintln(os.Stderr, "unshare:", err)
				os.Exit(1)
			}
			os.Exit(0)
		}
	}
	os.Exit(m.Run())
}

func TestNFTGenerationFollowsChanges(t *testing.T) {
	if os.Getenv(inNetnsEnv) != "1" {
		t.Skip("needs root and unshare(1) to run in a network namespace of its own")
	}
	if _, err := exec.LookPath("iptables-nft"); err != nil {
		t.Skip("iptables-nft not installed")
	}
	g1, err := nftGeneration()
	if err != nil {
		t.Fatal(err)
	}
	if g2, err := nftGeneration(); err != nil || g2 != g1 {
		t.Fatalf("generation moved without a change: %d then %d (%v)", g1, g2, err)
	}
	if out, err := exec.Command("iptables-nft", "-t", "nat", "-N", "KUBE-SERVICES").CombinedOutput(); err != nil {
		t.Fatalf("iptables-nft: %v: %s", err, out)
	}
	if g3, err := nftGeneration(); err != nil || g3 == g1 {
		t.Errorf("generation after a rule change = %d (%v), want other than %d", g3, err, g1)
	}
}
