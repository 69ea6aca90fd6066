package rules

import (
	"bytes"
	"runtime"
	"testing"
)

// The rules kept between checks must not hold on to the save output or the parsed ruleset:
// at 10,000 services those are tens of megabytes, the endpoints a few.
func TestProgrammedRulesDoNotRetainTheParse(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a large table")
	}
	nat, _ := generateCluster(2000, 10)
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	var kept *iptablesRules
	func() {
		r, _, err := readIPTablesNAT(bytes.NewReader(nat))
		if err != nil {
			t.Fatal(err)
		}
		kept = r
	}()
	nat = nil
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	grown := int64(after.HeapInuse) - int64(before.HeapInuse)
	t.Logf("heap kept by the rules of 2,000 services x 10 endpoints: %d KiB (%d chains)", grown>>10, len(kept.chains))
	if grown > 8<<20 {
		t.Errorf("the programmed rules keep %d MiB of heap: they hold on to the parse", grown>>20)
	}
	runtime.KeepAlive(kept)
}
