package hostrules

import (
	"testing"

	"golang.org/x/sys/unix"

	"github.com/proxyhealth/proxyhealth/internal/nftnl"
)

// A commit in kube-proxy's nftables table affects the forward path unless it touches only
// service port and endpoint chains; its fixed service-endpoints-check chain, which
// filter-forward jumps to, is no service port chain for all its prefix.
func TestAffectsForward(t *testing.T) {
	kp := nftnl.Table{Family: unix.NFPROTO_IPV4, Name: "kube-proxy"}
	nat := nftnl.Table{Family: unix.NFPROTO_IPV4, Name: "nat"}
	filter := nftnl.Table{Family: unix.NFPROTO_IPV4, Name: "filter"}
	touching := func(t nftnl.Table, chains ...string) *nftnl.Change {
		return &nftnl.Change{Tables: []nftnl.Table{t}, Details: []nftnl.TableChange{{Table: t, Chains: chains}}}
	}
	for _, tc := range []struct {
		name   string
		change *nftnl.Change
		want   bool
	}{
		{"service and endpoint chains", touching(kp, "service-ULMVA6XW-ns/web/tcp/http", "local-ULMVA6XW-ns/web/tcp/http", "endpoint-4M7KHNGR-ns/web/tcp/http__10.244.1.3/8080"), false},
		{"service-endpoints-check", touching(kp, "service-endpoints-check"), true},
		{"filter-forward", touching(kp, "filter-forward"), true},
		{"iptables-nft nat", touching(nat, "KUBE-SVC-ABCDEFGHIJKLMNOP"), false},
		{"another table", touching(filter, "FORWARD"), true},
		{"resync", &nftnl.Change{Resync: true}, true},
	} {
		if got := affectsForward(tc.change); got != tc.want {
			t.Errorf("%s: affects the forward path %v, want %v", tc.name, got, tc.want)
		}
	}
}
