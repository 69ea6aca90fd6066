//go:build !race

package kubeproxy

const raceEnabled = false
