package cluster

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"

	"k8s.io/klog/v2"
)

// client-go's reflectors report list and watch failures through klog, whose logger is the
// process's. klog's setter is not safe while anything logs, so it is set once, to a handler
// that forwards to the logger of the Cluster that ran last: a process (a test's) may run one
// Cluster after another while the first one's reflectors still wind down.
var (
	klogOnce    sync.Once
	klogHandler atomic.Pointer[slog.Handler]
)

// routeKlog sends client-go's klog output to logger from now on.
func routeKlog(logger *slog.Logger) {
	h := logger.Handler()
	klogHandler.Store(&h)
	klogOnce.Do(func() { klog.SetSlogLogger(slog.New(klogForwarder{})) })
}

// klogForwarder is a slog.Handler that hands each record to klogHandler's handler of the
// moment, with the attributes and groups added to it since.
type klogForwarder struct {
	derive []func(slog.Handler) slog.Handler
}

func (f klogForwarder) target() slog.Handler {
	h := *klogHandler.Load()
	for _, d := range f.derive {
		h = d(h)
	}
	return h
}

func (f klogForwarder) Enabled(ctx context.Context, level slog.Level) bool {
	return (*klogHandler.Load()).Enabled(ctx, level)
}

func (f klogForwarder) Handle(ctx context.Context, r slog.Record) error {
	return f.target().Handle(ctx, r)
}

func (f klogForwarder) WithAttrs(attrs []slog.Attr) slog.Handler {
	return f.with(func(h slog.Handler) slog.Handler { return h.WithAttrs(attrs) })
}

func (f klogForwarder) WithGroup(name string) slog.Handler {
	return f.with(func(h slog.Handler) slog.Handler { return h.WithGroup(name) })
}

func (f klogForwarder) with(d func(slog.Handler) slog.Handler) klogForwarder {
	return klogForwarder{derive: append(f.derive[:len(f.derive):len(f.derive)], d)}
}
