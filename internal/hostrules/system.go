package hostrules

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/proxyhealth/proxyhealth/internal/iptlegacy"
	"github.com/proxyhealth/proxyhealth/internal/ipvs"
	"github.com/proxyhealth/proxyhealth/internal/kubeproxynames"
	"github.com/proxyhealth/proxyhealth/internal/nftnl"
	"github.com/proxyhealth/proxyhealth/internal/ruleset"
)

// systemBackends reads this network namespace's tables: the legacy ones through
// internal/iptlegacy, nf_tables through internal/nftnl.
type systemBackends struct {
	procPath string
	// The read limits every reader is given.
	nftLimits    nftnl.Limits
	legacyLimits iptlegacy.Limits

	// newFollower opens the follower (nftnl.NewFollower with nftLimits; tests give theirs).
	newFollower func() (nftFollower, error)
	// follower keeps kube-proxy's nf_tables tables, re-reading what each change names.
	follower nftFollower
	// nf_tables' generation at the last read, and that read: without a watch, a poll whose
	// generation has not moved reuses it (one round trip instead of a read); with one, a
	// change that cannot have touched the forward path reuses its graphs.
	lastGen  uint32
	lastRead *nftRead
	// forward keeps the forward path's graphs, re-reading the tables each change touched;
	// forwardReads counts its reads.
	forward      forwardReader
	forwardReads int
}

// nftFollower is what systemBackends asks of nftnl.Follower.
type nftFollower interface {
	Generation(ctx context.Context) (uint32, error)
	Resync(ctx context.Context) error
	Apply(ctx context.Context, changes ...nftnl.Change) error
	IPTablesNAT(ipv6 bool) (*ruleset.ProxyTable, error)
	KubeProxyNFT(ipv6 bool) (*ruleset.ProxyTable, error)
}

// forwardReader is what systemBackends asks of nftnl.ForwardReader.
type forwardReader interface {
	Read(ctx context.Context, changes []nftnl.Change) ([]*ruleset.Graph, error)
}

// newSystemBackends reads through cfg.ProcPath with cfg's read limits.
func newSystemBackends(cfg Config) *systemBackends {
	b := &systemBackends{
		procPath:     cfg.ProcPath,
		nftLimits:    nftnl.Limits{MaxDumpBytes: cfg.MaxDumpBytes},
		legacyLimits: iptlegacy.Limits{MaxTableBytes: cfg.LegacyMaxTableBytes},
	}
	b.newFollower = func() (nftFollower, error) {
		f, err := nftnl.NewFollower(b.nftLimits)
		if err != nil {
			return nil, err
		}
		return f, nil
	}
	b.forward = &nftnl.ForwardReader{Limits: b.nftLimits}
	return b
}

// inUse is err, or nil when it says the kernel has no nf_tables: its backends are then not in
// use on this node, which is no error (State.Forward), and there is nothing of them to read.
func inUse(err error) error {
	if errors.Is(err, nftnl.ErrNotSupported) {
		return nil
	}
	return err
}

// kubeIPVSInterface is the dummy interface kube-proxy's IPVS mode binds service addresses to
// (pkg/proxy/ipvs: defaultDummyDevice).
const kubeIPVSInterface = "kube-ipvs0"

func (b *systemBackends) ipvsInUse() bool {
	_, err := net.InterfaceByName(kubeIPVSInterface)
	return err == nil
}

// ipvs reads the virtual servers (internal/ipvs, which fails clearly without ip_vs or
// CAP_NET_ADMIN) and the addresses bound to kube-ipvs0, which tell node ports' virtual servers
// from the others.
func (b *systemBackends) ipvs(prev *ipvs.Table) (*ipvs.Table, error) {
	servers, err := ipvs.Read(b.procPath)
	if err != nil {
		return nil, err
	}
	at := time.Now()
	iface, err := net.InterfaceByName(kubeIPVSInterface)
	if err != nil {
		return nil, fmt.Errorf("read the addresses of %s: %w", kubeIPVSInterface, err)
	}
	addrs, err := iface.Addrs()
	if err != nil {
		return nil, fmt.Errorf("read the addresses of %s: %w", kubeIPVSInterface, err)
	}
	bound := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok {
				bound = append(bound, ip.Unmap())
			}
		}
	}
	return ipvs.NewTable(prev, servers, bound, at), nil
}

func (b *systemBackends) legacy() (map[bool]*ruleset.ProxyTable, *ruleset.Graph, error, error) {
	proxy := map[bool]*ruleset.ProxyTable{}
	var proxyErrs []error
	for _, ipv6 := range []bool{false, true} {
		t, err := iptlegacy.ReadNAT(b.procPath, ipv6, b.legacyLimits)
		if err != nil {
			proxyErrs = append(proxyErrs, err)
			continue
		}
		if t != nil {
			proxy[ipv6] = t
		}
	}
	// kube-proxy's INVALID drop is in the IPv4 filter table; IPv6 forwarding has its own
	// (ip6tables) and is not asked about, as before.
	filter, filterErr := iptlegacy.ReadFilter(b.procPath, false, b.legacyLimits)
	return proxy, filter, errors.Join(proxyErrs...), filterErr
}

// legacyFingerprint is every legacy table's size summary (iptlegacy.Info): a table created,
// removed, grown or shrunk changes it.
func (b *systemBackends) legacyFingerprint() (string, error) {
	var sb strings.Builder
	var errs []error
	for _, ipv6 := range []bool{false, true} {
		for _, table := range []string{"nat", "filter"} {
			info, err := iptlegacy.ReadInfo(b.procPath, ipv6, table)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			fmt.Fprintf(&sb, "%v;", info)
		}
	}
	return sb.String(), errors.Join(errs...)
}

func (b *systemBackends) nft(changes []nftChange) (nftRead, error) {
	ctx := context.Background()
	if b.follower == nil {
		f, err := b.newFollower()
		if err != nil {
			return nftRead{}, inUse(err)
		}
		b.follower, changes = f, nil
	}
	// The generation matters to polls only: with a watch, the changes say what to read again.
	// Without nf_tables there is none to move: polls reuse the read that found nothing.
	var gen uint32
	var genErr error
	if changes == nil {
		gen, genErr = b.follower.Generation(ctx)
		genErr = inUse(genErr)
	}
	forward := true
	if changes == nil {
		// No watch to say what changed: everything, unless nothing did.
		if genErr == nil && b.lastRead != nil && gen == b.lastGen {
			return *b.lastRead, nil
		}
		_ = b.follower.Resync(ctx) // the errors are the tables', below
	}
	var cs []nftnl.Change // nil: everything is read again
	if changes != nil {
		cs = make([]nftnl.Change, len(changes))
		forward = false
		for i, c := range changes {
			cs[i] = c.change
			forward = forward || c.resync || affectsForward(&c.change)
		}
		_ = b.follower.Apply(ctx, cs...)
	}
	var r nftRead
	var errs []error
	r.iptablesNAT, r.kubeProxy = map[bool]*ruleset.ProxyTable{}, map[bool]*ruleset.ProxyTable{}
	for _, ipv6 := range []bool{false, true} {
		t, err := b.follower.IPTablesNAT(ipv6)
		if err := inUse(err); err != nil {
			errs = append(errs, err)
		} else if t != nil {
			r.iptablesNAT[ipv6] = t
		}
		t, err = b.follower.KubeProxyNFT(ipv6)
		if err := inUse(err); err != nil {
			errs = append(errs, err)
		} else if t != nil {
			r.kubeProxy[ipv6] = t
		}
	}
	r.proxyErr = errors.Join(errs...)
	if !forward && b.lastRead != nil && b.lastRead.iptablesErr == nil && b.lastRead.nativeFwdErr == nil {
		r.iptablesFwd, r.nativeFwd = b.lastRead.iptablesFwd, b.lastRead.nativeFwd
	} else {
		b.forwardReads++
		graphs, err := b.forward.Read(ctx, cs)
		if err := inUse(err); err != nil {
			r.iptablesErr, r.nativeFwdErr = err, err
		}
		for _, g := range graphs {
			if strings.Contains(g.Name, "tables-nft ") { // "iptables-nft filter", "ip6tables-nft filter"
				if !strings.HasPrefix(g.Name, "ip6") {
					r.iptablesFwd = g
				}
				continue
			}
			r.nativeFwd = append(r.nativeFwd, g)
		}
	}
	b.lastRead = &r
	b.lastGen = gen
	if genErr != nil || r.proxyErr != nil || r.iptablesErr != nil {
		// Not reused by a poll: read again next time.
		b.lastGen = 0
		if changes == nil {
			b.lastRead = nil
		}
	}
	return r, nil
}

// affectsForward reports whether a change may have changed the forward path the ForwardReader
// reads: any table but kube-proxy's nat and nftables-mode tables, and in the latter any chain
// but its service and endpoint chains (its filter-forward chain and those it jumps to).
func affectsForward(c *nftnl.Change) bool {
	if c.Resync {
		return true
	}
	for _, t := range c.Tables {
		if !nftnl.Followed(t) {
			return true
		}
		if t.Name == "nat" {
			continue
		}
		d := c.Touched(t)
		if d == nil || d.TableEvent || d.Overflow {
			return true
		}
		for _, ch := range d.Chains {
			// By the service port chains' own predicate, not their prefixes: kube-proxy's fixed
			// service-endpoints-check chain shares the "service-" prefix, and filter-forward
			// jumps to it.
			if !kubeproxynames.IsNFTServiceChain(ch) && !kubeproxynames.IsNFTEndpointChain(ch) {
				return true
			}
		}
	}
	return false
}

func (b *systemBackends) watchNFT(ctx context.Context) (<-chan nftChange, error) {
	w, err := nftnl.Watch(ctx, nil, nftnl.FollowNATRules(), nftnl.FollowNFTMaps())
	if err != nil {
		return nil, err
	}
	out := make(chan nftChange)
	go func() {
		defer close(out)
		for ch := range w.C {
			select {
			case out <- nftChange{resync: ch.Resync, change: ch}:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}
