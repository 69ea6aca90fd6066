//go:build !race

package iptables

const raceEnabled = false
