//go:build race

package iptables

const raceEnabled = true
