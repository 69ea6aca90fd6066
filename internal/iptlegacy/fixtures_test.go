package iptlegacy

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// fixture is iptables-save text whose tables the kernel tests load with
// iptables-legacy-restore and compare with the text readers, and whose blobs (captured with
// -update) the unit tests decode without root.
type fixture struct {
	name   string // base name of its blobs in testdata
	blob   string // or another fixture's, when the two texts are the same
	path   string // the text, relative to this package
	text   string // or the text itself
	ipv6   bool
	tables []string
	// loops marks a hand-written table with jump loops, which the kernel refuses (ELOOP): it
	// is loaded with every jump into a LOOP- chain sent to an empty stand-in chain instead,
	// and the blob is then patched to jump where the text says (patchLoops).
	loops bool
}

var fixtures = []fixture{
	{name: "kube-proxy-v1.36.3", path: "../../collectors/rules/testdata/kube-proxy-v1.36.3/iptables-save-nat.txt", tables: []string{"nat"}},
	{name: "kube-proxy-nat", path: "../../collectors/rules/testdata/kube-proxy-nat.txt", tables: []string{"nat"}},
	{name: "kube-proxy", path: "../testsupport/iptables/testdata/kube-proxy.txt", tables: []string{"nat", "filter"}},
	{name: "filter-counters", path: "../testsupport/iptables/testdata/filter-counters.txt", tables: []string{"filter"}},
	{name: "filter-cycle", path: "../testsupport/iptables/testdata/filter-cycle.txt", tables: []string{"filter"}, loops: true},
	{name: "filter-cycle-drop", path: "../testsupport/iptables/testdata/filter-cycle-drop.txt", tables: []string{"filter"}, loops: true},
	{name: "filter-drop-behind-jump", path: "../testsupport/iptables/testdata/filter-drop-behind-jump.txt", tables: []string{"filter"}},
	{name: "filter-invalid-jump", path: "../testsupport/iptables/testdata/filter-invalid-jump.txt", tables: []string{"filter"}},
	{name: "filter-no-drop", path: "../testsupport/iptables/testdata/filter-no-drop.txt", tables: []string{"filter"}},
	{name: "filter-not-reachable", path: "../testsupport/iptables/testdata/filter-not-reachable.txt", tables: []string{"filter"}},
	{name: "node-legacy-drop", path: "../../collectors/node/testdata/iptables-legacy-save-drop.txt", tables: []string{"filter"}},
	{name: "node-legacy-empty", path: "../../collectors/node/testdata/iptables-legacy-save-empty.txt", tables: []string{"filter"}},
	// collectors/node's copies of kube-proxy.txt and filter-no-drop.txt (the same bytes today).
	{name: "node-nft-kube-proxy", blob: "kube-proxy", path: "../../collectors/node/testdata/iptables-nft-save-kube-proxy.txt", tables: []string{"nat", "filter"}},
	{name: "node-no-drop", blob: "filter-no-drop", path: "../../collectors/node/testdata/iptables-save-no-drop.txt", tables: []string{"filter"}},
	{name: "v6-kube-proxy", text: v6KubeProxy, ipv6: true, tables: []string{"nat", "filter"}},
	{name: "v4-odd", text: v4Odd, tables: []string{"nat", "filter"}},
}

func (f *fixture) source(t *testing.T) string {
	t.Helper()
	if f.text != "" {
		return f.text
	}
	b, err := os.ReadFile(f.path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func (f *fixture) blobPath(table string) string {
	name := f.name
	if f.blob != "" {
		name = f.blob
	}
	return filepath.Join("testdata", name+"."+table+".blob")
}

// nfacctNames are the nfacct counters the fixtures' rules name.
var nfacctNames = []string{"ct_state_invalid_dropped_pkts", "localhost_nps_accepted_pkts"}

var loopJump = regexp.MustCompile(`( -[jg] )(LOOP-[A-Z]+)\b`)

// loadable returns the text to restore: for a fixture with loops, every jump into a LOOP-
// chain goes to a STANDIN- chain of the same suffix instead, declared empty in each table.
func (f *fixture) loadable(text string) string {
	if !f.loops {
		return text
	}
	stand := map[string]bool{}
	for _, m := range loopJump.FindAllStringSubmatch(text, -1) {
		stand[m[2]] = true
	}
	text = loopJump.ReplaceAllString(text, "${1}STANDIN-$2")
	var decl strings.Builder
	for name := range stand {
		fmt.Fprintf(&decl, ":STANDIN-%s - [0:0]\n", name)
	}
	return strings.Replace(text, "*filter\n", "*filter\n"+decl.String(), 1)
}

// v6KubeProxy is kube-proxy's IPv6 shape by hand: UDP, TCP and SCTP service ports, a local
// chain, a service port without comment, a chain without endpoints, a declared chain without
// rules (left out), an endpoint chain reached by goto, a duplicate endpoint (listed once), a
// DNAT without a port (not an endpoint) and an IPv4-mapped destination (unmapped). Its filter
// table has kube-proxy's INVALID drop behind an interface match.
const v6KubeProxy = `*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-SVC-DNSUDPDNSUDPDNSU - [0:0]
:KUBE-SVC-DNSTCPDNSTCPDNST - [0:0]
:KUBE-SVC-SCTPSCTPSCTPSCTP - [0:0]
:KUBE-SVL-LOCALLOCALLOCALL - [0:0]
:KUBE-SVC-EMPTYEMPTYEMPTYE - [0:0]
:KUBE-SVC-UNUSEDUNUSEDUNUS - [0:0]
:KUBE-SEP-DNS1DNS1DNS1DNS1 - [0:0]
:KUBE-SEP-DNS2DNS2DNS2DNS2 - [0:0]
:KUBE-SEP-DNS3DNS3DNS3DNS3 - [0:0]
:KUBE-SEP-TCP1TCP1TCP1TCP1 - [0:0]
:KUBE-SEP-SCTPSCTPSCTPSCTP - [0:0]
:KUBE-SEP-NOPORTNOPORTNOPO - [0:0]
:KUBE-SEP-MAPPEDMAPPEDMAPP - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
-A KUBE-SERVICES -d fd00:10:96::a/128 -p udp -m comment --comment "kube-system/kube-dns:dns cluster IP" -m udp --dport 53 -j KUBE-SVC-DNSUDPDNSUDPDNSU
-A KUBE-SERVICES -d fd00:10:96::a/128 -p tcp -m comment --comment "kube-system/kube-dns:dns-tcp cluster IP" -m tcp --dport 53 -j KUBE-SVC-DNSTCPDNSTCPDNST
-A KUBE-SERVICES -d fd00:10:96::20/128 -p sctp -m comment --comment "lab/assoc cluster IP" -m sctp --dport 9999 -j KUBE-SVC-SCTPSCTPSCTPSCTP
-A KUBE-SERVICES -d fd00:10:96::30/128 -p tcp -m tcp --dport 8080 -j KUBE-SVL-LOCALLOCALLOCALL
-A KUBE-SERVICES -d fd00:10:96::40/128 -p tcp -m comment --comment "lab/empty:http cluster IP" -m tcp --dport 80 -j KUBE-SVC-EMPTYEMPTYEMPTYE
-A KUBE-SERVICES -d fd00:10:96::50/128 -p tcp -m comment --comment "lab/external:http external IP" -m tcp --dport 80 -j KUBE-MARK-MASQ
-A KUBE-SVC-DNSUDPDNSUDPDNSU ! -s fd00:10:244::/64 -d fd00:10:96::a/128 -p udp -m comment --comment "kube-system/kube-dns:dns cluster IP" -m udp --dport 53 -j KUBE-MARK-MASQ
-A KUBE-SVC-DNSUDPDNSUDPDNSU -m comment --comment "kube-system/kube-dns:dns -> [fd00:10:244::3]:53" -m statistic --mode random --probability 0.33333333349 -j KUBE-SEP-DNS1DNS1DNS1DNS1
-A KUBE-SVC-DNSUDPDNSUDPDNSU -m statistic --mode random --probability 0.50000000000 -g KUBE-SEP-DNS2DNS2DNS2DNS2
-A KUBE-SVC-DNSUDPDNSUDPDNSU -j KUBE-SEP-DNS3DNS3DNS3DNS3
-A KUBE-SVC-DNSTCPDNSTCPDNST -j KUBE-SEP-TCP1TCP1TCP1TCP1
-A KUBE-SVC-DNSTCPDNSTCPDNST -j KUBE-SEP-NOPORTNOPORTNOPO
-A KUBE-SVC-SCTPSCTPSCTPSCTP -j KUBE-SEP-SCTPSCTPSCTPSCTP
-A KUBE-SVL-LOCALLOCALLOCALL -j KUBE-SEP-MAPPEDMAPPEDMAPP
-A KUBE-SVC-EMPTYEMPTYEMPTYE ! -s fd00:10:244::/64 -d fd00:10:96::40/128 -p tcp -m tcp --dport 80 -j KUBE-MARK-MASQ
-A KUBE-SEP-DNS1DNS1DNS1DNS1 -s fd00:10:244::3/128 -j KUBE-MARK-MASQ
-A KUBE-SEP-DNS1DNS1DNS1DNS1 -p udp -m udp -j DNAT --to-destination [fd00:10:244::3]:53
-A KUBE-SEP-DNS2DNS2DNS2DNS2 -p udp -m udp -j DNAT --to-destination [fd00:10:244::4]:53
-A KUBE-SEP-DNS3DNS3DNS3DNS3 -p udp -m udp -j DNAT --to-destination [fd00:10:244::3]:53
-A KUBE-SEP-TCP1TCP1TCP1TCP1 -p tcp -m tcp -j DNAT --to-destination [fd00:10:244::3]:53
-A KUBE-SEP-NOPORTNOPORTNOPO -p tcp -m tcp -j DNAT --to-destination fd00:10:244::9
-A KUBE-SEP-SCTPSCTPSCTPSCTP -p sctp -m sctp -j DNAT --to-destination [fd00:10:244::7]:9999
-A KUBE-SEP-MAPPEDMAPPEDMAPP -p tcp -m tcp -j DNAT --to-destination [::ffff:10.1.2.3]:8080
COMMIT
*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-FORWARD - [0:0]
-A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
-A KUBE-FORWARD -i cni0 -m conntrack --ctstate INVALID -m nfacct --nfacct-name ct_state_invalid_dropped_pkts -j DROP
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
COMMIT
`

// v4Odd covers what kube-proxy does not write but a reader must get right: dispatch rules
// without address, with a negated address, a port range, a negated port or another protocol
// (all skipped, as KubeServices skips them), a rule that only counts, a prefix interface, a
// goto and a queue in the filter table, a ctstate list with INVALID among others behind a
// rule-less counter, and a drop behind a rate-limited log.
const v4Odd = `*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-SVC-AAAAAAAAAAAAAAAA - [0:0]
:KUBE-SEP-AAAAAAAAAAAAAAAA - [0:0]
:KUBE-SEP-BBBBBBBBBBBBBBBB - [0:0]
-A KUBE-SERVICES -p tcp -m tcp --dport 80 -j KUBE-SVC-AAAAAAAAAAAAAAAA
-A KUBE-SERVICES ! -d 10.96.0.5/32 -p tcp -m tcp --dport 80 -j KUBE-SVC-AAAAAAAAAAAAAAAA
-A KUBE-SERVICES -d 10.96.0.5/32 -p tcp -m tcp --dport 80:90 -j KUBE-SVC-AAAAAAAAAAAAAAAA
-A KUBE-SERVICES -d 10.96.0.5/32 -p tcp -m tcp ! --dport 80 -j KUBE-SVC-AAAAAAAAAAAAAAAA
-A KUBE-SERVICES -d 10.96.0.5/32 -p icmp -j KUBE-SVC-AAAAAAAAAAAAAAAA
-A KUBE-SERVICES -d 10.96.0.5/32 -p tcp -m comment --comment "ns/name:p cluster IP" -m tcp --dport 80 -j KUBE-SVC-AAAAAAAAAAAAAAAA
-A KUBE-SERVICES -d 10.96.0.6/32 -p udp -m comment --comment "not kube-proxy's" -m udp --dport 53 -g KUBE-SVC-AAAAAAAAAAAAAAAA
-A KUBE-SERVICES -d 10.96.0.7/32 -p tcp -m tcp --dport 81
-A KUBE-SVC-AAAAAAAAAAAAAAAA -d 10.96.0.5/32
-A KUBE-SVC-AAAAAAAAAAAAAAAA -j KUBE-SEP-BBBBBBBBBBBBBBBB
-A KUBE-SVC-AAAAAAAAAAAAAAAA -j KUBE-SEP-AAAAAAAAAAAAAAAA
-A KUBE-SEP-AAAAAAAAAAAAAAAA -p tcp -m tcp -j DNAT --to-destination 10.244.0.9-10.244.0.10:8080
-A KUBE-SEP-AAAAAAAAAAAAAAAA -p tcp -m tcp -j DNAT --to-destination 10.244.0.8:8080
-A KUBE-SEP-AAAAAAAAAAAAAAAA -p tcp -m tcp -j DNAT --to-destination 10.244.0.7:8080
-A KUBE-SEP-BBBBBBBBBBBBBBBB -p tcp -m tcp -j DNAT --to-destination 10.244.0.1:8000-8001
COMMIT
*filter
:INPUT ACCEPT [0:0]
:FORWARD DROP [0:0]
:OUTPUT ACCEPT [0:0]
:PODS - [0:0]
:GUARD - [0:0]
-A FORWARD -i veth+ -g PODS
-A FORWARD -p tcp -j NFQUEUE --queue-num 3
-A FORWARD -j QUEUE
-A FORWARD
-A FORWARD -m limit --limit 1/s -j LOG --log-prefix "fwd: "
-A FORWARD -j GUARD
-A GUARD -s 192.168.0.0/255.255.0.255 -j RETURN
-A GUARD -m conntrack --ctstate NEW,INVALID,UNTRACKED -m limit --limit 5/min -j DROP
-A PODS -m state --state INVALID -j DROP
COMMIT
`
