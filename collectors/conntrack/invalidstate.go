package conntrack

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// invalidStateFile is the name, in --conntrack.invalid-reasons.state-dir, of the file that
// keeps the node's own values of the INVALID log settings while the exporter has them changed.
const invalidStateFile = "conntrack-invalid-log.json"

// invalidState is that file's content: the values the settings had before the first exporter
// changed them, and the boot and network namespace they belong to. It is written before any
// setting changes and removed once they are put back, so a process that ends any other way
// (SIGKILL, an OOM kill, a panic, a grace period overrun) leaves it for the next start, which
// puts back these values rather than the ones the crash left.
type invalidState struct {
	// BootID and Netns say where the values hold: a file from before a reboot, or of another
	// network namespace, describes no setting here.
	BootID string `json:"boot_id"`
	Netns  string `json:"netns"`
	// Settings are the values by setting, keyed by the path under procfs
	// ("sys/net/netfilter/nf_log/2").
	Settings map[string]string `json:"settings"`
}

// invalidStateStore reads and writes the state file in dir; "" keeps nothing.
type invalidStateStore struct{ dir string }

func (s invalidStateStore) path() string { return filepath.Join(s.dir, invalidStateFile) }

// where is this boot's and network namespace's identity, "" for what cannot be read. The
// namespace is the process's own: that of the settings it changes (/proc/sys/net resolves to
// the namespace of the process that opens it), whatever --path.procfs says.
func (s invalidStateStore) where() (bootID, netns string) {
	if b, err := os.ReadFile("/proc/sys/kernel/random/boot_id"); err == nil {
		bootID = strings.TrimSpace(string(b))
	}
	if link, err := os.Readlink("/proc/self/ns/net"); err == nil {
		netns = link
	}
	return bootID, netns
}

// load returns the saved values, nil when there are none for this boot and namespace.
func (s invalidStateStore) load() (map[string]string, error) {
	if s.dir == "" {
		return nil, nil
	}
	b, err := os.ReadFile(s.path())
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the saved settings: %w", err)
	}
	var st invalidState
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("reading the saved settings %s: %w", s.path(), err)
	}
	bootID, netns := s.where()
	if st.BootID != bootID || st.Netns != netns {
		return nil, nil
	}
	return st.Settings, nil
}

// save writes the values, whole or not at all (a new file renamed over the old), readable and
// writable by the exporter's user only, and on disk before it returns.
func (s invalidStateStore) save(settings map[string]string) error {
	if s.dir == "" {
		return nil
	}
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return fmt.Errorf("the state directory (--conntrack.invalid-reasons.state-dir): %w", err)
	}
	bootID, netns := s.where()
	b, err := json.Marshal(invalidState{BootID: bootID, Netns: netns, Settings: settings})
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(s.dir, invalidStateFile+".*")
	if err != nil {
		return fmt.Errorf("saving the settings in %s (--conntrack.invalid-reasons.state-dir): %w", s.dir, err)
	}
	defer os.Remove(tmp.Name()) // after the rename, a no-op
	_, err = tmp.Write(b)
	if err == nil {
		err = tmp.Sync()
	}
	if closeErr := tmp.Close(); err == nil {
		err = closeErr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), s.path())
	}
	if err == nil {
		err = syncDir(s.dir)
	}
	if err != nil {
		return fmt.Errorf("saving the settings in %s (--conntrack.invalid-reasons.state-dir): %w", s.dir, err)
	}
	return nil
}

// remove deletes the file once the settings are back.
func (s invalidStateStore) remove() error {
	if s.dir == "" {
		return nil
	}
	if err := os.Remove(s.path()); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing the saved settings: %w", err)
	}
	return syncDir(s.dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if closeErr := d.Close(); err == nil {
		err = closeErr
	}
	return err
}
