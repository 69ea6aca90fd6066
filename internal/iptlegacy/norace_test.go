//go:build !race

package iptlegacy

// raceEnabled is whether the test binary is built with the race detector.
const raceEnabled = false
