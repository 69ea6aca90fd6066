// Package collectors holds one package per proxyhealth collector and what they all share, in
// the style of node_exporter's collector package: the interfaces the exporter runs them by, how
// a metric is named and described, and the loop their background work runs in.
//
// Every collector package has the same shape: a Name constant (its --[no-]collector.<name>
// switch), a Config with AddFlags and an unexported validate that New calls and that sets no
// defaults (AddFlags sets them, those of settings that are not flags too; validate joins the
// checks in flags.go), a New(Config, *slog.Logger), and a Collector that implements Collector
// and, when it works in the background, Runner. Descriptors are built with
// internal/metricdesc, periodic work runs in internal/periodic.
package collectors

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
)

// Collector is one named source of metrics. Update runs on every scrape; it must only read
// cheap state (sysctls, a netlink stats query, a snapshot published by background work) and
// never wait on the API server or on iptables-save. It sends whatever it could read and returns
// an error describing what it could not; the exporter then reports the collector as failing.
type Collector interface {
	Update(ch chan<- prometheus.Metric) error
	// Describe sends the descriptor of every metric Update may send, whether or not this
	// node produces it now; the metrics reference test compares them with the README.
	Describe(ch chan<- *prometheus.Desc)
}

// Runner is implemented by collectors that do background work (an event stream, a periodic
// check). The exporter calls Run once in its own goroutine; Run returns when ctx is done.
type Runner interface {
	Run(ctx context.Context)
}
