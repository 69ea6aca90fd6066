package conntrack

import (
	"errors"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// The kernel's answers when a privilege or module is missing: conntrack is built into the
// development kernel, so the module cases are injected here.
func TestDescribeNetlinkError(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{unix.EPERM, "needs CAP_NET_ADMIN"},
		{unix.EACCES, "needs CAP_NET_ADMIN"},
		{unix.EPROTONOSUPPORT, "is nf_conntrack_netlink loaded?"},
		{unix.ENOENT, "is nf_conntrack_netlink loaded?"},
		{unix.EOPNOTSUPP, "is nf_conntrack_netlink loaded?"},
		{unix.EIO, "input/output error"},
	} {
		err := describeNetlinkError("open conntrack netlink socket", tc.err)
		if !strings.Contains(err.Error(), tc.want) || !errors.Is(err, tc.err) {
			t.Errorf("%v: got %q, want it to say %q and wrap the errno", tc.err, err, tc.want)
		}
	}
}
