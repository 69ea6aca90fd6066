package iptlegacy

import (
	"os"
	"path/filepath"
	"testing"
)

func TestTableExists(t *testing.T) {
	dir := t.TempDir()
	if ok, err := TableExists(dir, false, "nat"); ok || err != nil {
		t.Errorf("no ip_tables_names: %v, %v; want false, nil", ok, err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "net"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "net", "ip_tables_names"), []byte("filter\nnat\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for table, want := range map[string]bool{"nat": true, "filter": true, "mangle": false} {
		if ok, err := TableExists(dir, false, table); ok != want || err != nil {
			t.Errorf("%s: %v, %v; want %v", table, ok, err, want)
		}
	}
	if ok, _ := TableExists(dir, true, "nat"); ok {
		t.Error("IPv6 read the IPv4 list")
	}
	// Unreadable (a directory where the file should be, so that it fails even as root).
	if err := os.Mkdir(filepath.Join(dir, "net", "ip6_tables_names"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := TableExists(dir, true, "nat"); err == nil {
		t.Error("unreadable list: no error")
	}
}
