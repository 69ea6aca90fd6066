package nftnl

import (
	"context"
	"reflect"
	"testing"

	"github.com/proxyhealth/proxyhealth/internal/ruleset"
)

// Replay's reads are the package's own reads of the same recording: a Follower's whole read of
// each proxy table, and a ForwardReader's first read.
func TestReplayEntryPoints(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		path  string
		table Table
		read  func(context.Context, querier, uint8) (*ruleset.ProxyTable, error)
	}{
		{"testdata/kube-proxy-v1.36.3-nat.replay.json", natV4, readIPTablesNAT},
		{"testdata/kube-proxy-v1.36.3-nftables.replay.json", Table{Family: nfproto(false), Name: kubeProxyTable}, readKubeProxyNFT},
	} {
		r, err := NewReplay(readFile(t, tc.path))
		if err != nil {
			t.Fatal(err)
		}
		got, err := r.ProxyTable(ctx, tc.table)
		if err != nil {
			t.Fatalf("%s: %v", tc.path, err)
		}
		want, err := tc.read(ctx, loadReplay(t, tc.path), tc.table.Family)
		if err != nil {
			t.Fatal(err)
		}
		if got == nil || !reflect.DeepEqual(got.Content(), want.Content()) {
			t.Errorf("%s: Replay.ProxyTable read\n%+v\nwant\n%+v", tc.path, got, want)
		}
	}

	const graphs = "testdata/graph-iptables-iptables-nft-save-kube-proxy.replay.json"
	r, err := NewReplay(readFile(t, graphs))
	if err != nil {
		t.Fatal(err)
	}
	got, err := r.Forward(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want, err := forwardGraphs(ctx, loadReplay(t, graphs))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) == 0 || !reflect.DeepEqual(got, want) {
		t.Errorf("Replay.Forward read %+v, want %+v", got, want)
	}

	if _, err := r.ProxyTable(ctx, Table{Family: nfproto(false), Name: "filter"}); err == nil {
		t.Error("Replay.ProxyTable read ip filter, which no Follower follows")
	}
}
