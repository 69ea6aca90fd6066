package hostrules

import (
	"context"
	"errors"
	"net"

	"github.com/proxyhealth/proxyhealth/internal/ruleset"
)

// systemBackends reads this network namespace's tables.
type systemBackends struct {
	procPath string
}

func newSystemBackends(procPath string) *systemBackends { return &systemBackends{procPath: procPath} }

// ipvs: kube-proxy's IPVS mode binds service addresses to a dummy interface named kube-ipvs0
// (pkg/proxy/ipvs: defaultDummyDevice).
func (b *systemBackends) ipvs() bool {
	_, err := net.InterfaceByName("kube-ipvs0")
	return err == nil
}

var errNotYet = errors.New("not implemented yet")

func (b *systemBackends) legacy() (map[bool]*ruleset.ProxyTable, *ruleset.Graph, error, error) {
	return nil, nil, errNotYet, errNotYet
}

func (b *systemBackends) legacyFingerprint() (string, error) { return "", errNotYet }

func (b *systemBackends) nft() (nftRead, error) { return nftRead{}, errNotYet }

func (b *systemBackends) watchNFT(ctx context.Context) (<-chan nftChange, error) {
	return nil, errNotYet
}
