package exporter

import (
	"slices"
	"testing"

	"github.com/proxyhealth/proxyhealth/internal/verdict"
)

// The rules collector's per-family counts ([0] IPv4, [1] IPv6) become the verdict's split, for
// the families that differ only.
func TestByFamily(t *testing.T) {
	for _, c := range []struct {
		stale, missing [2]int
		want           []verdict.FamilyDrift
	}{
		{[2]int{0, 0}, [2]int{0, 0}, nil},
		{[2]int{1, 0}, [2]int{2, 0}, []verdict.FamilyDrift{{Family: "IPv4", StaleCount: 1, MissingCount: 2}}},
		{[2]int{0, 2}, [2]int{0, 3}, []verdict.FamilyDrift{{Family: "IPv6", StaleCount: 2, MissingCount: 3}}},
		{[2]int{0, 1}, [2]int{1, 0}, []verdict.FamilyDrift{{Family: "IPv4", MissingCount: 1}, {Family: "IPv6", StaleCount: 1}}},
	} {
		if got := byFamily(c.stale, c.missing); !slices.Equal(got, c.want) {
			t.Errorf("byFamily(%v, %v) = %+v, want %+v", c.stale, c.missing, got, c.want)
		}
	}
}
