package kubeproxyrun

import (
	"slices"
	"testing"
)

// The kubeconfig comes first, so that Args(...)[2:] is the command line without it.
func TestArgs(t *testing.T) {
	args := Args("/tmp/kp.kubeconfig", "nftables")
	if !slices.Equal(args[:2], []string{"--kubeconfig", "/tmp/kp.kubeconfig"}) || !slices.Contains(args, "nftables") || slices.Contains(args[2:], "/tmp/kp.kubeconfig") {
		t.Errorf("Args = %v", args)
	}
}
