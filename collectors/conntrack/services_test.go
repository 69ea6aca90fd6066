package conntrack

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/common/promslog"
)

const kubeServicesListing = `-N KUBE-SERVICES
-A KUBE-SERVICES -d 10.96.0.10/32 -p udp -m comment --comment "kube-system/kube-dns:dns cluster IP" -m udp --dport 53 -j KUBE-SVC-TCOU7JCQXEZGVUNU
-A KUBE-SERVICES -d 10.96.0.10/32 -p tcp -m comment --comment "kube-system/kube-dns:dns-tcp cluster IP" -m tcp --dport 53 -j KUBE-SVC-ERIFXISQEP7F7OF4
-A KUBE-SERVICES -d 10.96.0.1/32 -p tcp -m tcp --dport 443 -j KUBE-SVC-NPX46M4PTMTKRN6Y
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
`

func writeProcNames(t *testing.T, names string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "net"), 0o755); err != nil {
		t.Fatal(err)
	}
	if names != "" {
		if err := os.WriteFile(filepath.Join(dir, "net", "ip_tables_names"), []byte(names), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestKubeProxyServicesLoad(t *testing.T) {
	for _, tc := range []struct {
		name        string
		legacyNames string // contents of ip_tables_names; "" means absent
		wantLegacy  bool
	}{
		{"no legacy tables", "", false},
		{"legacy filter only", "filter\n", false},
		{"legacy nat", "filter\nnat\n", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ran []string
			k := newKubeProxyServices(writeProcNames(t, tc.legacyNames), promslog.NewNopLogger())
			k.lookPath = func(bin string) (string, error) {
				if strings.HasPrefix(bin, "ip6") {
					return "", errors.New("not found")
				}
				return "/usr/sbin/" + bin, nil
			}
			k.run = func(_ context.Context, name string, args ...string) ([]byte, error) {
				ran = append(ran, filepath.Base(name))
				if strings.HasSuffix(name, "-legacy") {
					return []byte("-N KUBE-SERVICES\n"), nil
				}
				return []byte(kubeServicesListing), nil
			}
			m := k.load(context.Background())
			if m.Len() != 3 {
				t.Errorf("Len() = %d, want 3", m.Len())
			}
			svc, ok := m.Lookup(netip.MustParseAddr("10.96.0.10"), 53, 17)
			if want := (Service{"kube-system", "kube-dns", 53}); !ok || svc != want {
				t.Errorf("Lookup(dns udp) = %+v, %v; want %+v", svc, ok, want)
			}
			// Without a comment (kube-proxy drops them above 1,000 endpoints) the port is known,
			// the name is not.
			if svc, ok := m.Lookup(netip.MustParseAddr("10.96.0.1"), 443, 6); !ok || svc.Port != 443 || svc.Name != "" {
				t.Errorf("Lookup(uncommented) = %+v, %v", svc, ok)
			}
			ranLegacy := strings.Contains(strings.Join(ran, " "), "legacy")
			if ranLegacy != tc.wantLegacy {
				t.Errorf("ran %v: iptables-legacy asked = %v, want %v (asking creates the table)", ran, ranLegacy, tc.wantLegacy)
			}
		})
	}
}

func TestKubeProxyServicesNoChain(t *testing.T) {
	k := newKubeProxyServices(writeProcNames(t, ""), promslog.NewNopLogger())
	k.run = func(_ context.Context, name string, args ...string) ([]byte, error) {
		return nil, errors.New("exit status 1: iptables v1.8.9 (nf_tables): chain `KUBE-SERVICES' in table `nat' is incompatible, use 'nft' tool.")
	}
	if m := k.load(context.Background()); m.Len() != 0 {
		t.Errorf("Len() = %d with no chain, want 0", m.Len())
	}
	if !strings.Contains(k.lastNote, "no KUBE-SERVICES chain") {
		t.Errorf("note %q does not say the chain is missing", k.lastNote)
	}
	k.run = func(_ context.Context, name string, args ...string) ([]byte, error) {
		return nil, errors.New("exit status 4: iptables v1.8.9 (nf_tables): Could not fetch rule set generation id: Permission denied (you must be root)")
	}
	k.load(context.Background())
	if !strings.Contains(k.lastNote, "Permission denied") {
		t.Errorf("note %q does not pass on the permission problem", k.lastNote)
	}
}
