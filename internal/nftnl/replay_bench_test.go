package nftnl

import (
	"context"
	"testing"
)

// These benchmarks decode the recorded kube-proxy tables (iptables-nft nat, nftables mode):
// the per-rule work of a whole read (chain names told apart, rules interpreted, comments and
// chain names split into service ports) without the kernel, so its allocations are exact.

func BenchmarkReplayIPTablesNAT(b *testing.B) {
	rec := loadReplay(b, "testdata/kube-proxy-v1.36.3-nat.replay.json")
	b.ReportAllocs()
	for b.Loop() {
		if _, err := readIPTablesNAT(context.Background(), rec, nfproto(false)); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkReplayKubeProxyNFT(b *testing.B) {
	rec := loadReplay(b, "testdata/kube-proxy-v1.36.3-nftables.replay.json")
	b.ReportAllocs()
	for b.Loop() {
		if _, err := readKubeProxyNFT(context.Background(), rec, nfproto(false)); err != nil {
			b.Fatal(err)
		}
	}
}
