//go:build tools

// Package kube pins the Kubernetes components the lab runs, at one version. build.sh builds
// them from this module; the blank imports keep `go mod tidy` honest.
package kube

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
)
