//go:build tools

// Package etcd pins the etcd the control-plane lab and the benchmarks run. build.sh builds it
// from this module; the blank import keeps `go mod tidy` honest.
package etcd

import _ "go.etcd.io/etcd/server/v3"
