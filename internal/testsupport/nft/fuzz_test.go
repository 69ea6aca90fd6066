package nft

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzParse checks that no input makes Parse, InvalidDropReachable or the rule readers panic.
func FuzzParse(f *testing.F) {
	files, err := filepath.Glob(filepath.Join("testdata", "*.json"))
	if err != nil {
		f.Fatal(err)
	}
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(string(b))
	}
	f.Add(`{"nftables": []}`)
	f.Add(`{"nftables": [{"table": {"family": "ip", "name": "t"}}, {"chain": {"family": "ip", "table": "t", "name": "c", "hook": "forward", "prio": "filter"}}, {"rule": {"family": "ip", "table": "t", "chain": "c", "expr": [{"vmap": {"key": {"ct": {"key": "state"}}, "data": {"set": [[{"set": ["invalid"]}, {"goto": {"target": "c"}}]]}}}]}}]}`)
	f.Add(`{"nftables": [{"table": {"family": "ip", "name": "t"}}, {"chain": {"family": "ip", "table": "t", "name": "c", "hook": "forward"}}, {"rule": {"family": "ip", "table": "t", "chain": "c", "expr": [{"match": {"op": "==", "left": {"&": [{"ct": {"key": "state"}}, [[[[[[[[[[["invalid"]]]]]]]]]]]]}, "right": 0}}, {"drop": null}, 5, null, {}]}}]}`)
	f.Fuzz(func(t *testing.T, in string) {
		rs, err := Parse(strings.NewReader(in))
		if err != nil {
			return
		}
		InvalidDropReachable(rs)
		for _, tb := range rs.Tables {
			tb.IptablesNFT()
			for _, c := range tb.Chains {
				for _, r := range c.Rules {
					_ = r.String()
					r.DNATTargets()
					r.JumpTargets()
				}
			}
		}
	})
}
