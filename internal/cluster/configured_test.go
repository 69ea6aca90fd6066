package cluster

import (
	"path/filepath"
	"testing"
	"time"
)

func TestConfigured(t *testing.T) {
	t.Setenv("KUBECONFIG", "")
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	c, err := New(Config{NodeName: "n", FreshWithin: time.Second, ProbeInterval: time.Second}, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	if c.Configured() {
		t.Error("no API anywhere: Configured() = true")
	}
	// A kubeconfig named but unreadable is configured, and failing.
	c, err = New(Config{Kubeconfig: filepath.Join(t.TempDir(), "absent"), NodeName: "n", FreshWithin: time.Second, ProbeInterval: time.Second}, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	if !c.Configured() {
		t.Error("--kubeconfig given: Configured() = false")
	}
}
