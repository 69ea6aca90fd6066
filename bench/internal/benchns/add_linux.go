package benchns

import (
	"context"
	"time"

	"github.com/proxyhealth/proxyhealth/bench/internal/nsproc"
)

// Add creates network namespace name with its loopback up.
func Add(ctx context.Context, name string) error {
	if _, err := nsproc.Output(ctx, 2*time.Minute, nil, "ip", "netns", "add", name); err != nil {
		return err
	}
	_, err := nsproc.Output(ctx, 2*time.Minute, nil, "ip", "-n", name, "link", "set", "lo", "up")
	return err
}
