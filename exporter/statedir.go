package exporter

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// prepareStateDir makes dir, the host directory where --conntrack.invalid-reasons keeps the
// node's settings, a directory of owner ("UID:GID") that no one else can read or enter.
func prepareStateDir(dir, owner string) error {
	if dir == "" {
		return errors.New("--conntrack.invalid-reasons.state-dir is empty")
	}
	uidS, gidS, ok := strings.Cut(owner, ":")
	uid, uidErr := strconv.ParseUint(uidS, 10, 31)
	gid, gidErr := strconv.ParseUint(gidS, 10, 31)
	if !ok || uidErr != nil || gidErr != nil {
		return fmt.Errorf("--owner %q: want UID:GID", owner)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("the state directory: %w", err)
	}
	// Mode first: once the directory is the owner's, changing it would need CAP_FOWNER.
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("the state directory: %w", err)
	}
	if err := os.Chown(dir, int(uid), int(gid)); err != nil {
		return fmt.Errorf("the state directory: %w", err)
	}
	return nil
}
