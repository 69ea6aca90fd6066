//go:build tools

// Package lint pins grafana's dashboard-linter. build.sh builds it from this
// module; the blank import keeps `go mod tidy` honest.
package lint

import (
	_ "github.com/grafana/dashboard-linter"
)
